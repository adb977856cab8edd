"""Which errors leave a CUDA device unusable for the rest of the process.

After a kernel faults (an illegal address, a device-side assert, a launch failure) the
CUDA context is poisoned: every later call on it, of any request, fails with the same
error. Retrying the batch in halves to find "the request that breaks the step" would then
fail every request one by one, and every step after. Such an error is not a request's
fault: the engine raises it whole, and the worker exits so that its jobs move to a
healthy worker (``kvrelay_worker/device_loss.py``).

torch reports these as ``torch.AcceleratorError`` (a ``RuntimeError``) with the CUDA
runtime's own text after "CUDA error: "; Triton's launcher as "Triton Error [CUDA]: "
with the same text. Out-of-memory is recoverable and not in the list.
"""

from __future__ import annotations

# cudaGetErrorString texts of the sticky errors, with their cudaError_t codes.
STICKY_CUDA_ERRORS = {
    "uncorrectable ECC error encountered": 214,
    "an illegal memory access was encountered": 700,
    "the launch timed out and was terminated": 702,
    "device-side assert triggered": 710,
    "hardware stack error": 714,
    "an illegal instruction was encountered": 715,
    "misaligned address": 716,
    "operation not supported on global/shared address space": 717,
    "invalid program counter": 718,
    "unspecified launch failure": 719,
}
_STICKY_CODES = frozenset(STICKY_CUDA_ERRORS.values())


def is_sticky_device_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a sticky CUDA error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "error_code", None) in _STICKY_CODES:
            return True
        if isinstance(current, RuntimeError):
            text = str(current)
            if any(message in text for message in STICKY_CUDA_ERRORS):
                return True
        current = current.__cause__ or current.__context__
    return False
