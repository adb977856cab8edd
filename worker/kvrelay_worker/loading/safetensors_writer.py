"""Write a safetensors file one tensor at a time.

``safetensors.torch.save_file`` wants every tensor in memory at once; dequantising a 7B
GGUF to float32 that way would need ~28 GB. The format is simple enough to stream: an
8-byte little-endian header length, a JSON header (shapes, dtypes, byte ranges) padded
with spaces to a multiple of 8, then the raw little-endian bytes in header order. Since
the GGUF tells us every shape up front, the header can be written before any data.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

_DTYPE_NAMES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int8: "I8",
    torch.uint8: "U8",
}


def write_safetensors_streaming(
    path: Path,
    layout: Sequence[tuple[str, tuple[int, ...]]],
    tensors: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype = torch.float32,
    metadata: dict[str, str] | None = None,
) -> None:
    """Write ``tensors`` (which must arrive in ``layout`` order, with those shapes) to ``path``.

    Every tensor is converted to ``dtype``. Raises ``ValueError`` if the stream disagrees
    with the layout, so a bug never leaves a file whose header lies about its data.
    """
    if sys.byteorder != "little":
        raise RuntimeError("safetensors stores little-endian data; big-endian hosts unsupported")
    itemsize = torch.empty((), dtype=dtype).element_size()
    header: dict[str, object] = {"__metadata__": {"format": "pt", **(metadata or {})}}
    offset = 0
    for name, shape in layout:
        nbytes = math.prod(shape) * itemsize
        header[name] = {
            "dtype": _DTYPE_NAMES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)

    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        stream = iter(tensors)
        for expected_name, expected_shape in layout:
            try:
                name, tensor = next(stream)
            except StopIteration:
                raise ValueError(f"tensor stream ended before {expected_name}") from None
            if name != expected_name or tuple(tensor.shape) != tuple(expected_shape):
                raise ValueError(
                    f"expected {expected_name} {tuple(expected_shape)}, "
                    f"got {name} {tuple(tensor.shape)}"
                )
            data = tensor.detach().to(device="cpu", dtype=dtype).contiguous()
            f.write(data.reshape(-1).view(torch.uint8).numpy().data)
        if next(stream, None) is not None:
            raise ValueError("tensor stream has more tensors than the layout")
