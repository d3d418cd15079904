"""Keep freed memory in the process instead of handing it back to the OS after every update.

glibc serves large allocations (a batch of conv activations is tens of MB) with fresh mmap pages and
unmaps them on free, so every update page-faults its whole working set in again: for DrQ-v2 at 84x84
that is about half of a CPU update's time. With mmap off for malloc and no heap trimming, the freed blocks
are reused. The cost is that the process's memory never shrinks below its peak, which is what a training
process does anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
_M_MMAP_MAX = -4
_DEFAULT_TRIM_THRESHOLD = 128 * 1024  # glibc's defaults (mallopt(3))
_DEFAULT_MMAP_MAX = 65536
_applied = False


def retain_freed_memory() -> bool:
    """Switch glibc's malloc to reuse freed memory (once per process). False where that is not glibc."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = _mallopt()
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    ok = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    if not ok:
        log.warning("mallopt refused; freed memory will be returned to the OS after every update")
    _applied = ok
    return ok


def restore_default_allocator() -> bool:
    """Undo `retain_freed_memory` for a process that goes on after training (the test suite runs many trainings
    in one worker). Kept on, every later allocation grows the one heap mapping: a second pixel replay reserved
    past the first's freed block (untouched pages, 12 GB at the default capacity) made it larger than RAM, and
    the kernel then refused to fork the process to start ffmpeg (ENOMEM, 2026-11-28). False where nothing was
    changed."""
    global _applied
    if not _applied:
        return False
    mallopt = _mallopt()
    _applied = not (
        mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX) == 1 and mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD) == 1
    )
    return not _applied


def _mallopt():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt
