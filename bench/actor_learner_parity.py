"""The actor/learner split against the single-process loop at equal env steps: the same task, agent defaults and
seed trained by robotrl-train, and by robotrl-learner fed by one robotrl-actor, each final policy evaluated by
robotrl-eval on the same fresh episodes.

    python bench/actor_learner_parity.py [--quick] [--task panda_reach] [--steps 8000] [--seeds 2]
                                         [--max-steps-ahead 500] [--eval-episodes 50] [--unpaced] [--save]

Arms: `single` (robotrl-train), `paced` (the split, the actor run with max_steps_ahead so the learner's utd_ratio
holds) and, with --unpaced, `unpaced` (the split as an actor in simulation runs without it: the learner's updates
trail the steps). Per arm: final success per seed (or return on tasks without success), the updates the trainer
made, wall-clock minutes. `success_ratio`: the paced split's mean final success over robotrl-train's (goal >= 0.95:
the split learns as well as the loop; `return_ratio` on tasks without success); `updates_ratio`: the paced
learner's updates over robotrl-train's (about 1: the same updates per env step). Both sides run one torch thread
each.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, emit, parse_args, run_logged


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def updates_made(run_dir: Path) -> int:
    """The updates the run's newest checkpoint holds (robotrl-train's and robotrl-learner's alike)."""
    from robotrl.runtime.checkpoint import latest_checkpoint

    state = json.loads((latest_checkpoint(run_dir / "checkpoints") / "state.json").read_text())
    return int(state["counters"]["updates"])


def final_eval(run_dir: Path, episodes: int, seed: int) -> dict:
    """robotrl-eval's figures for the run's final policy (deterministic, `episodes` fresh episodes)."""
    from robotrl.config import EvalConfig
    from robotrl.eval import run

    out = run_dir.parent / f"{run_dir.name}_eval"
    out.mkdir(parents=True, exist_ok=True)
    return run(EvalConfig(run=str(run_dir), episodes=episodes, seed=seed + 1000, video=False), out)


def single(args, seed: int, workdir: Path) -> Path:
    run_dir = workdir / f"single_s{seed}"
    cmd = [sys.executable, "-m", "robotrl.train", f"task={args.task}", f"seed={seed}", f"total_steps={args.steps}"]
    cmd += ["eval_interval=1000000000", "eval_episodes=1", "checkpoint_interval=1000000000", "video=false"]
    cmd += ["progress=false", "threads=1"]
    run_logged([*cmd, f"hydra.run.dir={run_dir}"], workdir / f"single_s{seed}.log")
    return run_dir


def split(args, seed: int, workdir: Path, max_steps_ahead: int, name: str) -> Path:
    """robotrl-learner with total_steps, one robotrl-actor (it stops once the learner has them), both to the end."""
    run_dir, port = workdir / f"{name}_s{seed}", free_port()
    learner_cmd = [sys.executable, "-m", "robotrl.learner", f"task={args.task}", f"seed={seed}", "device=cpu"]
    learner_cmd += [f"total_steps={args.steps}", f"server.port={port}", "threads=1", f"hydra.run.dir={run_dir}"]
    actor_cmd = [sys.executable, "-m", "robotrl.actor", f"task={args.task}", f"seed={seed}", "threads=1"]
    actor_cmd += [f"learner.address=127.0.0.1:{port}", f"max_steps_ahead={max_steps_ahead}", "connect_timeout_s=120"]
    env = dict(os.environ, MUJOCO_GL="egl", OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="1")
    actor_cmd.append(f"hydra.run.dir={workdir / f'{name}_s{seed}_actor'}")
    with (workdir / f"{name}_s{seed}_learner.log").open("w") as log:
        learner = subprocess.Popen(learner_cmd, cwd=REPO, env=env, stdout=log, stderr=log)
        try:
            run_logged(actor_cmd, workdir / f"{name}_s{seed}_actor.log")
            if learner.wait(timeout=600) != 0:
                raise RuntimeError(f"robotrl-learner failed ({learner.returncode}); log {log.name}")
        finally:
            if learner.poll() is None:
                learner.kill()
    return run_dir


def main() -> None:
    def extra(p):
        p.add_argument("--task", default="panda_reach")
        p.add_argument("--steps", type=int, default=8000, help="env steps per run (all arms)")
        p.add_argument("--seeds", type=int, default=2)
        p.add_argument("--max-steps-ahead", type=int, default=500, help="the paced actor's max_steps_ahead")
        p.add_argument("--eval-episodes", type=int, default=50)
        p.add_argument("--unpaced", action="store_true", help="also run the split with an unpaced actor")

    args = parse_args(__doc__, extra)
    if args.quick:
        args.steps, args.seeds, args.eval_episodes = 2000, 1, 5
    if args.steps < 1 or args.seeds < 1 or args.eval_episodes < 1 or args.max_steps_ahead < 50:
        raise SystemExit(
            f"need --steps, --seeds, --eval-episodes >= 1 and --max-steps-ahead >= 50 (one actor batch); got "
            f"{args.steps}, {args.seeds}, {args.eval_episodes}, {args.max_steps_ahead}"
        )
    arms = {"single": None, "paced": args.max_steps_ahead, **({"unpaced": 0} if args.unpaced else {})}
    figures: dict = {"task": args.task, "steps": args.steps, "seeds": args.seeds, "eval_episodes": args.eval_episodes}
    figures["max_steps_ahead"] = args.max_steps_ahead
    with tempfile.TemporaryDirectory(prefix="parity_") as tmp:
        workdir = Path(tmp)
        for name, ahead in arms.items():
            results, updates, started = [], [], time.perf_counter()
            for seed in range(1, args.seeds + 1):
                run_dir = single(args, seed, workdir) if ahead is None else split(args, seed, workdir, ahead, name)
                results.append(final_eval(run_dir, args.eval_episodes, seed))
                updates.append(updates_made(run_dir))
            metric = "success" if results[0].get("success") is not None else "return"
            figures[name] = {
                metric: [round(r[metric], 3) for r in results],
                "updates": updates,
                "minutes": round((time.perf_counter() - started) / 60, 2),
            }
    figures["metric"] = metric
    mean = {name: sum(figures[name][metric]) / args.seeds for name in arms}
    figures[f"{metric}_ratio"] = round(mean["paced"] / mean["single"], 3) if mean["single"] else None
    figures["updates_ratio"] = round(sum(figures["paced"]["updates"]) / sum(figures["single"]["updates"]), 3)
    emit("actor_learner_parity", figures, args.save)


if __name__ == "__main__":
    main()
