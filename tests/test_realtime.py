"""Real-time scheduling of the control threads (hardware/realtime.py): settings are checked by name, a
refusal by the OS says what to grant, and where the OS allows it the robot env's control thread and the
twin's loop really run under SCHED_FIFO. Linux only."""

import os
import subprocess
import sys
import textwrap
import threading

import pytest
from robotrl.hardware.realtime import (
    RealtimeError,
    check_priority,
    scheduling_policy,
    set_realtime_priority,
)

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_FIFO per thread is Linux-only"),
    pytest.mark.dds,  # on DDS: runs alone after the parallel tests (tests/conftest.py)
]


def _on_a_thread(fn):
    """Run `fn` on a fresh thread (whose scheduling dies with it) and return its result or raise its error."""
    result = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as error:  # handed to the caller
            result["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def _fifo_allowed() -> bool:
    def attempt():
        try:
            set_realtime_priority("probe", 1)
        except RealtimeError:
            return False
        return True

    return _on_a_thread(attempt)


needs_fifo = pytest.mark.skipif(
    sys.platform.startswith("linux") and not _fifo_allowed(), reason="this user may not use SCHED_FIFO"
)


@pytest.mark.parametrize("bad", [-1, 100, 1.5, True, "80", None])
def test_a_priority_outside_0_to_99_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"hardware\.realtime_priority must be an integer in 0\.\.99"):
        check_priority("hardware.realtime_priority", bad)


def test_priority_zero_leaves_normal_scheduling():
    assert _on_a_thread(lambda: (set_realtime_priority("x", 0), scheduling_policy())[1]) == "other"


@needs_fifo
def test_a_thread_runs_under_sched_fifo_at_the_priority_asked():
    def run():
        set_realtime_priority("hardware.realtime_priority", 20)
        return scheduling_policy(), os.sched_getparam(0).sched_priority

    assert _on_a_thread(run) == ("fifo", 20)


def test_a_refusal_names_the_setting_and_what_to_grant():
    # As root (CAP_SYS_NICE) SCHED_FIFO is always allowed: drop to `nobody` in a child to be refused.
    code = textwrap.dedent(
        """
        import os, resource
        from robotrl.hardware.realtime import RealtimeError, set_realtime_priority
        if os.getuid() == 0:
            os.setgid(65534); os.setuid(65534)
        resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
        try:
            set_realtime_priority("hardware.realtime_priority", 80)
        except RealtimeError as error:
            print(error)
        else:
            print("NOT REFUSED")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    message = out.stdout
    assert "hardware.realtime_priority=80: the OS refused SCHED_FIFO" in message
    assert "rtprio" in message and "hardware.realtime_priority=0" in message


@needs_fifo
def test_lock_memory_locks_the_process_pages():
    code = textwrap.dedent(
        """
        from robotrl.hardware.realtime import lock_memory
        lock_memory("hardware.lock_memory")
        locked = [line for line in open("/proc/self/status") if line.startswith("VmLck")][0]
        print(int(locked.split()[1]))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if out.returncode != 0 and "mlockall failed" in out.stderr:
        pytest.skip("the memlock limit refuses mlockall here: " + out.stderr.strip().splitlines()[-1])
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) > 1000  # kB locked: the interpreter and its libraries


@needs_fifo
def test_the_robot_env_control_thread_and_the_twin_loop_run_real_time_when_configured():
    pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')
    from robotrl.hardware.robot_env import RobotEnv, RobotEnvConfig
    from robotrl.hardware.sim_twin import SimTwin, SimTwinConfig

    twin = SimTwin(SimTwinConfig(rate_hz=250.0, domain_id=190, report_interval=0, realtime_priority=30))
    policies = []

    def run_twin():
        twin.run()
        policies.append(scheduling_policy())

    thread = threading.Thread(target=run_twin, daemon=True)
    thread.start()
    env = None
    try:
        cfg = RobotEnvConfig(domain_id=190, control_rate_hz=250.0, connect_timeout=5.0, realtime_priority=40)
        env = RobotEnv(cfg)
        assert scheduling_policy(env.link.thread.native_id) == "fifo"
        assert os.sched_getparam(env.link.thread.native_id).sched_priority == 40
        env.reset()  # the real-time control thread drives the arm home
    finally:
        if env is not None:
            env.close()
        twin.stop()
        thread.join(timeout=5)
        twin.close()
    assert policies == ["fifo"]


def test_robot_env_and_twin_configs_refuse_a_bad_priority_by_name():
    pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')
    from robotrl.hardware.robot_env import RobotEnvConfig
    from robotrl.hardware.sim_twin import SimTwinConfig

    with pytest.raises(
        ValueError, match=r"hardware\.realtime_priority must be an integer in 0\.\.99 \(0: normal scheduling\), got 120"
    ):
        RobotEnvConfig(realtime_priority=120).validate()
    with pytest.raises(ValueError, match=r"hardware\.lock_memory must be true or false"):
        RobotEnvConfig(lock_memory="yes").validate()
    with pytest.raises(
        ValueError, match=r"realtime_priority must be an integer in 0\.\.99 \(0: normal scheduling\), got -5"
    ):
        SimTwinConfig(realtime_priority=-5).validate()
