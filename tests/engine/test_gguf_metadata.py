"""Our GGUF header reader (``loading/gguf_metadata.py``) against ``gguf.GGUFReader``.

Every metadata value (type and Python value) and every tensor info (name, type, shape, sizes,
offset, and the memory-mapped data's dtype, shape and bytes) must be identical, on SmolLM2's
GGUF, on the tiny GGUFs the tests write, and on a file with every value type, a custom
alignment and either byte order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType
from helpers.kquant_blocks import write_typed_gguf
from helpers.tiny_gguf import TINY_VOCAB_SIZE, write_gguf_from_hf
from helpers.tiny_models import build_tiny_model

from kvrelay_worker.loading.gguf_file import GGUFCheckpoint
from kvrelay_worker.loading.gguf_metadata import GGUFFile


def reader_value(field: Any) -> Any:
    """A GGUFReader field as a Python value (scalars and flat arrays)."""

    def scalar(part: np.ndarray, kind: GGUFValueType) -> Any:
        if kind == GGUFValueType.STRING:
            return bytes(part).decode("utf-8")
        value = part[0]
        if kind == GGUFValueType.BOOL:
            return bool(value)
        if kind in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
            return float(value)
        return int(value)

    types = list(field.types)
    if types[0] == GGUFValueType.ARRAY:
        return [scalar(field.parts[i], types[-1]) for i in field.data]
    return scalar(field.parts[field.data[0]], types[0])


def assert_same_as_gguf_reader(path: Path) -> GGUFFile:
    ours = GGUFFile(path)
    theirs = gguf.GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        entry = ours.fields[key]
        expected = reader_value(field)
        assert entry.type == field.types[0], key
        if entry.type == GGUFValueType.ARRAY:
            assert entry.item_type == field.types[-1], key
            assert [type(v) for v in entry.value] == [type(v) for v in expected], key
        else:
            assert type(entry.value) is type(expected), key
        assert entry.value == expected, key
    assert ours.alignment == theirs.alignment
    assert ours.data_offset == theirs.data_offset
    assert len(ours.tensors) == len(theirs.tensors)
    for mine, ref in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.name == ref.name
        assert mine.tensor_type == ref.tensor_type, mine.name
        assert mine.shape.dtype == ref.shape.dtype.newbyteorder("=")  # ours: native order
        assert mine.shape.tolist() == ref.shape.tolist(), mine.name
        assert (mine.n_elements, mine.n_bytes, mine.data_offset) == (
            ref.n_elements, ref.n_bytes, ref.data_offset), mine.name
        assert (mine.data.dtype, mine.data.shape) == (ref.data.dtype, ref.data.shape), mine.name
        assert mine.data.tobytes() == ref.data.tobytes(), mine.name
    return ours


def test_smollm2_gguf_reads_like_gguf_reader(smollm2_gguf: Path) -> None:
    ours = assert_same_as_gguf_reader(smollm2_gguf)
    assert len(ours.value("tokenizer.ggml.tokens")) == 49152


@pytest.mark.parametrize(
    ("name", "qtype"),
    [
        ("llama-mha-untied", gguf.GGMLQuantizationType.F32),
        ("llama-mqa", gguf.GGMLQuantizationType.Q8_0),
        ("llama3-rope", gguf.GGMLQuantizationType.F16),
        ("qwen2-gqa-bias-tied", gguf.GGMLQuantizationType.Q4_0),
        ("qwen3-qk-norm", gguf.GGMLQuantizationType.Q5_1),
    ],
)
def test_tiny_ggufs_read_like_gguf_reader(
    name: str, qtype: gguf.GGMLQuantizationType, tmp_path: Path
) -> None:
    folder = build_tiny_model(name, tmp_path / name, vocab_size=TINY_VOCAB_SIZE)
    assert_same_as_gguf_reader(write_gguf_from_hf(folder, tmp_path / "tiny.gguf", qtype))


def test_k_quant_gguf_reads_like_gguf_reader(tmp_path: Path) -> None:
    kinds = [gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K,
             gguf.GGMLQuantizationType.Q5_K, gguf.GGMLQuantizationType.Q4_1]
    ours = assert_same_as_gguf_reader(
        write_typed_gguf(tmp_path, lambda name: kinds[len(name) % len(kinds)]))
    assert {t.tensor_type for t in ours.tensors} > set(kinds[:2])


EVERY_TYPE: dict[str, tuple[Callable[[gguf.GGUFWriter, str], None], Any]] = {
    "t.u8": (lambda w, k: w.add_uint8(k, 200), 200),
    "t.i8": (lambda w, k: w.add_int8(k, -100), -100),
    "t.u16": (lambda w, k: w.add_uint16(k, 60000), 60000),
    "t.i16": (lambda w, k: w.add_int16(k, -30000), -30000),
    "t.u32": (lambda w, k: w.add_uint32(k, 4_000_000_000), 4_000_000_000),
    "t.i32": (lambda w, k: w.add_int32(k, -2_000_000_000), -2_000_000_000),
    "t.f32": (lambda w, k: w.add_float32(k, 1e-5), float(np.float32(1e-5))),
    "t.bool": (lambda w, k: w.add_bool(k, True), True),
    "t.str": (lambda w, k: w.add_string(k, "héllo ✓ 日本"), "héllo ✓ 日本"),
    "t.u64": (lambda w, k: w.add_uint64(k, 2**63 + 5), 2**63 + 5),
    "t.i64": (lambda w, k: w.add_int64(k, -(2**62)), -(2**62)),
    "t.f64": (lambda w, k: w.add_float64(k, 0.1), 0.1),
    "t.ints": (lambda w, k: w.add_array(k, [1, -2, 3]), [1, -2, 3]),
    "t.floats": (lambda w, k: w.add_array(k, [0.5, -1.25]), [0.5, -1.25]),
    "t.bools": (lambda w, k: w.add_array(k, [True, False]), [True, False]),
    "t.strs": (lambda w, k: w.add_array(k, ["a", "", "ü ✓", "<|im_end|>"]),
               ["a", "", "ü ✓", "<|im_end|>"]),
}


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_every_value_type_alignment_and_byte_order(
    endian: gguf.GGUFEndian, tmp_path: Path
) -> None:
    path = tmp_path / "types.gguf"
    writer = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    writer.add_custom_alignment(64)
    for key, (add, _) in EVERY_TYPE.items():
        add(writer, key)
    writer.add_tensor("a.weight", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.add_tensor("b.weight", np.arange(5, dtype=np.float16))
    writer.add_tensor("c.weight", np.arange(4, dtype=np.int32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    ours = assert_same_as_gguf_reader(path)
    assert ours.alignment == 64
    assert ours.data_offset % 64 == 0
    assert ours.byte_order == (">" if endian == gguf.GGUFEndian.BIG else "<")
    for key, (_, expected) in EVERY_TYPE.items():
        assert ours.value(key) == expected, key
    a = ours.tensors[0]
    assert a.shape.tolist() == [3, 2]
    assert a.data.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert ours.tensors[2].data.tolist() == [0, 1, 2, 3]


def test_nested_arrays(tmp_path: Path) -> None:
    path = tmp_path / "nested.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("t.nested", [[1, 2], [3]])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    entry = GGUFFile(path).fields["t.nested"]
    assert entry.item_type == GGUFValueType.ARRAY
    assert entry.value == [[1, 2], [3]]


@pytest.mark.parametrize("cut", [3, 10, 30, 200])
def test_truncated_files_are_refused(smollm2_gguf: Path, tmp_path: Path, cut: int) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(smollm2_gguf.read_bytes()[:cut])
    with pytest.raises(ValueError):
        GGUFFile(path)


def test_a_large_header_is_read_past_the_first_chunk(
    smollm2_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvrelay_worker.loading import gguf_metadata

    monkeypatch.setattr(gguf_metadata, "_FIRST_READ", 4096)
    small = GGUFFile(smollm2_gguf)
    monkeypatch.undo()
    assert small.value("tokenizer.ggml.merges") == GGUFFile(smollm2_gguf).value(
        "tokenizer.ggml.merges")


def test_checkpoint_uses_our_reader(smollm2_gguf: Path) -> None:
    checkpoint = GGUFCheckpoint(smollm2_gguf)
    assert isinstance(checkpoint.reader, GGUFFile)
    assert checkpoint.metadata("general.architecture") == "llama"
