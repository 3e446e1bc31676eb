"""Peak memory of a code section, on CUDA (allocator statistics) and on CPU (resident set size).

On CPU, PyTorch keeps no allocator statistics, so we use the kernel's resident-set high-water mark:
writing ``5`` to ``/proc/self/clear_refs`` resets ``VmHWM`` to the current RSS (Linux >= 4.0), and
``VmHWM - RSS at entry`` after the section is the extra resident memory the section needed at its
peak. That is a process-wide figure: keep other threads idle while measuring.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} missing from {_STATUS}")


def cpu_peak_tracking_available() -> bool:
    """True when the RSS high-water mark can be reset (Linux with a writable ``clear_refs``)."""
    try:
        _status_kib("VmHWM")
        with _CLEAR_REFS.open("w") as f:
            f.write("5")
        return True
    except (OSError, RuntimeError):
        return False


@dataclass
class PeakMemory:
    """Result holder: ``peak_bytes`` is filled when the ``with`` block exits."""

    device: str
    peak_bytes: int = 0  # extra memory at the peak, over the amount held at entry
    absolute_peak_bytes: int = 0  # CUDA: max allocated; CPU: peak resident set size of the process

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / 2**20


@contextmanager
def track_peak_memory(device: torch.device | str = "cpu") -> Iterator[PeakMemory]:
    """Measure the peak memory used by the body of the ``with`` block.

    CUDA: ``torch.cuda.max_memory_allocated`` after a reset (bytes held by tensors).
    CPU: the process's resident-set high-water mark during the block (``absolute_peak_bytes``) and
    its rise over the resident size at entry (``peak_bytes``).
    """
    device = torch.device(device)
    result = PeakMemory(str(device))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start_alloc = torch.cuda.memory_allocated(device)
        yield result
        torch.cuda.synchronize(device)
        result.absolute_peak_bytes = torch.cuda.max_memory_allocated(device)
        result.peak_bytes = result.absolute_peak_bytes - start_alloc
        return
    if device.type != "cpu":
        raise ValueError(f"peak memory tracking supports cpu and cuda, not {device.type}")
    if not cpu_peak_tracking_available():
        raise RuntimeError(
            "CPU peak-memory tracking needs Linux /proc/self/clear_refs (resetting VmHWM); it is not writable here"
        )
    start = _status_kib("VmRSS")
    yield result
    peak = _status_kib("VmHWM")
    result.absolute_peak_bytes = peak * 1024
    result.peak_bytes = max(0, peak - start) * 1024
