"""One process at a time in a run directory: a second learner (or a second `robotrl-train resume=`) on a run
another process is writing would replay and cut its write-ahead log and save over its checkpoints.

The lock is a POSIX record lock (fcntl.lockf) on `<run dir>/run.lock`, held until the process exits; the
kernel drops it when the process dies, however it dies, so a crashed run never leaves a stale lock. Record
locks belong to the process, not to a file descriptor: taking the lock again in the same process (a learner
rebuilt in-process on its own directory) is no conflict. The file holds the holder's pid and host, for the
refusal's message.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

LOCK_NAME = "run.lock"
# descriptors of the locks this process holds, by directory: closing any descriptor of a locked file would
# release the process's lock on it, so they stay open
_held: dict[Path, int] = {}


class RunDirectoryInUse(RuntimeError):
    """Another process holds the run directory."""


def hold_run_dir(run_dir: str | os.PathLike) -> Path:
    """Lock `run_dir` (created if missing) for the rest of this process; returns the lock file. Raises
    RunDirectoryInUse naming the directory and, where the lock file says, the pid that holds it."""
    directory = Path(run_dir).resolve()
    path = directory / LOCK_NAME
    if directory in _held:
        return path
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise RunDirectoryInUse(
            f"run directory {directory} is in use by {_holder(path)} (lock {path}): two processes would write "
            "over each other's checkpoints and write-ahead log; stop that one first, or use another run directory"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    _held[directory] = fd
    return path


def _holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        text = ""
    return f"another process ({text})" if text.startswith("pid ") else "another process"
