"""Env steps/s of panda_pick_cube on the MuJoCo backend and on Genesis (issue 7), and SAC's wall-clock to 90% success
on panda_reach with each.

Figures (state observations, uniform random actions, 25 Hz control = 20 physics steps per env step):
- `mujoco_steps_per_s`: the MuJoCo backend, `1` env, and `threaded_<N>`: N envs batched, stepped by
  `task.sim_threads` threads (`mujoco_sim_threads`, one per core);
- `genesis_cpu_steps_per_s`: Genesis's CPU backend at num_envs 1, 16, 64, 256 (measured in a child process that
  sees no GPU); `genesis_cuda_steps_per_s`: Genesis on CUDA at 1024 to 32768 envs, null without a GPU;
- `genesis_cpu_build_s`: scene build seconds per size (the first of a process loads kernels from ~/.cache, or
  compiles them, about 45 s);
- `best_cpu_ratio_vs_mujoco`: Genesis's best CPU figure over the MuJoCo backend's best (goal >= 5);
- `best_cuda_steps_per_s`: Genesis's best CUDA figure (goal >= 200,000), null without a GPU;
- `wallclock_ratio_reach`: seconds for SAC (the default job) to first reach 90% evaluation success on panda_reach
  with MuJoCo (1 env) over seconds with Genesis batched (`--reach-envs`, 64), updates per env step as always
  (goal > 1), with `reach_seconds` and `reach_env_steps` of each side. Only in the full run (a few minutes per side;
  null with --quick or --skip-reach).
Measured 2026-11-23 on 2 CPU cores, no GPU (full run, 8 min): MuJoCo 1585 env-steps/s (1 env), 7486 (64 envs,
2 threads); Genesis CPU 210 / 1829 / 3001 / 3337 at 1 / 16 / 64 / 256 envs: best_cpu_ratio_vs_mujoco 0.45;
wallclock_ratio_reach 0.71 (MuJoCo 66 s, Genesis with 64 envs 93 s: updates per env step dominate either way).
Measured 2026-11-24 on an H100 (--cuda-only --skip-reach): Genesis CUDA 36260 / 115299 / 176388 / 248438 / 312126
env-steps/s at 1024 / 4096 / 8192 / 16384 / 32768 envs: best_cuda_steps_per_s 312k (goal 200k). Physics alone (20
scene.step() per env step) gave 241k / 336k / 385k at 8192 / 16384 / 32768; before the task's math moved to the
simulator's device the whole step gave 119k / 161k / 185k there.
Genesis figures are null (with `genesis_error`) where genesis-world is not installed (pip install -e ".[genesis]").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, parse_args, train_sac

TASK = "panda_pick_cube"
CPU_SIZES = (1, 16, 64, 256)
CUDA_SIZES = (1024, 4096, 8192, 16384, 32768)


def steps_per_s(backend: str, num_envs: int, seconds: float, sim_threads: int = 1) -> tuple[float, float]:
    """(env steps/s over `seconds` of stepping after a warm-up, including the task's own per-step work; build s)."""
    import torch
    from robotrl.tasks import TASK_CONFIGS, make_env

    built = time.perf_counter()
    env = make_env(TASK_CONFIGS[TASK](name=TASK, backend=backend, sim_threads=sim_threads), num_envs=num_envs)
    built = time.perf_counter() - built
    env.reset(seed=0)
    generator = torch.Generator().manual_seed(0)

    def act():
        return torch.rand(num_envs, env.action_dim, generator=generator) * 2 - 1

    for _ in range(3):
        env.step(act())
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(act())
        steps += 1
    rate = steps * num_envs / (time.perf_counter() - start)
    env.close()
    return rate, built


def worker(sizes: list[int], seconds: float) -> None:
    """Child process: Genesis figures on whatever device it sees, one JSON line."""
    import torch

    torch.set_num_threads(1)
    from robotrl.tasks.genesis_backend import import_genesis

    gs = import_genesis()
    out: dict = {"device": str(gs.device), "rates": {}, "build_s": {}}
    for n in sizes:
        try:
            rate, built = steps_per_s("genesis", n, seconds)
            out["rates"][str(n)], out["build_s"][str(n)] = round(rate, 1), round(built, 1)
        except MemoryError as err:  # robotrl's num_envs check: the device cannot hold n envs
            out["rates"][str(n)] = None
            out.setdefault("skipped", {})[str(n)] = str(err)
        print(json.dumps(out), flush=True)


def genesis_figures(sizes: tuple[int, ...], seconds: float, cuda: bool, timeout: float) -> dict:
    env = dict(os.environ)
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the backend picks CUDA whenever torch sees a GPU
    args = [sys.executable, __file__, "--worker", "--sizes", ",".join(map(str, sizes)), "--seconds", str(seconds)]
    try:
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        lines = [line for line in out.splitlines() if line.startswith("{")]
        return {**(json.loads(lines[-1]) if lines else {}), "error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {**(json.loads(lines[-1]) if lines else {}), "error": tail[0][-300:]}
    return json.loads(lines[-1])


def seconds_to_reach(backend: str, num_envs: int, total_steps: int, work_dir: Path) -> tuple[float | None, int | None]:
    """(wall-clock seconds, training and its evaluations, until SAC's evaluation success first reaches 0.9; the env
    step of that evaluation), (None, None) where it does not within `total_steps`."""
    from robotrl.runtime.metrics import read_metrics

    run_dir = work_dir / backend
    train_sac(
        run_dir,
        f"backend={backend}",
        f"num_envs={num_envs}",
        f"total_steps={total_steps}",
        "eval_interval=1000",
        "eval_episodes=10",
    )
    series = read_metrics(run_dir / "metrics.csv")
    walls = dict(series["eval/wall_s"])
    return next(((walls[step], int(step)) for step, value in series["eval/success"] if value >= 0.9), (None, None))


def main() -> None:
    if "--worker" in sys.argv:
        sizes = [int(v) for v in sys.argv[sys.argv.index("--sizes") + 1].split(",")]
        worker(sizes, float(sys.argv[sys.argv.index("--seconds") + 1]))
        return

    def extra(parser):
        parser.add_argument("--skip-reach", action="store_true", help="leave wallclock_ratio_reach out (null)")
        parser.add_argument("--reach-envs", type=int, default=64, help="Genesis envs for the panda_reach run")
        parser.add_argument("--reach-steps", type=int, default=20_000, help="env-step cap of each panda_reach run")
        parser.add_argument("--cuda-only", action="store_true", help="skip Genesis's CPU figures (GPU machines)")

    args = parse_args(__doc__, extra)
    import torch

    torch.set_num_threads(1)
    seconds = 2.0 if args.quick else 6.0
    sim_threads = max(1, min(os.cpu_count() or 1, 16))
    batch = 64
    figures: dict = {"task": TASK, "seconds_per_figure": seconds, "cpu_cores": os.cpu_count()}
    mujoco = {
        "1": round(steps_per_s("mujoco", 1, seconds)[0], 1),
        f"threaded_{batch}": round(steps_per_s("mujoco", batch, seconds, sim_threads)[0], 1),
    }
    figures["mujoco_steps_per_s"] = mujoco
    figures["mujoco_sim_threads"] = sim_threads

    cpu = {} if args.cuda_only else genesis_figures(CPU_SIZES, seconds, cuda=False, timeout=45 if args.quick else 300)
    figures["genesis_cpu_steps_per_s"] = cpu.get("rates")
    figures["genesis_cpu_build_s"] = cpu.get("build_s")  # the first: kernels loaded from the cache (or compiled)
    if "error" in cpu:
        figures["genesis_error"] = cpu["error"]
    cpu_rates = [v for v in (cpu.get("rates") or {}).values() if v]
    figures["best_cpu_ratio_vs_mujoco"] = round(max(cpu_rates) / max(mujoco.values()), 2) if cpu_rates else None

    figures["genesis_cuda_steps_per_s"] = None
    figures["best_cuda_steps_per_s"] = None
    if torch.cuda.is_available() and (cpu_rates or args.cuda_only):
        sizes = CUDA_SIZES[:1] if args.quick else CUDA_SIZES
        gpu = genesis_figures(sizes, seconds, cuda=True, timeout=120 if args.quick else 600)
        figures["genesis_cuda_steps_per_s"] = gpu.get("rates")
        figures["genesis_cuda_device"] = torch.cuda.get_device_name(0)
        if "error" in gpu:
            figures["genesis_cuda_error"] = gpu["error"]
        gpu_rates = [v for v in (gpu.get("rates") or {}).values() if v]
        figures["best_cuda_steps_per_s"] = max(gpu_rates) if gpu_rates else None

    figures["wallclock_ratio_reach"] = None
    if not (args.quick or args.skip_reach) and (cpu_rates or figures["best_cuda_steps_per_s"]):
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            mujoco_s, mujoco_step = seconds_to_reach("mujoco", 1, args.reach_steps, Path(tmp))
            genesis_s, genesis_step = seconds_to_reach("genesis", args.reach_envs, args.reach_steps, Path(tmp))
        figures["reach_seconds"] = {"mujoco_1": mujoco_s, f"genesis_{args.reach_envs}": genesis_s}
        figures["reach_env_steps"] = {"mujoco_1": mujoco_step, f"genesis_{args.reach_envs}": genesis_step}
        if mujoco_s is not None and genesis_s is not None:
            figures["wallclock_ratio_reach"] = round(mujoco_s / genesis_s, 2)
    elif args.quick:
        figures["wallclock_ratio_reach_note"] = "full run only"
    else:
        figures["wallclock_ratio_reach_note"] = "skipped (--skip-reach)" if args.skip_reach else "no genesis"
    emit("genesis_speed", figures, args.save)


if __name__ == "__main__":
    main()
