"""How the console scripts report a failure.

An expected error is shown as one line naming the program, without a traceback: bad input or config, a missing,
corrupt or locked file, a diverged run (ValueError, OSError, FloatingPointError, OmegaConf's errors, and every
exception class robotrl defines). Anything else is a bug and keeps its traceback. An expected error's traceback
still goes to the run's log file where Hydra keeps one, and to the terminal with HYDRA_FULL_ERROR=1, the switch
Hydra's own hint names; Hydra owns the command line, so there is no `--verbose` flag.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hydra.errors import CompactHydraException
from omegaconf.errors import OmegaConfBaseException

VERBOSE_ENV = "HYDRA_FULL_ERROR"
_EXPECTED_TYPES = (ValueError, OSError, FloatingPointError, OmegaConfBaseException)


class ReportedError(CompactHydraException):
    """An expected error as its one line; Hydra prints such an exception without a traceback."""


def is_expected(err: BaseException) -> bool:
    return isinstance(err, _EXPECTED_TYPES) or type(err).__module__.partition(".")[0] == "robotrl"


def error_line(program: str, err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{program}: error: {'; '.join(lines) or type(err).__name__}"


def reports_errors(program: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates a Hydra task function (below `@hydra.main`): an expected error leaves it as a ReportedError."""

    def decorate(task: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(task)  # Hydra unwraps it to find the task's module, which names the job and its log file
        def task_reporting_errors(*args: Any, **kwargs: Any) -> Any:
            try:
                return task(*args, **kwargs)
            except Exception as err:
                if isinstance(err, ReportedError) or not is_expected(err) or _verbose():
                    raise
                log_file = _log_traceback(program, err)
                where = f" (traceback in {log_file})" if log_file else ""
                # from None: Hydra would print an OmegaConf cause's message a second time
                raise ReportedError(error_line(program, err) + where) from None

        return task_reporting_errors

    return decorate


@contextmanager
def exits_on_error(program: str) -> Iterator[None]:
    """Around what an entry point checks before Hydra starts: an expected error prints its line and exits 1."""
    try:
        yield
    except Exception as err:
        if not is_expected(err) or _verbose():
            raise
        print(error_line(program, err), file=sys.stderr)
        raise SystemExit(1) from None


def _verbose() -> bool:
    return os.environ.get(VERBOSE_ENV) == "1"


def _log_traceback(program: str, err: BaseException) -> str | None:
    """Write `err` with its traceback to the log files of the root logger only (the console gets one line);
    returns the first file's path, or None when logging keeps no file."""
    files = [
        h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler) and h.baseFilename != os.devnull
    ]
    record = logging.LogRecord(
        __name__, logging.ERROR, __file__, 0, "%s failed", (program,), (type(err), err, err.__traceback__)
    )
    for handler in files:
        handler.handle(record)
    return files[0].baseFilename if files else None
