"""Keep freed memory in the process instead of handing it back to the OS after every update.

glibc serves large allocations (a batch of conv activations is tens of MB) with fresh mmap pages and
unmaps them on free, so every update page-faults its whole working set in again: for DrQ-v2 at 84x84
that is about half of a CPU update's time. With mmap off for malloc and no heap trimming, the freed blocks
are reused. The cost is that the process's memory never shrinks below its peak, which is what a training
process does anyway. A process that trains many times (the test suite's workers) sets ROBOTRL_RETAIN_FREED_MEMORY=0:
with the setting on, every later reservation grows the one heap mapping (a second 12 GB pixel replay made it
24.6 GB, more than RAM), and the kernel then refuses to fork the process (ENOMEM when the evaluation video starts
ffmpeg, 2026-11-28).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
_M_MMAP_MAX = -4
_applied = False
OPT_OUT = "ROBOTRL_RETAIN_FREED_MEMORY"  # "0": keep glibc's defaults


def retain_freed_memory() -> bool:
    """Switch glibc's malloc to reuse freed memory (once per process). False where that is not glibc."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux") or os.environ.get(OPT_OUT) == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    if not ok:
        log.warning("mallopt refused; freed memory will be returned to the OS after every update")
    _applied = ok
    return ok
