"""SAC exploring with gSDE against SAC with Gaussian noise, at equal env steps, both run by this script.

For each env and seed SAC trains twice, agent.exploration=gaussian and agent.exploration=gsde
(agent.sde_sample_freq=8), everything else equal; HalfCheetah-v5 with the locomotion settings (LOCOMOTION in
bench/common.py, as bench/sac_returns.py). Each run is its own process on one thread, `--jobs` side by side.
Figures per env and exploration (means over seeds):
  action_sq_diff: mean squared difference between consecutive exploration actions during training
      (the policy's actions after warm-up, within episodes; robotrl/runtime/smoothness.py)
  action_high_freq_share: share of that action power above 0.25 cycles per control step
  success / return: the final deterministic evaluation's success rate (panda_reach) or return
      (HalfCheetah-v5); `perf_metric` names the one perf_ratio compares
  eval_action_sq_diff: the same difference for the final deterministic policy (no noise at all): the floor
      that the policy's own step-to-step changes set under any exploration noise
Per env: smoothness_ratio = gsde action_sq_diff / gaussian action_sq_diff, and perf_ratio = 1 + (gsde's
- gaussian's) / |gaussian's| of that figure (gsde / gaussian when the Gaussian's is positive). panda_reach is
judged on success, or on return where the Gaussian run has no success at all (short runs).
Top level: smoothness_ratio is the largest over envs, perf_ratio the smallest.
Goal: smoothness_ratio <= 0.33 with perf_ratio >= 0.95.
`--smoothness-weight W` gives both arms agent.smoothness_weight=W (the actor's temporal smoothness term,
CAPS): exploration noise cannot smooth a policy whose own actions switch every step, as HalfCheetah's do.
`--gsde-set KEY=VALUE ...` changes the gSDE arm alone (a variant against the same Gaussian runs), e.g. SB3's
SAC settings: agent.clip_mean=2 agent.learn_features=true agent.use_expln=false agent.log_std_init=-3.
Full run: panda_reach 20k env steps, HalfCheetah-v5 100k, 2 seeds (about an hour on 2 cores with --jobs 2).
--quick: 1.6k steps on each env, 1 seed, small networks: the same keys within about a minute.
"""

from __future__ import annotations

import math
import multiprocessing
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import LOCOMOTION, emit, parse_args, train_sac

EXPLORATIONS = ("gaussian", "gsde")
SMOOTHNESS_KEYS = ("action_sq_diff", "action_high_freq_share")


