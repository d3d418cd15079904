"""Minutes to a trained policy on one GPU: panda_pick_cube from scratch, no demonstrations.

    python bench/gpu_train.py [--quick] [--minutes 20] [--backend genesis|mujoco_warp|mujoco] [--num-envs 4096] [--save]
                              [OVERRIDE ...]

robotrl-train runs the GPU recipe (`recipe`): `--num-envs` envs on `--backend` (Genesis on CUDA by default), the
task's fewest physics substeps (`PandaPickCube.fewest_substeps`, bench/substeps.py: the policy's 25 Hz kept),
`agent.updates_per_step` updates per vectorized step on a large batch, the update compiled into a CUDA graph
(`agent.compile=true`) in bf16, the replay on the GPU, and every `--eval-every` env steps 256 deterministic
episodes evaluated at once (`eval_envs=256`). The run is stopped after `--minutes` of wall clock; its metrics.csv
is the success-against-time curve, kept in the JSON line whether or not it reached 90%.

Figures: `minutes_to_90` (the first evaluation at >= 90% success, in minutes of the training loop: its clock starts
once the envs are built; null if not reached), `startup_s` (process start to the loop's first log line, Genesis's
kernel compilation included), `compile_s` (the compiled update's one-off cost at the recipe's sizes, measured apart
in its own process), `env_steps_per_s` and `updates_per_s` (means over the run's log rows), `curve` ([minutes,
success] per evaluation), `device`. Goal (GPU-scale issue): `minutes_to_90` <= 10 on one H100, stretch 5.

The reference the issue names: MuJoCo Playground's Franka pick-cube with PPO, about 2.5 minutes on one GPU
compilation included, and ManiSkill3's PickCube with PPO in about 1.3 minutes; not runnable here, quoted.

--quick: the CPU and MuJoCo, 8 envs, small networks, under a minute: it checks the recipe runs end to end, and
reaches no 90%. OVERRIDEs are robotrl-train's Hydra overrides, applied after the recipe's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, in_subprocess, parse_args, stop_process

TASK = "panda_pick_cube"
CONTROL_PERIOD_S = 0.04
EVAL_ENVS = 256
SUCCESS = 0.9


def recipe(backend: str, device: str, num_envs: int, eval_every: int, quick: bool) -> list[str]:
    """robotrl-train's overrides for the run (the GPU recipe, or its CPU miniature with `quick`)."""
    from robotrl.tasks import task_class

    substeps = task_class(TASK).fewest_substeps
    common = [
        f"task={TASK}",
        f"backend={backend}",
        f"device={device}",
        f"num_envs={num_envs}",
        f"task.control_substeps={substeps}",
        f"task.physics_dt={CONTROL_PERIOD_S / substeps}",
        "total_steps=1000000000",  # the time limit ends the run
        f"eval_interval={eval_every}",
        f"log_interval={max(num_envs, eval_every // 10)}",
        "checkpoint_interval=1000000000000",
        "checkpoint_replay=false",
        "video=false",
        "progress=false",
    ]
    if quick:
        return [
            *common,
            "learning_starts=400",
            "eval_envs=8",
            "eval_episodes=8",
            "agent.batch_size=64",
            "agent.actor_hidden=[32,32]",
            "agent.critic_hidden=[32,32]",
            "agent.updates_per_step=1",
        ]
    return [
        *common,
        f"learning_starts={20 * num_envs}",
        f"eval_envs={EVAL_ENVS}",
        f"eval_episodes={EVAL_ENVS}",
        "replay_capacity=4000000",
        "agent.batch_size=8192",
        "agent.updates_per_step=2",
        "agent.n_step=3",
        "agent.critic_layer_norm=true",
        "agent.compile=true",
        "agent.precision=bf16",
    ]


