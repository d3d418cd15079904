"""The sim-to-sim transfer matrix (issue 7): a policy trained with each backend, each evaluated on both.

`--task panda_reach` (default): the default job (`robotrl-train`, SAC on panda_reach) with `backend=mujoco`
(1 env) or `backend=genesis` (`--genesis-envs` batched envs, the update-to-data ratio per env step as always),
one after the other, for the same env steps and seed. Reaching has no contact: it checks the arm, its
controller and the observation pipeline.
`--task panda_pick_cube`: contact-rich. Each backend trains the HIL run of bench/hil_pick.py (sparse reward,
10 scripted demonstrations recorded on MuJoCo, the scripted operator, BC term, 3-step returns) in its own
process, side by side (one core each), for `--steps` (default 10k: the MuJoCo HIL run passes 90% at ~6k).
Each run's final checkpoint is then evaluated with `robotrl-eval backend=<each>` (deterministic,
`--episodes` seeded episodes, the same seeds on both backends).

Figures:
- `transfer`: success rate, `transfer[trained_on][evaluated_on]`, and `transfer_return` the mean return;
- `transfer_ratio`: cross-backend success over same-backend success for each trained policy (the reference is the
  policy on its own simulator, measured in the same run); `min_transfer_ratio` the smaller of the two. A policy
  that only works on the simulator it was trained on shows up here first: the backends' contact and actuator
  models differ (Genesis's position actuators and joint damping are matched to the MJCF, not identical).
`--quick` trains 1500 steps (reach only) and evaluates 5 episodes: the figures are then not meaningful; it
checks the pipeline (about 2.5 minutes on 2 cores: four Genesis scene builds). Needs genesis-world
(pip install -e ".[genesis]").
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, parse_args, record_scripted_demos, train_sac

BACKENDS = ("mujoco", "genesis")


def evaluate_on(run_dir: Path, backend: str, episodes: int) -> dict:
    from robotrl.config import EvalConfig
    from robotrl.eval import run

    out = run_dir / f"eval_{backend}"
    out.mkdir(parents=True, exist_ok=True)
    return run(EvalConfig(run=str(run_dir), episodes=episodes, video=False, backend=backend), out)


def train_reach(root: Path, steps: int, seed: int, genesis_envs: int) -> dict[str, float]:
    """Train SAC on panda_reach with each backend into root/<backend>; seconds each took."""
    envs = {"mujoco": 1, "genesis": genesis_envs}
    seconds = {}
    for backend in BACKENDS:
        start = time.monotonic()
        train_sac(
            root / backend,
            f"backend={backend}",
            f"num_envs={envs[backend]}",
            f"total_steps={steps}",
            f"seed={seed}",
            f"eval_interval={steps}",
            "eval_episodes=5",
        )
        seconds[backend] = round(time.monotonic() - start, 1)
    return seconds


def train_pick(root: Path, steps: int, seed: int) -> dict[str, float]:
    """The HIL run of bench/hil_pick.py with each backend, side by side, into root/<backend>."""
    from hil_pick import HIL, LEARNER, TASK, start_run

    demos = root / "demos"
    record_scripted_demos("panda_pick_cube", demos, 10, seed, reward="sparse")
    common = [*TASK, *LEARNER, f"seed={seed}", f"total_steps={steps}", "learning_starts=1000", f"eval_interval={steps}"]
    common += ["eval_episodes=5", f"checkpoint_interval={steps}", "progress=false", "video=false", "threads=1"]
    common += [f"hil.demos=[{demos}]", "hil.operator=scripted", *(f"{k}={v}" for k, v in HIL.items())]
    start = time.monotonic()
    runs = {b: start_run(root / b, [*common, f"backend={b}"], root / f"{b}.log") for b in BACKENDS}
    seconds = {}
    for backend, proc in runs.items():
        if proc.wait() != 0:
            raise RuntimeError(f"the {backend} run failed:\n{(root / f'{backend}.log').read_text()[-3000:]}")
        seconds[backend] = round(time.monotonic() - start, 1)
    return seconds


def main() -> None:
    def extra(parser):
        parser.add_argument("--task", choices=("panda_reach", "panda_pick_cube"), default="panda_reach")
        parser.add_argument("--steps", type=int, default=None, help="env steps of each training run")
        parser.add_argument("--episodes", type=int, default=50, help="evaluation episodes per cell")
        parser.add_argument("--genesis-envs", type=int, default=16, help="batched envs of the Genesis training run")
        parser.add_argument("--seed", type=int, default=1)

    args = parse_args(__doc__, extra)
    try:
        import genesis  # noqa: F401
    except ImportError as error:
        emit("genesis_transfer", {"error": f"genesis-world is not installed ({error})"}, False)
        sys.exit(1)
    if args.quick and args.task != "panda_reach":
        raise SystemExit("--quick runs panda_reach only")
    pick = args.task == "panda_pick_cube"
    steps = 1500 if args.quick else args.steps or (10_000 if pick else 15_000)
    episodes = 5 if args.quick else args.episodes
    figures: dict = {"task": args.task, "steps": steps, "episodes": episodes, "seed": args.seed}
    figures["num_envs"] = {"mujoco": 1, "genesis": 1 if pick else args.genesis_envs}
    if pick:
        figures["training"] = "HIL as bench/hil_pick.py (10 demos recorded on MuJoCo, scripted operator)"
    transfer: dict = {}
    returns: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if pick:
            train_seconds = train_pick(root, steps, args.seed)
        else:
            train_seconds = train_reach(root, steps, args.seed, args.genesis_envs)
        for trained_on in BACKENDS:
            transfer[trained_on], returns[trained_on] = {}, {}
            for evaluated_on in BACKENDS:
                result = evaluate_on(root / trained_on, evaluated_on, episodes)
                transfer[trained_on][evaluated_on] = round(float(result["success"]), 3)
                returns[trained_on][evaluated_on] = round(float(result["return"]), 2)
                print(json.dumps({"trained_on": trained_on, "evaluated_on": evaluated_on, **result}), flush=True)
    ratios = {}
    for trained_on in BACKENDS:
        other = next(b for b in BACKENDS if b != trained_on)
        same = transfer[trained_on][trained_on]
        ratios[trained_on] = round(transfer[trained_on][other] / same, 3) if same > 0 else None
    figures.update(
        transfer=transfer,
        transfer_return=returns,
        transfer_ratio=ratios,
        min_transfer_ratio=min((r for r in ratios.values() if r is not None), default=None),
        train_seconds=train_seconds,
        quick=args.quick,
    )
    emit("genesis_transfer", figures, args.save)


if __name__ == "__main__":
    main()
