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
  noise_sq_diff: the same difference for the exploration noise itself, the final policy's exploring action
      minus its deterministic action on the same observation, over NOISE_STEPS env steps of exploring with it:
      what gSDE changes (HalfCheetah's gait switches fast, so the action's own figure measures the gait)
Per env: smoothness_ratio = gsde action_sq_diff / gaussian action_sq_diff, noise_smoothness_ratio the same of
noise_sq_diff, and perf_ratio = 1 + (gsde's
- gaussian's) / |gaussian's| of that figure (gsde / gaussian when the Gaussian's is positive). panda_reach is
judged on success, or on return where the Gaussian run has no success at all (short runs).
Top level: smoothness_ratio and noise_smoothness_ratio are the largest over envs, perf_ratio the smallest.
Goal: smoothness_ratio <= 0.33 with perf_ratio >= 0.95.

    python bench/gsde_smoothness.py [--quick] [--envs panda_reach,HalfCheetah-v5]
                                    [--steps panda_reach=20000,HalfCheetah-v5=100000] [--seeds 2] [--jobs 2]
                                    [--save] [OVERRIDE ...] [--gsde OVERRIDE ...] [--gaussian OVERRIDE ...]

Agent settings are Hydra overrides, as robotrl-train takes them, winning over the bench's (a later one over an
earlier one of the same key): positional ones reach both arms, e.g. `agent.smoothness_weight=10` (the actor's
temporal smoothness term, CAPS: exploration noise cannot smooth a policy whose own actions switch every step,
as HalfCheetah's do) or `agent.sde_sample_freq=4`; `--gsde OVERRIDE` (repeatable) the gSDE arm alone (a variant
against the same Gaussian runs), e.g. SB3's SAC settings: `--gsde agent.clip_mean=2 --gsde agent.learn_features=true
--gsde agent.use_expln=false --gsde agent.log_std_init=-3`; `--gaussian OVERRIDE` the Gaussian arm alone.
agent.exploration is what the arms compare, and the task, seed and steps are the bench's options: overriding
them exits. Every run's overrides are composed before any run starts, so an unknown key or a bad value fails
naming it. The JSON line records `sde_sample_freq` and `smoothness_weight` as the composed configs hold them
(`{"gaussian": ..., "gsde": ...}` where the arms differ), and the overrides given (`overrides`, `gsde_set`,
`gaussian_set`).
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
from common import LOCOMOTION, emit, merge_overrides, parse_args, refuse_keys, train_config, train_sac

EXPLORATIONS = ("gaussian", "gsde")
SMOOTHNESS_KEYS = ("action_sq_diff", "action_high_freq_share")
NOISE_STEPS = 2_000  # env steps of exploring with the final policy, for noise_sq_diff
QUICK_SIZE = ["agent.actor_hidden=[64,64]", "agent.critic_hidden=[64,64]", "agent.batch_size=64"]
# What the arms compare and the bench's own options set: an override of one of these keys exits naming it.
BENCH_KEYS = {
    "agent": "SAC in both arms",
    "agent.exploration": "what the arms compare",
    "task": "--envs",
    "task.env_id": "--envs",
    "seed": "--seeds",
    "total_steps": "--steps",
}


def run_overrides(env: str, exploration: str, steps: int, seed: int, quick: bool, given: list[str]) -> list[str]:
    """One run's overrides, one per key: the env's and the bench's settings, then `given` (the overrides for every
    run and the arm's own, each later one winning), then the arm's exploration, the seed and the steps."""
    if env == "panda_reach":
        task = ["task=panda_reach", f"learning_starts={500 if quick else min(5_000, steps // 10)}"]
    elif quick:
        task = ["task=gym", f"task.env_id={env}", "task.max_episode_steps=200", "learning_starts=500"]
    else:
        task = ["task=gym", f"task.env_id={env}", *LOCOMOTION]
    defaults = [
        *task,
        *(QUICK_SIZE if quick else []),
        f"log_interval={200 if quick else 1_000}",
        "eval_interval=1000000000",
        f"eval_episodes={2 if quick else 10}",
        "checkpoint_replay=false",
        "threads=1",
    ]
    return merge_overrides(
        defaults, given, [f"agent.exploration={exploration}", f"seed={seed}", f"total_steps={steps}"]
    )


def noise_sq_diff(run_dir: Path, steps: int, seed: int) -> float:
    """Mean squared step-to-step change of the exploration noise of `run_dir`'s final policy (its exploring action
    minus its deterministic action on the same observation), over `steps` env steps of exploring, within
    episodes; gSDE's noise matrices held and resampled on the policy's own clock, as in training."""
    import torch

    from robotrl.agents import make_agent
    from robotrl.runtime.assembly import make_training_env
    from robotrl.runtime.checkpoint import latest_checkpoint, load_checkpoint
    from robotrl.runtime.run_config import load_run_config

    cfg = load_run_config(run_dir)
    env = make_training_env(cfg, num_envs=1)
    try:
        agent = make_agent(cfg.agent, env.obs_spec, env.action_dim, torch.device("cpu"))
        load_checkpoint(latest_checkpoint(run_dir / "checkpoints"), agent, replay=None, restore_rng=False)
        torch.manual_seed(seed)
        agent.reset_exploration(1)
        obs, previous, total, count = env.reset(seed=seed), None, 0.0, 0
        for _ in range(steps):
            exploring = agent.act(obs)
            noise = exploring - agent.act(obs, deterministic=True)
            if previous is not None:
                total += float(((noise - previous) ** 2).mean())
                count += 1
            result = env.step(exploring)
            episode_start = result.terminated | result.truncated
            agent.advance_exploration(episode_start)
            previous = None if bool(episode_start.any()) else noise
            obs = result.obs
    finally:
        env.close()
    return total / max(count, 1)


def train_once(overrides: list[str], noise_steps: int) -> dict:
    """One SAC run of `overrides` (run_overrides) on one thread (its own process under --jobs); its
    training-time action smoothness, its final evaluation and its final policy's exploration-noise smoothness."""
    from robotrl.runtime.metrics import read_metrics

    seed = int(next(o for o in overrides if o.startswith("seed=")).split("=")[1])
    with tempfile.TemporaryDirectory() as tmp:
        summary = train_sac(Path(tmp), *overrides)
        series = read_metrics(Path(tmp) / "metrics.csv")
        noise = noise_sq_diff(Path(tmp), noise_steps, seed)
    out = {
        "return": summary["eval/return"],
        "success": summary.get("eval/success"),
        "eval_action_sq_diff": summary.get("eval/action_sq_diff"),
        "noise_sq_diff": noise,
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
            for key in ("return", "success", *SMOOTHNESS_KEYS, "eval_action_sq_diff", "noise_sq_diff")
        }
    gauss, gsde = figures["gaussian"], figures["gsde"]
    metric = "success" if gauss["success"] else "return"
    figures["perf_metric"] = metric
    figures["perf_ratio"] = round(perf_ratio(gsde[metric], gauss[metric]), 3)
    figures["smoothness_ratio"] = round(gsde["action_sq_diff"] / gauss["action_sq_diff"], 3)
    figures["noise_smoothness_ratio"] = round(gsde["noise_sq_diff"] / gauss["noise_sq_diff"], 3)
    figures["high_freq_ratio"] = round(gsde["action_high_freq_share"] / gauss["action_high_freq_share"], 3)
    return figures


def main() -> None:
    def extra(p):
        p.add_argument("--seeds", type=int, default=2)
        p.add_argument("--envs", default="panda_reach,HalfCheetah-v5")
        p.add_argument("--steps", default="panda_reach=20000,HalfCheetah-v5=100000", help="env=steps,...")
        p.add_argument("--jobs", type=int, default=2, help="runs side by side, one thread each")

    args = parse_args(__doc__, extra, overrides=True, sides=EXPLORATIONS)
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
    given = {e: merge_overrides(args.overrides, getattr(args, e)) for e in EXPLORATIONS}
    for e in EXPLORATIONS:
        refuse_keys(given[e], BENCH_KEYS, where=f"{e}: ")
    overrides = {
        (env, e, s): run_overrides(env, e, steps[env], s, args.quick, given[e])
        for env in envs
        for e in EXPLORATIONS
        for s in range(1, seeds + 1)
    }
    # every run's overrides composed before any starts: a bad one fails naming it; the figures read from these
    agents = {e: train_config(overrides[envs[0], e, 1], f"{envs[0]} {e} run").agent for e in EXPLORATIONS}
    for env in envs[1:]:
        for e in EXPLORATIONS:
            train_config(overrides[env, e, 1], f"{env} {e} run")
    weights = {e: agents[e].smoothness_weight for e in EXPLORATIONS}
    figures: dict = {
        "seeds": seeds,
        "sde_sample_freq": agents["gsde"].sde_sample_freq,
        "smoothness_weight": weights["gsde"] if len(set(weights.values())) == 1 else weights,
        "jobs": args.jobs,
        **({"overrides": args.overrides} if args.overrides else {}),
        **({"gsde_set": args.gsde} if args.gsde else {}),
        **({"gaussian_set": args.gaussian} if args.gaussian else {}),
    }
    # spawn: each run starts a fresh interpreter (no torch thread pool or MuJoCo context inherited by fork)
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        noise_steps = 200 if args.quick else NOISE_STEPS
        runs = {key: pool.submit(train_once, run, noise_steps) for key, run in overrides.items()}
        for env in envs:
            results = {e: [runs[env, e, s].result() for s in range(1, seeds + 1)] for e in EXPLORATIONS}
            figures[env] = compare(env, results, steps[env])
    figures["smoothness_ratio"] = max(figures[env]["smoothness_ratio"] for env in envs)
    figures["noise_smoothness_ratio"] = max(figures[env]["noise_smoothness_ratio"] for env in envs)
    figures["perf_ratio"] = min(figures[env]["perf_ratio"] for env in envs)
    emit("gsde_smoothness", figures, args.save)


if __name__ == "__main__":
    main()
