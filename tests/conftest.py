import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
# One compute thread per test process, and per entry point a test starts (they inherit this): `make test` runs
# one pytest worker per core, and torch's default of a thread per core in each of them oversubscribes the
# cores; OpenMP's spinning threads then slowed a training test from ~200 to 4-6 env steps/s (2026-11-28, two
# busy processes on 2 cores). The networks in tests are small enough that one thread loses nothing.
os.environ["OMP_NUM_THREADS"] = "1"

import pytest
import torch

from robotrl.runtime.allocator import restore_default_allocator

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _default_allocator():
    """A training run in the test's process switches glibc's malloc to keep freed memory (runtime/allocator.py),
    which suits one training per process; each test starts from glibc's defaults instead."""
    yield
    restore_default_allocator()


# tryfirst: xdist turns an xdist_group marker into the test's scheduling scope in its own hook of this name, so
# the markers must be on the items before that runs; added after it, they group nothing (a Genesis scene was
# compiled cold in both workers, 210 s each, 2026-11-28)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Schedule for `make test`'s parallel workers (pytest-xdist, --dist loadgroup):
    - tests on DDS (marked `dds`) share one worker: a DDS domain is machine-wide, not per process, so two workers
      on one domain id hear each other's e-stop and joint states. `make test` runs them apart, after the rest:
      beside a busy second worker a twin's latched e-stop went unheard within the robot env's 5 s connect
      timeout in 3 of 5 runs (test_robot_env, 2026-11-28), never when they ran alone;
    - the tests of a module that shares a module-scoped fixture (a Genesis scene compiled once, a learner
      served once, a wheel built once) run in one worker, so that fixture is built once;
    - the longest group starts first, then the slow learning runs, so that no worker picks up a minutes-long unit
      when the others are nearly done (longest first keeps the workers' finishing times close)."""
    for item in items:
        if item.get_closest_marker("dds"):
            item.add_marker(pytest.mark.xdist_group("dds"))
        elif _uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    items.sort(key=_start_order)  # stable: the rest keep their order


# The modules whose one group takes longest: test_genesis_backend took 573 s of one worker on a fresh 2-core
# machine, about 400 s of it compiling Genesis's kernels (2026-11-28); started late it would be the suite's tail.
LONGEST_GROUPS = ("test_genesis_backend",)


def _start_order(item) -> int:
    if item.module.__name__ in LONGEST_GROUPS:
        return 0
    return 1 if item.get_closest_marker("slow") else 2


def _uses_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definition.scope in ("module", "package", "session")
        for definitions in info.name2fixturedefs.values()
        for definition in definitions
        if definition.baseid  # fixtures of pytest itself and of plugins (tmp_path_factory, ...) have no baseid
    )


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
