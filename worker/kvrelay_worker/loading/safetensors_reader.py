"""Read ``*.safetensors`` tensors one at a time with plain reads, never a memory map.

Why our own reader: ``safetensors.safe_open`` maps the whole file, and every page a tensor
is copied from stays in the process's resident memory until the file is closed, so loading
one 538 MB file peaked at the weights plus the whole file (measured: +527 MiB of mapped
pages on top of 538 MiB of weights). A ``readinto`` per tensor puts the bytes straight into
the tensor that is yielded: what the loader keeps beyond the weights is the tensor being
copied, and the page cache (not this process) holds the file.

The format (``huggingface/safetensors``'s docs): an 8-byte little-endian header length, a
JSON header mapping names to ``{"dtype", "shape", "data_offsets": [begin, end]}`` relative
to the end of the header (plus an optional ``__metadata__``), then the data.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path
from typing import Any

import torch

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
    "BF16": torch.bfloat16, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
# A header this large is a corrupt length, not a real file's.
_MAX_HEADER = 100 << 20


@dataclass(frozen=True)
class StoredTensor:
    """One tensor's place in a file: dtype, torch shape, absolute byte range."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


class SafetensorsFile:
    """A safetensors file's header; ``read`` materialises one tensor at a time."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        with self.path.open("rb") as f:
            self.tensors = _parse_header(f, self.path)

    def names(self) -> list[str]:
        return list(self.tensors)

    def read(self, name: str, handle: BufferedReader | None = None) -> torch.Tensor:
        """The tensor, in a fresh CPU tensor of its stored dtype (read from ``handle`` when
        given, an open binary file of this path, else from a fresh one)."""
        entry = self.tensors[name]
        if handle is None:
            with self.path.open("rb") as f:
                return _read(f, entry, self.path)
        return _read(handle, entry, self.path)


def _read(f: BufferedReader, entry: StoredTensor, path: Path) -> torch.Tensor:
    size = entry.end - entry.begin
    raw = torch.empty(size, dtype=torch.uint8)
    f.seek(entry.begin)
    view = raw.numpy().data
    done = 0
    while done < size:
        got = f.readinto(view[done:])
        if not got:
            raise ValueError(f"{path}: {entry.name} runs past the end of the file")
        done += got
    return raw.view(entry.dtype).reshape(entry.shape)


def _parse_header(f: BufferedReader, path: Path) -> dict[str, StoredTensor]:
    head = f.read(8)
    if len(head) < 8:
        raise ValueError(f"{path}: too short to be a safetensors file")
    (length,) = struct.unpack("<Q", head)
    if length > _MAX_HEADER:
        raise ValueError(f"{path}: header length {length} is not plausible")
    try:
        header: Any = json.loads(f.read(length))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: unreadable safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the safetensors header is not a JSON object")
    data_start = 8 + length
    file_size = path.stat().st_size
    tensors: dict[str, StoredTensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _entry(name, info, data_start, file_size, path)
    return tensors


def _entry(name: str, info: Any, data_start: int, file_size: int, path: Path) -> StoredTensor:
    try:
        dtype = _DTYPES[info["dtype"]]
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (int(v) for v in info["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: tensor {name!r} has a malformed entry: {info!r}") from exc
    expected = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if end - begin != expected or begin < 0 or data_start + end > file_size:
        raise ValueError(f"{path}: tensor {name!r} spans bytes {begin}..{end}, which do not "
                         f"fit its {info['dtype']} shape {list(shape)} inside the file")
    return StoredTensor(name, dtype, shape, data_start + begin, data_start + end)
