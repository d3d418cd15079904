"""Sample efficiency of the action-chunk critic against SAC, both robotrl agents run by this script with
the same settings apart from the agent.

Each agent trains for `--steps` env steps per seed; every `--eval-interval` steps a deterministic
evaluation (`--eval-episodes` episodes) measures the success rate. Per task, the success curves are
averaged over seeds and `steps_to_success` is the first evaluation step where the mean reaches
`--threshold` (80%). `<task>.steps_ratio` = chunk's steps / SAC's (goal: at most 0.5), and the headline
`steps_ratio` is the largest over the tasks. An agent that never reaches the threshold has
`steps_to_success` null; then `steps_ratio` is null if the chunk critic missed it, and an upper bound
(SAC's steps taken as `--steps`, flagged `sac_censored`) if only SAC did.

Full run: panda_pick_cube and panda_push, 3 seeds, 100k steps each (hours on 2 CPU cores).
--quick: panda_reach, 1 seed, 2k steps and small networks, to check that everything runs (about a minute);
at that size the threshold is usually not reached.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, parse_args


def success_curve(agent: str, task: str, seed: int, args, quick: bool) -> tuple[dict[int, float], float]:
    """{eval step: success rate} of one training run, and its wall time in seconds."""
    from robotrl.tasks import TASK_CONFIGS

    from robotrl.agents import ChunkConfig, SACConfig
    from robotrl.config import TrainConfig
    from robotrl.runtime.loop import train
    from robotrl.runtime.metrics import read_metrics

    size = {"actor_hidden": [64, 64], "critic_hidden": [64, 64], "batch_size": 64} if quick else {}
    if agent == "chunk":
        agent_cfg = ChunkConfig(chunk_len=args.chunk_len, execution=args.execution, **size)
    else:
        agent_cfg = SACConfig(**size)
    cfg = TrainConfig(
        agent=agent_cfg,
        task=TASK_CONFIGS[task](name=task),
        seed=seed,
        total_steps=args.steps,
        learning_starts=args.learning_starts,
        eval_interval=args.eval_interval,
        eval_episodes=args.eval_episodes,
        log_interval=args.eval_interval,
        checkpoint_interval=10**9,
        checkpoint_replay=False,
        video=False,
        progress=False,
        threads=args.threads,
    )
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp))
        series = read_metrics(Path(tmp) / "metrics.csv")["eval/success"]
    return dict(series), time.perf_counter() - start


def steps_to_success(curves: list[dict[int, float]], threshold: float) -> int | None:
    """The first eval step where the success rate averaged over seeds reaches `threshold`."""
    for step in sorted(set.intersection(*(set(c) for c in curves))):
        if sum(c[step] for c in curves) / len(curves) >= threshold:
            return step
    return None


def main() -> None:
    def extra(p):
        p.add_argument("--tasks", default="panda_pick_cube,panda_push")
        p.add_argument("--seeds", type=int, default=3)
        p.add_argument("--steps", type=int, default=100_000)
        p.add_argument("--learning-starts", type=int, default=5_000)
        p.add_argument("--eval-interval", type=int, default=5_000)
        p.add_argument("--eval-episodes", type=int, default=10)
        p.add_argument("--threshold", type=float, default=0.8)
        p.add_argument("--chunk-len", type=int, default=4)
        p.add_argument("--execution", default="open_loop")

    args = parse_args(__doc__, extra)
    tasks, seeds = args.tasks.split(","), args.seeds
    if args.quick:
        tasks, seeds = ["panda_reach"], 1
        args.steps, args.learning_starts, args.eval_interval, args.eval_episodes = 2_000, 300, 500, 3
    figures: dict = {
        "steps": args.steps,
        "seeds": seeds,
        "threshold": args.threshold,
        "chunk_len": args.chunk_len,
        "execution": args.execution,
    }
    ratios = []
    for task in tasks:
        result: dict = {}
        for agent in ("sac", "chunk"):
            runs = [success_curve(agent, task, seed, args, args.quick) for seed in range(1, seeds + 1)]
            curves = [curve for curve, _ in runs]
            final = [curve[max(curve)] for curve in curves]
            result[agent] = {
                "steps_to_success": steps_to_success(curves, args.threshold),
                "final_success": [round(s, 2) for s in final],
                "minutes": round(sum(seconds for _, seconds in runs) / 60, 2),
            }
        chunk_steps, sac_steps = result["chunk"]["steps_to_success"], result["sac"]["steps_to_success"]
        result["sac_censored"] = sac_steps is None
        ratio = None if chunk_steps is None else chunk_steps / (sac_steps or args.steps)
        result["steps_ratio"] = None if ratio is None else round(ratio, 3)
        ratios.append(ratio)
        figures[task] = result
    figures["steps_ratio"] = None if None in ratios else round(max(ratios), 3)
    emit("chunk_vs_sac", figures, args.save)


if __name__ == "__main__":
    main()
