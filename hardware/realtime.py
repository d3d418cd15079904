"""Real-time scheduling for a control thread: SCHED_FIFO at a priority, and optionally all memory locked.

A 500 Hz loop on a normal Linux scheduler shares the core with whatever else runs (the policy's torch
threads, a camera driver, the learner's gRPC traffic) and misses periods when they are busy. Under
SCHED_FIFO the control thread preempts every normal thread the moment its sleep ends; locking memory
keeps it from stalling on a page fault. Both need permission: root, CAP_SYS_NICE / CAP_IPC_LOCK, or an
rtprio / memlock limit for the user (/etc/security/limits.d). A refusal fails with what to grant; it is
never ignored, because a robot that was configured to run real-time and silently does not is worse than
one that stops.

Linux only (a thread's native id is its scheduling id there). Priority 0 means normal scheduling.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

MAX_PRIORITY = 99  # SCHED_FIFO's range on Linux is 1..99
_MCL_CURRENT, _MCL_FUTURE = 1, 2


class RealtimeError(RuntimeError):
    """The OS refused real-time scheduling or memory locking; the message names the setting and the fix."""


def check_priority(name: str, priority: object) -> int:
    """`priority` as an int in 0..99, or a ValueError naming `name`."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= MAX_PRIORITY:
        raise ValueError(f"{name} must be an integer in 0..{MAX_PRIORITY} (0: normal scheduling), got {priority!r}")
    return priority


def set_realtime_priority(name: str, priority: int, thread_id: int | None = None) -> None:
    """Run the thread `thread_id` (a `threading.Thread.native_id`; None: the calling thread) under
    SCHED_FIFO at `priority`. `name` is the config key, for the error. Priority 0 does nothing."""
    check_priority(name, priority)
    if priority == 0:
        return
    if not sys.platform.startswith("linux") or not hasattr(os, "sched_setscheduler"):
        raise RealtimeError(f"{name}={priority}: SCHED_FIFO is set per thread on Linux only; set {name}=0 here")
    try:
        os.sched_setscheduler(thread_id or 0, os.SCHED_FIFO, os.sched_param(priority))
    except PermissionError as error:
        raise RealtimeError(
            f"{name}={priority}: the OS refused SCHED_FIFO ({error.strerror}). Give this user a real-time "
            f"priority limit (a line '<user> - rtprio {MAX_PRIORITY - 1}' in /etc/security/limits.d/, then log in "
            f"again) or CAP_SYS_NICE, or set {name}=0 for normal scheduling"
        ) from error
    except OSError as error:
        raise RealtimeError(f"{name}={priority}: sched_setscheduler failed ({error.strerror})") from error


def lock_memory(name: str) -> None:
    """Lock the process's current and future pages in RAM (mlockall), so the control loop never waits on a
    page fault. `name` is the config key, for the error."""
    if not sys.platform.startswith("linux"):
        raise RealtimeError(f"{name}=true: memory locking is implemented for Linux only; set {name}=false here")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mlockall(_MCL_CURRENT | _MCL_FUTURE) != 0:
        code = ctypes.get_errno()
        hint = (
            f"raise the user's memlock limit (a line '<user> - memlock unlimited' in /etc/security/limits.d/) "
            f"or grant CAP_IPC_LOCK, or set {name}=false"
            if code in (errno.EPERM, errno.ENOMEM)
            else f"set {name}=false"
        )
        raise RealtimeError(f"{name}=true: mlockall failed ({os.strerror(code)}); {hint}")


def scheduling_policy(thread_id: int | None = None) -> str:
    """'fifo', 'rr' or 'other' for the thread `thread_id` (None: the calling thread); for reports and tests."""
    policy = os.sched_getscheduler(thread_id or 0)
    return {os.SCHED_FIFO: "fifo", os.SCHED_RR: "rr"}.get(policy, "other")
