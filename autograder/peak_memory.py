"""How far processes' peak resident memory rose, read from ``/proc`` (each one's ``VmHWM``).

The measure of a test's memory rule where no control group counts the sandbox's memory (the
kernel manager's fallback, on the kernel's processes) and in process (``ThisProcess``).
"""
from __future__ import annotations

import ctypes
import os

# glibc's malloc serves a block above this size from its own mmap and returns it to the system when it is
# freed. Without a fixed threshold glibc raises it after each such free, and a later tensor of that size
# reuses freed pages already resident: its memory would never show in a peak (a kernel's N x N buffer
# measured 0 MiB after earlier tests freed as much). The kernel gets it as MALLOC_MMAP_THRESHOLD_.
MMAP_THRESHOLD = 128 * 1024
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from malloc.h


def fix_mmap_threshold() -> None:
    """Give this process the kernel's fixed threshold (glibc only; elsewhere nothing changes)."""
    try:
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    except (OSError, AttributeError):
        pass


def reset(pids) -> int:
    """Reset each process's peak to its resident memory now; their resident memory, summed (a
    process that just ended, or whose counters cannot be reset, is left out)."""
    before = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
            before += _status(pid, "VmRSS")
        except OSError:
            pass
    return before


def rise(pids, before: int | None) -> int | None:
    """How far the processes' peaks, summed, rose above BEFORE (``reset``'s); None: not measured."""
    peak = 0
    for pid in pids:
        try:
            peak += _status(pid, "VmHWM")
        except OSError:
            continue
    return None if before is None or not peak else max(peak - before, 0)


def _status(pid, field: str) -> int:
    """A field of ``/proc/PID/status`` in bytes (0 if it has none)."""
    with open(f"/proc/{pid}/status") as f:
        return next((int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":")), 0)


class ThisProcess:
    """The kernel manager's memory readings (``reset_peak_memory``, ``peak_memory_rise``) on this process."""

    def __init__(self):
        self._before: int | None = None
        fix_mmap_threshold()

    def reset_peak_memory(self) -> None:
        self._before = reset([os.getpid()])

    def peak_memory_rise(self) -> int | None:
        return rise([os.getpid()], self._before)
