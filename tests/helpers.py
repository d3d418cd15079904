"""Shared helpers for tests that run the real entry points."""

import contextlib
import importlib
import io
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A training run small enough for the test suite: seconds, not minutes.
TINY = [
    "task=gym",
    "total_steps=600",
    "learning_starts=200",
    "log_interval=100",
    "eval_interval=300",
    "eval_episodes=1",
    "checkpoint_interval=300",
    "replay_capacity=5000",
    "agent.batch_size=32",
    "agent.actor_hidden=[32,32]",
    "agent.critic_hidden=[32,32]",
    "progress=false",
    "task.max_episode_steps=50",
]


def run_module(
    module: str, *args: str, timeout: float = 240, check: bool = True, process: bool = False
) -> subprocess.CompletedProcess:
    """`python -m module args...`: its exit code, stdout and stderr. By default the program's `main()` runs in
    this process, as the console script would run it (sys.argv, Hydra, the one-line error and its exit code),
    which spares each run 4-8 s of imports (2026-11-28, 2-core EPYC); `process=True` starts a real process, for a
    test about the process itself (a kill, a lock held by another process, what it imports). `timeout` bounds
    a real process only; in process the test's own pytest timeout does."""
    if process:
        env = dict(os.environ, MUJOCO_GL="egl", HYDRA_FULL_ERROR="0")
        proc = subprocess.run(
            [sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
    else:
        proc = _run_main(module, args)
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _run_main(module: str, args: tuple[str, ...]) -> subprocess.CompletedProcess:
    """`module.main()` with `args` as its command line, its output captured. What a program sets for its whole
    process is put back afterwards: the logging handlers Hydra adds (a run's log file among them), the working
    directory, torch's thread count (`threads=`), the SIGINT and SIGTERM handlers (deploy, the actor, the learner
    and the twin stop on them: left in place, Ctrl-C would no longer stop pytest)."""
    import torch

    main = importlib.import_module(module).main
    threads = torch.get_num_threads()
    stop_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers, level, argv, cwd = list(root.handlers), root.level, sys.argv, os.getcwd()
    verbose = os.environ.pop("HYDRA_FULL_ERROR", None)
    code = 0
    try:
        sys.argv = [module, *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    finally:
        sys.argv = argv
        os.chdir(cwd)
        torch.set_num_threads(threads)
        for sig, handler in stop_handlers.items():
            signal.signal(sig, handler)
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        if verbose is not None:
            os.environ["HYDRA_FULL_ERROR"] = verbose
    return subprocess.CompletedProcess([module, *args], code, out.getvalue(), err.getvalue())


DEADLINE = 10.0  # seconds; every wait polls and returns as soon as its condition holds


def wait_until(condition, timeout: float = DEADLINE, interval: float = 0.005) -> bool:
    """Polls `condition` until it holds or `timeout` passes; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


# ---- robotrl-learner in a process, robotrl.actor.Actor on a thread ------------------------------------------

LEARNER_ARGS = [
    "task=gym",
    "task.env_id=Pendulum-v1",
    "task.max_episode_steps=50",
    "agent.batch_size=32",
    "agent.actor_hidden=[32,32]",
    "agent.critic_hidden=[32,32]",
    "learning_starts=100",
    "weights_every=20",
    "log_interval=200",
    "replay_capacity=20000",
    "server.max_message_mb=1",
    "server.heartbeat_timeout_s=3",
]


class LearnerProcess:
    """robotrl-learner in its own process, on a fixed port and run directory (so it can be killed and restarted)."""

    def __init__(self, run_dir, port, *extra, base=LEARNER_ARGS):
        self.run_dir, self.port = run_dir, port
        self.args = [sys.executable, "-m", "robotrl.learner", *base, *extra]
        self.args += [f"server.port={port}", f"hydra.run.dir={run_dir}"]
        self.log_path = run_dir.parent / f"{run_dir.name}.log"
        from robotrl.runtime.transport.client import LearnerClient
        from robotrl.runtime.transport.config import ConnectConfig

        self.client = LearnerClient(ConnectConfig(address=f"127.0.0.1:{port}", deadline_s=2))
        self.start()

    def start(self):
        env = dict(os.environ, OMP_NUM_THREADS="1", MUJOCO_GL="egl")
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        return wait_for(self._answers, 90, "the learner to serve")

    def _answers(self):
        import grpc

        if self.proc.poll() is not None:
            raise AssertionError(f"the learner exited with {self.proc.returncode}:\n{self.output()}")
        try:
            return self.client.status()
        except grpc.RpcError:
            return None

    def status(self):
        return self.client.status()

    def output(self):
        return self.log_path.read_text(errors="replace")[-4000:]

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self):
        """SIGTERM: the learner saves a last checkpoint and exits cleanly."""
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.client.close()
        return self.proc.returncode


def start_actor(cfg, make_env=None, run_dir=None):
    from robotrl.actor import Actor

    actor, stop, result = Actor(cfg, run_dir, make_env=make_env), threading.Event(), {}

    def target():
        try:
            result["summary"] = actor.run(stop)
        except BaseException as err:  # surfaced by the test's join
            result["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return actor, stop, thread, result


def join_actor(thread, result, timeout=60):
    thread.join(timeout)
    assert not thread.is_alive(), "the actor did not stop in time"
    if "error" in result:
        raise result["error"]
    return result["summary"]


def run_with_file_size_limit(limit: int, code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run Python `code` in a process whose writes past `limit` bytes of any file fail (EFBIG), as on a full disk:
    what a write that is cut short leaves behind."""
    prelude = (
        "import resource, signal\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"  # the write fails instead of the signal killing us
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
    )
    env = dict(os.environ, MUJOCO_GL="egl", HYDRA_FULL_ERROR="0")
    return subprocess.run(
        [sys.executable, "-c", prelude + code, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def untrained_run(run: Path, overrides: list[str], deploy_spec: bool = True) -> Path:
    """A robotrl-train run directory as train writes it: config.yaml, deploy_spec.json (unless `deploy_spec` is
    false: a run from before deploy specs) and a checkpoint of an untrained policy (deployment must not care how
    good it is)."""
    import torch
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from robotrl.tasks import write_deploy_spec_for_run

    from robotrl.agents import make_agent
    from robotrl.config import to_train_config
    from robotrl.runtime.checkpoint import save_checkpoint
    from robotrl.runtime.loop import make_training_env

    run.mkdir(parents=True, exist_ok=True)
    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    OmegaConf.save(cfg, run / "config.yaml", resolve=True)
    train_cfg = to_train_config(cfg)
    env = make_training_env(train_cfg, num_envs=1)
    torch.manual_seed(0)
    agent = make_agent(train_cfg.agent, env.obs_spec, env.action_dim, torch.device("cpu"))
    env.close()
    save_checkpoint(run / "checkpoints", 100, agent, None, {"env_step": 100})
    if deploy_spec:
        write_deploy_spec_for_run(train_cfg.task, train_cfg.agent.frame_stack, run)
    return run


class TwinThread:
    """robotrl-sim-twin (hardware/sim_twin.py: SimTwin) running in a daemon thread for a `with` block, which gives
    the twin; stopped, joined and closed after it. `cfg`: SimTwinConfig's other settings."""

    def __init__(self, domain_id: int, rate_hz: float = 250.0, **cfg):
        import threading

        from robotrl.hardware.sim_twin import SimTwin, SimTwinConfig

        self.twin = SimTwin(SimTwinConfig(rate_hz=rate_hz, domain_id=domain_id, report_interval=0, **cfg))
        self.thread = threading.Thread(target=self.twin.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self.twin

    def __exit__(self, *exc):
        self.twin.stop()
        self.thread.join(timeout=5)
        self.twin.close()


def small_learner_args(task: str, learning_starts: int = 30) -> list[str]:
    """robotrl-learner overrides for a robot test: `task`, tiny networks, weights sent every 10 updates."""
    return [
        f"task={task}",
        "agent.batch_size=32",
        "agent.actor_hidden=[32,32]",
        "agent.critic_hidden=[32,32]",
        f"learning_starts={learning_starts}",
        "weights_every=10",
        "log_interval=50",
        "replay_capacity=5000",
    ]


def quick_link(port: int):
    """An actor's connection to a learner on this machine that notices a gap within a fraction of a second."""
    from robotrl.runtime.transport.config import ConnectConfig

    return ConnectConfig(address=f"127.0.0.1:{port}", heartbeat_s=0.2, backoff_min_s=0.05, backoff_max_s=0.3)
