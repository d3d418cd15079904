"""Exported policy bundles (robotrl-export, ONNX through onnxruntime) against the torch policy they came from,
measured in the same script: a state policy (SAC on panda_reach) and a pixel policy (DrQ-v2 at the paper's
architecture, 84x84, frame stack 3, on panda_reach from pixels and state), each trained here, then exported.

Figures:
  max_abs_action_diff: max |onnxruntime - torch| over recorded observations (rollouts of the run's own policy,
      noise added so they spread; 1,000 per policy, 200 with --quick), state and pixels together, in action
      units; `state`/`pixels` hold each one's. Goal: <= 1e-5.
  closed_loop_success_equal: the bundle and the torch policy, each driving the simulator over the same seeded
      episodes (20; 4 with --quick), reach the same success rate on both policies; the rates are beside it.
  ort_p99_ms_state / ort_p99_ms_pixels: onnxruntime's 99th-percentile latency of one action (batch 1, one
      thread, `PolicyBundle.act` with its input checks). Goals: <= 0.5 ms (state), <= 5 ms (pixels). Each
      policy's entry also holds the medians (`ort_p50_ms`, `torch_p50_ms`): on a machine busy with other work
      the p99 measures the contention more than the policy.
  torch_p99_ms_state / torch_p99_ms_pixels: the same for the torch policy (`agent.act(obs, deterministic=True)`,
      one thread), and ort_speedup_* = torch p99 over onnxruntime p99.
The training runs are short: these figures are about the export, not the policies' quality (a pixel policy
trained this briefly may succeed in no episode; the success rates say so).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, parse_args, run_logged

COMMON = ["task=panda_reach", "video=false", "progress=false", "eval_interval=1000000", "log_interval=1000"]


def runs(quick: bool) -> dict[str, list[str]]:
    state_steps = 300 if quick else 8_000
    pixel_steps = 20 if quick else 2_000
    return {
        "state": [
            *COMMON,
            f"total_steps={state_steps}",
            f"learning_starts={min(1_000, state_steps // 3)}",
            f"checkpoint_interval={state_steps}",
            "agent.obs_norm=true",
            *(["agent.actor_hidden=[64,64]", "agent.critic_hidden=[64,64]", "agent.batch_size=32"] if quick else []),
        ],
        "pixels": [
            *COMMON,
            "agent=drqv2",
            "agent.precision=fp32",  # the bundle computes in float32: compare it with a float32 torch policy
            "task.obs=state+pixels",
            "task.image_size=84",
            f"total_steps={pixel_steps}",
            f"learning_starts={pixel_steps - 2 if quick else 500}",
            f"checkpoint_interval={pixel_steps}",
            f"replay_capacity={max(pixel_steps, 1_000)}",
            *(["agent.batch_size=8"] if quick else ["agent.batch_size=64"]),
        ],
    }


def load_agent(run_dir: Path):
    import torch

    from robotrl.agents import make_agent
    from robotrl.core.deploy_spec import read_deploy_spec
    from robotrl.runtime.checkpoint import latest_checkpoint, load_checkpoint
    from robotrl.runtime.run_config import load_run_config

    cfg = load_run_config(run_dir)
    spec = read_deploy_spec(run_dir)
    agent = make_agent(cfg.agent, spec.obs_spec(), spec.action_dim, torch.device("cpu"))
    load_checkpoint(latest_checkpoint(run_dir / "checkpoints"), agent, replay=None, restore_rng=False)
    return cfg, agent.eval()


def recorded(cfg, agent, count: int, num_envs: int = 8) -> dict:
    import torch

    from robotrl.runtime.assembly import make_training_env

    env = make_training_env(cfg, num_envs=num_envs)
    obs, parts = env.reset(seed=7), []
    generator = torch.Generator().manual_seed(0)
    for _ in range(-(-count // num_envs)):
        parts.append({k: v.clone() for k, v in obs.items()})
        action = agent.act(obs, deterministic=True)
        action = (action + 0.3 * torch.randn(action.shape, generator=generator)).clamp(-1, 1)
        obs = env.step(action).next_obs
    env.close()
    return {k: torch.cat([p[k] for p in parts])[:count] for k in parts[0]}


class BundleActor:
    """A bundle driving `evaluate` as an agent would: actions back in [-1, 1] (the env's units)."""

    def __init__(self, bundle):
        import numpy as np

        self.bundle, self.device = bundle, "cpu"
        low, high = np.array(bundle.manifest.action_low), np.array(bundle.manifest.action_high)
        self.scale, self.offset = (high - low) / 2, (high + low) / 2

    def reset_evaluation(self, num_envs: int) -> None:
        pass

    def advance_evaluation(self, episode_start) -> None:
        pass

    def act(self, obs, deterministic: bool = True):
        import torch

        action = self.bundle.act({k: v.numpy() for k, v in obs.items()})
        return torch.from_numpy(((action - self.offset) / self.scale).astype("float32"))


def latency_ms(call, calls: int) -> tuple[float, float]:
    """(median, 99th percentile) of `call`'s wall time in ms, after a warm-up."""
    import numpy as np

    for _ in range(max(20, calls // 10)):
        call()
    times = np.empty(calls)
    for i in range(calls):
        start = time.perf_counter()
        call()
        times[i] = time.perf_counter() - start
    return float(np.median(times) * 1e3), float(np.percentile(times, 99) * 1e3)


def measure(kind: str, run_dir: Path, bundle_dir: Path, quick: bool) -> dict:
    import numpy as np
    import torch

    from robotrl.core.policy_bundle import load_bundle
    from robotrl.runtime.assembly import make_training_env
    from robotrl.runtime.evaluate import evaluate

    cfg, agent = load_agent(run_dir)
    bundle = load_bundle(bundle_dir, threads=1)
    low, high = np.array(bundle.manifest.action_low), np.array(bundle.manifest.action_high)
    obs = recorded(cfg, agent, 200 if quick else 1_000)
    eager = agent.act(obs, deterministic=True).numpy()
    eager = low + (eager + 1) / 2 * (high - low)
    diff = float(np.abs(bundle.act({k: v.numpy() for k, v in obs.items()}) - eager).max())
    episodes = 4 if quick else 20
    success = {}
    for name, actor in (("torch", agent), ("ort", BundleActor(bundle))):
        env = make_training_env(cfg, num_envs=1)
        success[name] = evaluate(actor, env, episodes, seed=12345)["success"]
        env.close()
    one = {k: v[:1] for k, v in obs.items()}
    one_np = {k: v.numpy() for k, v in one.items()}
    calls = 300 if quick else 3_000
    torch.set_num_threads(1)
    ort_p50, ort_p99 = latency_ms(lambda: bundle.act(one_np), calls)
    torch_p50, torch_p99 = latency_ms(lambda: agent.act(one, deterministic=True), calls)
    return {
        "max_abs_action_diff": diff,
        "observations": int(eager.shape[0]),
        "episodes": episodes,
        "success_torch": success["torch"],
        "success_ort": success["ort"],
        "ort_p50_ms": round(ort_p50, 4),
        "ort_p99_ms": round(ort_p99, 4),
        "torch_p50_ms": round(torch_p50, 4),
        "torch_p99_ms": round(torch_p99, 4),
    }


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--workdir", type=Path, help="keep the runs and bundles here (default: a temporary dir)")

    args = parse_args(__doc__, extra)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.workdir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        per_kind = {}
        for kind, overrides in runs(args.quick).items():
            run_dir, bundle_dir = root / f"{kind}_{stamp}", root / f"{kind}_{stamp}_bundle"
            train = [sys.executable, "-m", "robotrl.train", *overrides, f"hydra.run.dir={run_dir}"]
            run_logged(train, root / f"{kind}_{stamp}_train.log")
            export = [sys.executable, "-m", "robotrl.export", f"run={run_dir}", "format=onnx", f"out={bundle_dir}"]
            run_logged(export, root / f"{kind}_{stamp}_export.log")
            per_kind[kind] = measure(kind, run_dir, bundle_dir, args.quick)
    state, pixels = per_kind["state"], per_kind["pixels"]
    figures = {
        "max_abs_action_diff": max(state["max_abs_action_diff"], pixels["max_abs_action_diff"]),
        "closed_loop_success_equal": all(p["success_torch"] == p["success_ort"] for p in per_kind.values()),
        "ort_p99_ms_state": state["ort_p99_ms"],
        "ort_p99_ms_pixels": pixels["ort_p99_ms"],
        "torch_p99_ms_state": state["torch_p99_ms"],
        "torch_p99_ms_pixels": pixels["torch_p99_ms"],
        "ort_speedup_state": round(state["torch_p99_ms"] / state["ort_p99_ms"], 2),
        "ort_speedup_pixels": round(pixels["torch_p99_ms"] / pixels["ort_p99_ms"], 2),
        "state": state,
        "pixels": pixels,
        "quick": args.quick,
        "threads": 1,
    }
    emit("export_parity", figures, args.save)


if __name__ == "__main__":
    main()
