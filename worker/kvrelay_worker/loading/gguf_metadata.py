"""A fast reader for a GGUF file's header: metadata key/values and tensor infos.

Why our own: ``gguf.GGUFReader`` builds a numpy memmap view per array element, so a 49k-token
vocabulary plus 48k merges cost millions of ``memmap.__getitem__`` calls (seconds per file,
paid on every worker start). Here the header is read once as bytes and walked with
``struct.unpack_from`` (strings decoded in a tight loop, numeric arrays as one ``numpy`` view
each), which takes tens of milliseconds. Tensor data is read on demand (not memory-mapped:
mapped pages stay resident while the file is open), exposed with the same attributes and array shapes as ``gguf.ReaderTensor`` (``name``, ``tensor_type``, ``shape`` in
GGUF order, ``n_elements``, ``n_bytes``, ``data_offset``, ``data``), so ``gguf.quants`` works on
it unchanged.

Format (llama.cpp's ``docs/gguf.md``, versions 2 and 3): magic ``GGUF``, uint32 version, uint64
tensor and key/value counts, the key/values (uint64-length UTF-8 key, uint32 value type, value;
an array is uint32 item type, uint64 count, items), the tensor infos (name, uint32 dims, uint64
dims fastest first, uint32 ggml type, uint64 offset relative to the data section), then padding
to ``general.alignment`` (default 32) and the data. A file written big-endian is detected the way
``GGUFReader`` does it (the version's low 16 bits are zero).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
ByteOrder = Literal["<", ">"]
_FIRST_READ = 8 << 20  # bytes; grown fourfold while the header runs past them

# struct code of each fixed-size value type
_SCALAR_CODES = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}
_FLOAT_TYPES = (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64)
# numpy item type of the tensor types GGUFReader exposes as typed arrays (others: raw bytes)
_TYPED_TENSORS = {
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class GGUFField:
    """One metadata entry: its type (``item_type`` for arrays) and its decoded value.

    Values are Python objects: int, float, bool, str, or a list of them (nested for arrays of
    arrays).
    """

    name: str
    type: GGUFValueType
    value: Any
    item_type: GGUFValueType | None = None


@dataclass(eq=False)
class GGUFTensorInfo:
    """A tensor's header and its data, read on demand (shaped as ``gguf.ReaderTensor.data``)."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray  # GGUF order (fastest dimension first), uint64 like GGUFReader's
    n_elements: int
    n_bytes: int
    data_offset: int  # absolute, in bytes from the start of the file
    _file: GGUFFile = field(repr=False)

    @property
    def data(self) -> np.ndarray:
        """The tensor's data, read now into a fresh writable array (each access reads again).

        Read, not memory-mapped: pages copied out of a mapping stay resident in this
        process until it is unmapped, so a load held the whole file on top of the weights.
        """
        return self._read(None, None)

    def first_row(self) -> np.ndarray:
        """The first row only (a whole 1-D tensor): enough to try a type's dequantisation."""
        return self._read(0, 1) if len(self.shape) > 1 else self._read(None, None)

    def slab(self, index: int) -> np.ndarray:
        """``data[index]`` read alone: one expert of a stacked expert tensor."""
        return self._read(index, 1)[0]

    def _read(self, first: int | None, count: int | None) -> np.ndarray:
        """Entries ``first .. first + count`` of the outermost dimension (all: None)."""
        dims = tuple(int(d) for d in reversed(self.shape.tolist()))
        item = _TYPED_TENSORS.get(self.tensor_type)
        if item is None:
            item = np.uint8
            block_size, type_size = GGML_QUANT_SIZES[self.tensor_type]
            dims = (*dims[:-1], dims[-1] // block_size * type_size)
        dtype = np.dtype(item).newbyteorder(self._file.byte_order)
        offset = self.data_offset
        if first is not None and count is not None:
            if not 0 <= first < dims[0]:
                raise IndexError(f"{self.name}: index {first} out of {dims[0]}")
            offset += first * math.prod(dims[1:]) * dtype.itemsize
            dims = (min(count, dims[0] - first), *dims[1:])
        array = np.empty(dims, dtype=dtype)
        buffer = array.reshape(-1).view(np.uint8).data
        with open(self._file.path, "rb") as f:
            f.seek(offset)
            done = 0
            while done < len(buffer):
                got = f.readinto(buffer[done:])
                if not got:
                    raise ValueError(f"{self._file.path}: tensor {self.name} runs past the "
                                     "end of the file")
                done += got
        return array


class GGUFFile:
    """The parsed header of a GGUF file; each tensor's data read when asked for.

    ``fields`` also holds ``GGUF.version``, ``GGUF.tensor_count`` and ``GGUF.kv_count`` as
    ``GGUFReader`` does. Raises ``ValueError`` for a file that is not a well-formed GGUF.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        size = self.path.stat().st_size
        want = _FIRST_READ
        while True:
            with open(self.path, "rb") as f:
                head = f.read(want)
            try:
                self._parse(head)
                return
            except _Truncated as exc:
                if len(head) >= size:
                    raise ValueError(f"truncated or corrupt GGUF header: {exc}") from exc
                want *= 4
            except UnicodeDecodeError as exc:
                raise ValueError(f"corrupt GGUF header: {exc}") from exc

    def value(self, key: str, default: Any = None) -> Any:
        """A metadata value (``default`` when absent)."""
        entry = self.fields.get(key)
        return default if entry is None else entry.value

    def _parse(self, buf: bytes) -> None:
        if buf[:4] != GGUF_MAGIC:
            raise ValueError("GGUF magic invalid")
        walker = _Walker(buf, "<", 4)
        version = walker.scalar("I")
        order: ByteOrder = "<"
        if version & 0xFFFF == 0:  # written for the other byte order
            order = ">"
            walker = _Walker(buf, ">", 4)
            version = walker.scalar("I")
        if version not in SUPPORTED_VERSIONS:
            raise ValueError(f"GGUF version {version} is not supported")
        self.version = version
        self.byte_order = order
        tensor_count = walker.scalar("Q")
        kv_count = walker.scalar("Q")
        self.fields: dict[str, GGUFField] = {
            "GGUF.version": GGUFField("GGUF.version", GGUFValueType.UINT32, version),
            "GGUF.tensor_count": GGUFField("GGUF.tensor_count", GGUFValueType.UINT64, tensor_count),
            "GGUF.kv_count": GGUFField("GGUF.kv_count", GGUFValueType.UINT64, kv_count),
        }
        for _ in range(kv_count):
            key = walker.string()
            kind = GGUFValueType(walker.scalar("I"))
            if kind == GGUFValueType.ARRAY:
                item_type, value = walker.array()
                self.fields[key] = GGUFField(key, kind, value, item_type)
            else:
                self.fields[key] = GGUFField(key, kind, walker.value(kind))
        infos = []
        for _ in range(tensor_count):
            name = walker.string()
            n_dims = walker.scalar("I")
            dims = np.array([walker.scalar("Q") for _ in range(n_dims)], np.uint64)
            ggml_type = GGMLQuantizationType(walker.scalar("I"))
            offset = walker.scalar("Q")
            infos.append((name, dims, ggml_type, offset))
        alignment = self.fields.get("general.alignment")
        self.alignment = DEFAULT_ALIGNMENT
        if alignment is not None:
            if alignment.type != GGUFValueType.UINT32:
                raise ValueError("Bad type for general.alignment field")
            self.alignment = int(alignment.value)
            if self.alignment == 0 or self.alignment & (self.alignment - 1):
                raise ValueError("Invalid alignment: must be a non-zero power of two")
        self.data_offset = -(-walker.pos // self.alignment) * self.alignment
        self.tensors: list[GGUFTensorInfo] = []
        seen: set[str] = set()
        for name, dims, ggml_type, offset in infos:
            if name in seen:
                raise ValueError(f"Found duplicated tensor with name {name}")
            seen.add(name)
            n_elements = math.prod(int(d) for d in dims)
            block_size, type_size = GGML_QUANT_SIZES[ggml_type]
            self.tensors.append(GGUFTensorInfo(
                name, ggml_type, dims, n_elements, n_elements * type_size // block_size,
                self.data_offset + int(offset), self,
            ))


class _Truncated(Exception):
    """The header runs past the bytes read so far."""


class _Walker:
    """A cursor over the header bytes (raises ``_Truncated`` past their end)."""

    def __init__(self, buf: bytes, order: ByteOrder, pos: int) -> None:
        self.buf = buf
        self.order = order
        self.pos = pos
        self._u64 = struct.Struct(order + "Q")

    def scalar(self, code: str) -> Any:
        try:
            (value,) = struct.unpack_from(self.order + code, self.buf, self.pos)
        except struct.error as exc:
            raise _Truncated(str(exc)) from exc
        self.pos += struct.calcsize(code)
        return value

    def string(self) -> str:
        length = self.scalar("Q")
        start = self.pos
        self.pos = start + length
        if self.pos > len(self.buf):
            raise _Truncated("a string runs past the end")
        return self.buf[start : self.pos].decode("utf-8")

    def value(self, kind: GGUFValueType) -> Any:
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            return self.array()[1]
        value = self.scalar(_SCALAR_CODES[kind])
        if kind == GGUFValueType.FLOAT32:  # exactly the float32's value, like GGUFReader
            return float(value)
        return value

    def array(self) -> tuple[GGUFValueType, list[Any]]:
        item_type = GGUFValueType(self.scalar("I"))
        count = self.scalar("Q")
        if item_type == GGUFValueType.STRING:
            return item_type, self._strings(count)
        if item_type == GGUFValueType.ARRAY:
            return item_type, [self.array()[1] for _ in range(count)]
        code = _SCALAR_CODES[item_type]
        dtype = np.dtype(code).newbyteorder(self.order)
        end = self.pos + count * dtype.itemsize
        if end > len(self.buf):
            raise _Truncated("an array runs past the end")
        values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).tolist()
        self.pos = end
        return item_type, values

    def _strings(self, count: int) -> list[str]:
        buf, pos, unpack, size = self.buf, self.pos, self._u64.unpack_from, len(self.buf)
        out: list[str] = []
        append = out.append
        try:
            for _ in range(count):
                (length,) = unpack(buf, pos)
                pos += 8
                if pos + length > size:
                    raise _Truncated("a string runs past the end")
                append(buf[pos : pos + length].decode("utf-8"))
                pos += length
        except struct.error as exc:
            raise _Truncated(str(exc)) from exc
        self.pos = pos
        return out