def train_once(
    env: str,
    exploration: str,
    steps: int,
    seed: int,
    sample_freq: int,
    smoothness_weight: float,
    quick: bool,
    extra: tuple[str, ...] = (),
) -> dict:
    """One SAC run on one thread (its own process under --jobs); its training-time action smoothness and
    final evaluation."""
    from robotrl.runtime.metrics import read_metrics

    if env == "panda_reach":
        task = ["task=panda_reach", f"learning_starts={500 if quick else min(5_000, steps // 10)}"]
    elif quick:
        task = ["task=gym", f"task.env_id={env}", "task.max_episode_steps=200", "learning_starts=500"]
    else:
        task = ["task=gym", f"task.env_id={env}", *LOCOMOTION]
    overrides = [
        *task,
        f"agent.exploration={exploration}",
        f"agent.sde_sample_freq={sample_freq}",
        f"agent.smoothness_weight={smoothness_weight}",
        *(["agent.actor_hidden=[64,64]", "agent.critic_hidden=[64,64]", "agent.batch_size=64"] if quick else []),
        *extra,
        f"seed={seed}",
        f"total_steps={steps}",
        f"log_interval={200 if quick else 1_000}",
        "eval_interval=1000000000",
        f"eval_episodes={2 if quick else 10}",
        "checkpoint_replay=false",
        "threads=1",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        summary = train_sac(Path(tmp), *overrides)
        series = read_metrics(Path(tmp) / "metrics.csv")
    out = {
        "return": summary["eval/return"],
        "success": summary.get("eval/success"),
        "eval_action_sq_diff": summary.get("eval/action_sq_diff"),
    }
    for key in SMOOTHNESS_KEYS:
        values = [v for _, v in series.get(f"train/{key}", [])]
        out[key] = sum(values) / len(values) if values else math.nan
    return out


def _mean(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return sum(values) / len(values) if values else None


def perf_ratio(gsde: float, gaussian: float) -> float:
    """1 + (gsde - gaussian) / |gaussian|: gsde / gaussian for positive figures, sign-safe for returns < 0."""
    if gaussian == 0:
        return 1.0 if gsde == 0 else math.copysign(math.inf, gsde)
    return 1.0 + (gsde - gaussian) / abs(gaussian)


def compare(env: str, runs: dict[str, list[dict]], steps: int) -> dict:
    """Figures of one env from its runs {exploration: [one result per seed]}."""
    figures: dict = {"steps": steps}
    for exploration, results in runs.items():
        figures[exploration] = {
            key: None if _mean(results, key) is None else round(_mean(results, key), 4)
            for key in ("return", "success", *SMOOTHNESS_KEYS, "eval_action_sq_diff")
        }
    gauss, gsde = figures["gaussian"], figures["gsde"]
    metric = "success" if gauss["success"] else "return"
    figures["perf_metric"] = metric
    figures["perf_ratio"] = round(perf_ratio(gsde[metric], gauss[metric]), 3)
    figures["smoothness_ratio"] = round(gsde["action_sq_diff"] / gauss["action_sq_diff"], 3)
    figures["high_freq_ratio"] = round(gsde["action_high_freq_share"] / gauss["action_high_freq_share"], 3)
    return figures


def main() -> None:
    def extra(p):
        p.add_argument("--seeds", type=int, default=2)
        p.add_argument("--envs", default="panda_reach,HalfCheetah-v5")
        p.add_argument("--steps", default="panda_reach=20000,HalfCheetah-v5=100000", help="env=steps,...")
        p.add_argument("--sde-sample-freq", type=int, default=8)
        p.add_argument(
            "--smoothness-weight",
            type=float,
            default=0.0,
            help="both arms' agent.smoothness_weight (the actor's temporal smoothness term; 0: none)",
        )
        p.add_argument(
            "--gsde-set",
            nargs="*",
            default=[],
            metavar="KEY=VALUE",
            help="Hydra overrides for the gSDE arm alone (agent.clip_mean=2 agent.log_std_init=-3 ...)",
        )
        p.add_argument("--jobs", type=int, default=2, help="runs side by side, one thread each")

    args = parse_args(__doc__, extra)
    envs = args.envs.split(",")
    steps = {k: int(v) for k, v in (item.split("=") for item in args.steps.split(","))}
    seeds = args.seeds
    if args.quick:
        steps, seeds = dict.fromkeys(envs, 1_600), 1
    missing = [env for env in envs if env not in steps]
    if missing:
        raise SystemExit(f"--steps names no step count for {', '.join(missing)}")
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be >= 1, got {args.jobs}")
    not_overrides = [item for item in args.gsde_set if "=" not in item]
    if not_overrides:
        raise SystemExit(f"--gsde-set takes KEY=VALUE overrides, got {', '.join(not_overrides)}")
    figures: dict = {
        "seeds": seeds,
        "sde_sample_freq": args.sde_sample_freq,
        "smoothness_weight": args.smoothness_weight,
        "jobs": args.jobs,
        **({"gsde_set": args.gsde_set} if args.gsde_set else {}),
    }
    # spawn: each run starts a fresh interpreter (no torch thread pool or MuJoCo context inherited by fork)
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        runs = {
            (env, e, s): pool.submit(
                train_once,
                env,
                e,
                steps[env],
                s,
                args.sde_sample_freq,
                args.smoothness_weight,
                args.quick,
                tuple(args.gsde_set) if e == "gsde" else (),
            )
            for env in envs
            for e in EXPLORATIONS
            for s in range(1, seeds + 1)
        }
        for env in envs:
            results = {e: [runs[env, e, s].result() for s in range(1, seeds + 1)] for e in EXPLORATIONS}
            figures[env] = compare(env, results, steps[env])
    figures["smoothness_ratio"] = max(figures[env]["smoothness_ratio"] for env in envs)
    figures["perf_ratio"] = min(figures[env]["perf_ratio"] for env in envs)
    emit("gsde_smoothness", figures, args.save)


if __name__ == "__main__":
    main()
