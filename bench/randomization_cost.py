"""What physics randomization costs a training env: env steps/s of panda_pick_cube at 16 envs with the `default`
preset drawn at every reset, against the same env without it, measured side by side in one process; and a third
env that draws the same terms but at their nominal values, which separates the cost of randomizing (the draws, the
per-env models) from the cost of the physics drawn (dry joint friction adds a constraint per joint to MuJoCo's
solver).

    python bench/randomization_cost.py [--quick] [--genesis] [--save]

Random actions, one thread (torch and MuJoCo), 25 Hz control. The two envs take turns, one control step each, and
each side's figure is its own steps over its own time: this VM's speed drifts by a third within seconds, and only
turns that fine cancel it (blocks of 200 steps gave ratios from 0.82 to 1.08 on identical code). Every env resets
every 100 steps, all ten terms of the preset drawn each time. `--genesis` measures the same on the Genesis backend
(CPU), after its kernels compile.

Figures: `steps_per_s_nominal`, `steps_per_s_randomized`, `ratio` (randomized over nominal; goal >= 0.95),
`overhead_ratio` (the same terms at nominal values over nominal), and `genesis.*` the same where measured.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, parse_args

TASK, NUM_ENVS, WARMUP = "panda_pick_cube", 16, 20


def preset(name: str):
    """The randomization robotrl-train runs with `randomization=<name>`."""
    from common import train_config

    return train_config([f"task={TASK}", f"randomization={name}"]).randomization


def measure(backend: str, steps: int) -> dict:
    import torch
    from robotrl.tasks import TASK_CONFIGS, make_env

    from robotrl.runtime.assembly import add_randomization

    envs = {}
    randomized = preset("default")
    at_nominal = copy.deepcopy(randomized)
    for term in at_nominal.terms.values():  # every term drawn and written, each value the nominal one
        term.distribution, term.low = "uniform", 0.0 if term.operation == "add" else 1.0
        term.high = term.low
    for side, cfg in (("nominal", None), ("randomized", randomized), ("at_nominal", at_nominal)):
        env = make_env(TASK_CONFIGS[TASK](name=TASK, backend=backend), num_envs=NUM_ENVS)
        if cfg is not None:
            add_randomization(env, cfg, seed=0)
        env.reset(seed=0)
        envs[side] = env
    generator = torch.Generator().manual_seed(0)
    actions = torch.rand(steps + WARMUP, NUM_ENVS, envs["nominal"].action_dim, generator=generator) * 2 - 1
    seconds = dict.fromkeys(envs, 0.0)
    for i, action in enumerate(actions):
        for side, env in envs.items():
            start = time.perf_counter()
            env.step(action)
            if i >= WARMUP:
                seconds[side] += time.perf_counter() - start
    for env in envs.values():
        env.close()
    rate = {side: steps * NUM_ENVS / seconds[side] for side in envs}
    return {
        "steps_per_s_nominal": round(rate["nominal"], 1),
        "steps_per_s_randomized": round(rate["randomized"], 1),
        "ratio": round(rate["randomized"] / rate["nominal"], 4),
        "overhead_ratio": round(rate["at_nominal"] / rate["nominal"], 4),
        "control_steps": steps,
    }


def main() -> None:
    args = parse_args(
        __doc__,
        extra=lambda p: p.add_argument("--genesis", action="store_true", help="also measure the Genesis backend"),
    )
    import torch

    torch.set_num_threads(1)
    steps = 400 if args.quick else 3000
    figures = {"task": TASK, "num_envs": NUM_ENVS, "preset": "default", **measure("mujoco", steps)}
    if args.genesis:
        figures["genesis"] = measure("genesis", steps // 3)
    emit("randomization_cost", figures, args.save)


if __name__ == "__main__":
    main()