def run(overrides: list[str], minutes: float, workdir: Path) -> dict:
    """Train under `overrides` for `minutes` of wall clock (then stop the run), and read its metrics."""
    from robotrl.runtime.metrics import read_metrics

    command = [sys.executable, "-m", "robotrl.train", *overrides, f"hydra.run.dir={workdir}"]
    log = (workdir.parent / "train.log").open("w")
    launched = time.perf_counter()
    # cwd: beside the run, so that `-m` finds the installed robotrl, not the source tree's top package
    process = subprocess.Popen(command, cwd=workdir.parent, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    metrics = workdir / "metrics.csv"
    first_row_s = None
    try:
        while process.poll() is None and time.perf_counter() - launched < minutes * 60:
            if first_row_s is None and metrics.exists() and metrics.stat().st_size > 0:
                first_row_s = time.perf_counter() - launched
            time.sleep(1.0)
    finally:
        stop_process(process, timeout=60.0)
        log.close()
    if not metrics.exists():
        tail = (workdir.parent / "train.log").read_text()[-3000:]
        raise RuntimeError(f"robotrl-train wrote no metrics in {minutes} min:\n{tail}")
    series = read_metrics(metrics)
    wall = dict(series.get("eval/wall_s", []))
    curve = [[round(wall[step] / 60, 3), round(value, 4)] for step, value in series.get("eval/success", [])]
    reached = next((minute for minute, success in curve if success >= SUCCESS), None)

    def mean(key: str) -> float | None:
        values = [value for _, value in series.get(key, [])]
        return round(sum(values) / len(values), 1) if values else None

    return {
        "minutes_to_90": reached,
        "startup_s": None if first_row_s is None else round(first_row_s, 1),
        "env_steps_per_s": mean("time/env_steps_per_s"),
        "updates_per_s": mean("time/updates_per_s"),
        "curve": curve,
        "env_steps": max((step for step, _ in series.get("time/env_steps_per_s", [])), default=0),
    }


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--minutes", type=float, default=20.0, help="wall clock before the run is stopped")
        parser.add_argument("--backend", default="genesis", choices=("genesis", "mujoco_warp", "mujoco"))
        parser.add_argument("--num-envs", type=int, default=4096)
        parser.add_argument("--eval-every", type=int, default=None, help="env steps between evaluations")

    args = parse_args(__doc__, extra, overrides=True)
    import torch

    cuda = torch.cuda.is_available() and not args.quick
    backend, device = (args.backend, "cuda") if cuda else ("mujoco", "cpu")
    num_envs = args.num_envs if cuda else 8
    minutes = 0.6 if args.quick else args.minutes
    eval_every = args.eval_every or (50 * num_envs if cuda else 800)
    overrides = recipe(backend, device, num_envs, eval_every, quick=not cuda) + args.overrides
    figures: dict = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "backend": backend,
        "num_envs": num_envs,
        "minutes_limit": minutes,
        "overrides": overrides,
    }
    if cuda:  # the compiled update's one-off cost at the recipe's sizes, apart from the run
        obs_dim, act_dim = pick_cube_sizes()
        figures["compile_s"] = round(
            in_subprocess("sac_speed", f"b.robotrl_compile_s({obs_dim}, {act_dim}, 'bf16', 8192)", args.threads), 1
        )
    with tempfile.TemporaryDirectory() as tmp:
        figures.update(run(overrides, minutes, Path(tmp) / "run"))
    figures["goal_met"] = figures["minutes_to_90"] is not None and figures["minutes_to_90"] <= 10
    emit("gpu_train", figures, args.save)


def pick_cube_sizes() -> tuple[int, int]:
    """panda_pick_cube's flat observation size and action size (its MuJoCo env, one env)."""
    from robotrl.tasks import TASK_CONFIGS, make_env

    env = make_env(TASK_CONFIGS[TASK](name=TASK), num_envs=1)
    try:
        return sum(spec.shape[0] for spec in env.obs_spec.values()), env.action_dim
    finally:
        env.close()


if __name__ == "__main__":
    main()
