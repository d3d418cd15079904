"""The fewest physics steps per control step at which each arm task's physics stays right, against the default 20.

    python bench/substeps.py [--quick] [--episodes 32] [--backend mujoco|genesis|mujoco_warp] [--save]

Every arm task steps its physics 20 times at 2 ms per 40 ms control step; MuJoCo Playground's Panda takes 4 per
control step. For each task with a scripted expert and each candidate count n (20, 10, 8, 5, 4, 2) the physics step
becomes 40 ms / n (`task.control_substeps=n task.physics_dt=0.04/n`: the policy's rate is kept) and the expert
drives `--episodes` batched envs through one episode each (tasks/expert_rollout.py). A setting stays right when
the physics does not diverge, the expert's success rate is within `SUCCESS_SLACK` of its rate at 20, and contacts
sink at most `PENETRATION_SLACK_M` deeper than at 20, on average over the control steps of each step's deepest
contact (sustained sinking; the single deepest contact of a run is a transient spike, reported beside it). MuJoCo
and MuJoCo Warp report contact distances; Genesis does not, so there success alone decides.

Figures, per task: `fewest_substeps` (the fewest candidate for which it and every larger candidate stay right),
each candidate's `success`, `mean_penetration_mm`, `max_penetration_mm` and `env_steps_per_s`, and `speedup` (env
steps/s at the fewest over at 20, same run). Comparing simulators, multiply env steps/s by the substeps each ran
(`physics_steps_per_s`). The references are the same tasks at 20 substeps in the same run. --quick: reach and pick,
8 episodes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, parse_args

CONTROL_PERIOD_S = 0.04
CANDIDATES = (20, 10, 8, 5, 4, 2)
SUCCESS_SLACK = 0.05  # of the expert's success rate at 20 substeps
PENETRATION_SLACK_M = 0.001  # deeper mean contact than at 20 substeps that still counts as right


def measure(name: str, backend: str, episodes: int) -> dict:
    from robotrl.tasks import TASK_CONFIGS
    from robotrl.tasks.expert_rollout import roll_out_expert

    rows = {}
    for substeps in CANDIDATES:
        cfg = TASK_CONFIGS[name](
            name=name, backend=backend, control_substeps=substeps, physics_dt=CONTROL_PERIOD_S / substeps
        )
        result = roll_out_expert(cfg, episodes)
        rows[substeps] = {
            "success": round(result.success_rate, 3),
            "mean_penetration_mm": _mm(result.mean_penetration_m),
            "max_penetration_mm": _mm(result.deepest_penetration_m),
            "diverged": result.diverged,
            "env_steps_per_s": round(result.env_steps_per_s, 1),
            "physics_steps_per_s": round(result.env_steps_per_s * substeps, 1),
        }
    reference = rows[CANDIDATES[0]]
    fewest = CANDIDATES[0]
    for substeps in CANDIDATES[1:]:  # in decreasing order: the first that fails ends the search
        if not stays_right(rows[substeps], reference):
            break
        fewest = substeps
    return {
        "fewest_substeps": fewest,
        "speedup": round(rows[fewest]["env_steps_per_s"] / reference["env_steps_per_s"], 2),
        "candidates": {str(k): v for k, v in rows.items()},
    }


def _mm(metres: float | None) -> float | None:
    return None if metres is None else round(metres * 1e3, 3)


def stays_right(row: dict, reference: dict) -> bool:
    if row["diverged"] or row["success"] < reference["success"] - SUCCESS_SLACK:
        return False
    if row["mean_penetration_mm"] is None or reference["mean_penetration_mm"] is None:
        return True
    return row["mean_penetration_mm"] <= reference["mean_penetration_mm"] + PENETRATION_SLACK_M * 1e3


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--episodes", type=int, default=32, help="batched envs, one expert episode each")
        parser.add_argument("--backend", default="mujoco", choices=("mujoco", "genesis", "mujoco_warp"))

    args = parse_args(__doc__, extra)
    import torch

    torch.set_num_threads(args.threads)
    from robotrl.tasks import ARM_TASKS

    names = ["panda_reach", "panda_pick_cube"] if args.quick else sorted(ARM_TASKS)
    episodes = 8 if args.quick else args.episodes
    figures: dict = {"backend": args.backend, "episodes": episodes, "control_period_s": CONTROL_PERIOD_S}
    figures["tasks"] = {name: measure(name, args.backend, episodes) for name in names}
    figures["fewest_substeps"] = {name: row["fewest_substeps"] for name, row in figures["tasks"].items()}
    emit("substeps", figures, args.save)


if __name__ == "__main__":
    main()
