import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
# One compute thread per test process, and per entry point a test starts (they inherit this): `make test` runs
# one pytest worker per core, and torch's default of a thread per core in each of them oversubscribes the
# cores; OpenMP's spinning threads then slowed a training test from ~200 to 4-6 env steps/s (2026-11-28, two
# busy processes on 2 cores). The networks in tests are small enough that one thread loses nothing.
os.environ["OMP_NUM_THREADS"] = "1"
# A worker trains many times in its process: glibc's defaults, not a training process's (runtime/allocator.py)
os.environ["ROBOTRL_RETAIN_FREED_MEMORY"] = "0"

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_collection_modifyitems(config, items):
    """Order for `make test`'s parallel workers. They take whole test files (pytest-xdist `--dist loadfile`), so
    that a module-scoped fixture (a Genesis scene compiled once, a learner served once, a wheel built once) is
    built in one process; xdist's `loadgroup` split even explicitly marked groups over two workers (xdist 3.8.0:
    two tests marked xdist_group("g") ran on gw0 and gw1; the Genesis module compiled its first scene cold in
    both, 210 s each, 2026-11-28). Files are handed out in the order of their first test here
    (`--no-loadscope-reorder`): the longest file first, then those with slow learning runs, so that no worker
    picks up a minutes-long file when the others are nearly done. Tests on DDS (marked `dds`) run in a phase of
    their own after these (Makefile): beside a busy second worker a twin's latched e-stop went unheard within the
    robot env's 5 s connect timeout in 3 of 5 runs (test_robot_env, 2026-11-28), never when they ran alone."""
    items.sort(key=_start_order)  # stable: the rest keep their order


# The file that takes longest: test_genesis_backend took 573 s of one worker on a fresh 2-core machine, about
# 400 s of it compiling Genesis's kernels (2026-11-28); started late it would be the suite's tail.
LONGEST_FILES = ("test_genesis_backend",)


def _start_order(item) -> int:
    if item.module.__name__ in LONGEST_FILES:
        return 0
    return 1 if item.get_closest_marker("slow") else 2


@pytest.fixture(autouse=True)
def _scheduling_unchanged():
    """A test leaves the worker's thread as it found it: SVT-AV1 once moved it to SCHED_FIFO 99 (as root), and every
    later test in that worker then starved the others on its core (robot env timing checks and Genesis tests
    failed on timeouts, 2026-11-28). The policy is restored, and the test that changed it fails."""
    if not hasattr(os, "sched_getscheduler"):
        yield
        return
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    yield
    after = os.sched_getscheduler(0), os.sched_getparam(0)
    if after != before:
        os.sched_setscheduler(0, before[0], before[1])
        pytest.fail(f"the test changed its thread's scheduling from {before} to {after}")
