"""SAC speed against stable-baselines3, on the same threads, each figure in its own fresh process.

Figures:
  robotrl_updates_per_s / sb3_updates_per_s: gradient updates per second (batch 256, 2x256 MLPs) for
      the observation/action sizes of each env; `ratio` is the smallest of the per-env ratios.
  loop_ratio: whole training loop (env step + one update per step) env steps/s, HalfCheetah-v5,
      robotrl's `train` over SB3's `learn()`.
  sb3_updates_per_s_retained_alloc: SB3's HalfCheetah-sized update speed with robotrl's allocator setting
      (robotrl/runtime/allocator.py) applied to its process: how much of the ratio is that setting.
  gemm_gflops / update_gflops_per_s / gemm_peak_share: the fp32 matrix-multiply rate these cores reach on the
      update's own shapes (the layers of a batch-256 forward pass, each timed alone; `gemm_gflops`), the rate our
      HalfCheetah-sized update computes at (`update_flops` per update, counted from the layer shapes, times its
      updates/s) and its share of the former. Two AVX2 cores peak near 160-220 GFLOP/s at best; an update is
      about 0.6 GFLOP, so the share says how far the update is from what the cores can do at all.
Goals on 2 CPU threads: ratio >= 4, loop_ratio >= 3 (restated in the GPU-scale issue as `gemm_peak_share`).
  cuda: HalfCheetah-sized update speed on a GPU, ours and SB3's, when one is at hand (`--cuda-only`: that
      alone). H100, 2026-11-24: ours 166 vs SB3 85 updates/s (ratio 1.96), 2026-11-23: 178 vs 91. About 6 ms an
      update for ~0.6 GFLOP: far below the GPU's arithmetic, both sides are bound by per-op overhead.
      compiled_updates_per_s: with agent.compile=true (torch.compile, the whole update one CUDA graph; goal
      >= 1,000 on an H100) and compile_s its one-off cost; *_batch_32768_*: bf16 at batch 32,768, eager and
      compiled (goal >= 250). SB3's side runs on an env of HalfCheetah's sizes (GPU machines lack MuJoCo).

Every figure is measured in its own fresh process (bench/common.py `in_subprocess`), each library as it runs
when it trains: robotrl's `train` keeps freed memory in the process on a CPU (glibc would unmap and
page-fault a batch's activations in again every update), so our update figures apply that setting too;
SB3's run with the default allocator, as SB3 trains. The bf16 line is robotrl's mixed precision
(`agent.precision=bf16`: bf16 hidden-layer matmuls, float32 weights, heads and optimizer) against the same
SB3 figures; SB3 has no such mode.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, in_subprocess, parse_args

SIZES = {"Pendulum-v1": (3, 1), "HalfCheetah-v5": (17, 6)}


def robotrl_updates_per_s(
    obs_dim: int,
    act_dim: int,
    updates: int,
    precision: str,
    device: str = "cpu",
    batch: int = 256,
    compile: bool = False,
) -> float:
    """Updates per second after warm-up (with `compile`: past the compiled update's warm-up and capture)."""
    import torch

    from robotrl.agents import SAC, SACConfig
    from robotrl.data import ReplayBuffer, TensorSpec
    from robotrl.runtime.allocator import retain_freed_memory

    if device == "cpu":  # as robotrl's train does
        retain_freed_memory()

    spec = {"state": TensorSpec((obs_dim,))}
    agent = SAC(SACConfig(batch_size=batch, precision=precision, compile=compile), spec, act_dim, device)
    replay = ReplayBuffer(spec, act_dim, capacity=20_000, device=device)
    for _ in range(10_000):
        o = {"state": torch.randn(1, obs_dim)}
        replay.add(
            o,
            torch.rand(1, act_dim) * 2 - 1,
            torch.randn(1),
            o,
            torch.zeros(1, dtype=torch.bool),
            torch.zeros(1, dtype=torch.bool),
        )
    for _ in range(30):
        agent.update(replay.sample(batch))
    _sync(device)
    start = time.perf_counter()
    for _ in range(updates):
        agent.update(replay.sample(batch))
    _sync(device)
    return updates / (time.perf_counter() - start)


def robotrl_compile_s(obs_dim: int, act_dim: int, precision: str, batch: int) -> float:
    """Seconds from a fresh compiled agent to its first replayed update (compilation and capture), less an eager
    agent's first as many updates."""
    import torch

    from robotrl.agents import SAC, SACConfig
    from robotrl.agents.compiled import WARMUP_CALLS
    from robotrl.data import TensorSpec
    from robotrl.data.replay import Batch

    spec = {"state": TensorSpec((obs_dim,))}
    obs = {"state": torch.randn(batch, obs_dim, device="cuda")}
    sample = Batch(
        obs,
        torch.zeros(batch, act_dim, device="cuda"),
        torch.zeros(batch, 1, device="cuda"),
        torch.ones(batch, 1, device="cuda"),
        obs,
    )
    times = []
    for compile in (False, True):
        agent = SAC(SACConfig(batch_size=batch, precision=precision, compile=compile), spec, act_dim, "cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(WARMUP_CALLS + 2):
            agent.update(sample)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times[1] - times[0]


def sb3_updates_per_s(env_id: str, updates: int, device: str = "cpu", retain_alloc: bool = False) -> float:
    """SB3's update speed on `env_id` (the registered env, or with `shapes:OBS,ACT` an env of those sizes that
    returns random observations: an update's cost depends on the sizes alone, and GPU machines lack MuJoCo)."""
    import gymnasium as gym
    from stable_baselines3 import SAC as SB3SAC

    if retain_alloc:
        from robotrl.runtime.allocator import retain_freed_memory

        retain_freed_memory()

    env = _shaped_env(*map(int, env_id[7:].split(","))) if env_id.startswith("shapes:") else gym.make(env_id)
    model = SB3SAC("MlpPolicy", env, batch_size=256, learning_starts=0, device=device, verbose=0)
    model.learn(1_000)
    model.train(gradient_steps=30, batch_size=256)
    _sync(device)
    start = time.perf_counter()
    model.train(gradient_steps=updates, batch_size=256)
    _sync(device)
    return updates / (time.perf_counter() - start)


def _shaped_env(obs_dim: int, act_dim: int):
    import gymnasium as gym
    import numpy as np

    class ShapedEnv(gym.Env):
        observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return self.observation_space.sample(), {}

        def step(self, action):
            return self.observation_space.sample(), 0.0, False, False, {}

    return gym.wrappers.TimeLimit(ShapedEnv(), 1000)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def robotrl_loop_steps_per_s(env_id: str, warmup: int, steps: int, precision: str) -> float:
    from robotrl.tasks.configs import GymTaskConfig

    from robotrl.agents import SACConfig
    from robotrl.config import TrainConfig
    from robotrl.runtime.loop import train
    from robotrl.runtime.metrics import read_metrics

    cfg = TrainConfig(
        agent=SACConfig(precision=precision),
        task=GymTaskConfig(env_id=env_id),
        total_steps=warmup + steps,
        learning_starts=warmup,
        log_interval=warmup,
        eval_interval=10**9,
        eval_episodes=1,
        checkpoint_interval=10**9,
        checkpoint_replay=False,
        video=False,
        progress=False,
        device="cpu",  # SB3's loop runs on the CPU too ("auto" would take a GPU where there is one)
    )
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp))
        rates = [v for s, v in read_metrics(Path(tmp) / "metrics.csv")["time/env_steps_per_s"] if s > warmup]
    return sum(rates) / len(rates)


def sb3_loop_steps_per_s(env_id: str, warmup: int, steps: int) -> float:
    import gymnasium as gym
    from stable_baselines3 import SAC as SB3SAC

    model = SB3SAC("MlpPolicy", gym.make(env_id), batch_size=256, learning_starts=warmup, device="cpu", verbose=0)
    model.learn(warmup)
    start = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False)
    return steps / (time.perf_counter() - start)


HIDDEN, BATCH, CRITICS = 256, 256, 2  # the update measured: 2x256 MLPs, batch 256, two critics (SACConfig's)


def layer_shapes(obs_dim: int, act_dim: int) -> dict[str, list[tuple[int, int]]]:
    """(in, out) of each linear layer of the actor (mean and log-std heads together) and of one critic."""
    return {
        "actor": [(obs_dim, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, 2 * act_dim)],
        "critic": [(obs_dim + act_dim, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, 1)],
    }


def update_flops(obs_dim: int, act_dim: int) -> float:
    """Floating-point operations of one SAC update, counted from the matmuls: a forward pass costs 2*B*in*out per
    layer and a backward pass twice that. Per update the actor runs forward twice (next actions for the target,
    new actions for its loss) and backward once; each critic forward four times (target, critic loss, the actor's
    loss) of which twice with a backward pass (its weights, and the actor's loss through its inputs): 4 actor
    forwards' worth and 6 critic forwards' worth of work."""
    shapes = layer_shapes(obs_dim, act_dim)

    def forward(layers):
        return sum(2 * BATCH * n_in * n_out for n_in, n_out in layers)

    return 4 * forward(shapes["actor"]) + 6 * CRITICS * forward(shapes["critic"])


def gemm_gflops(obs_dim: int, act_dim: int, repeats: int) -> float:
    """The fp32 rate (GFLOP/s) of torch's matmul on the update's layer shapes at batch 256, each shape timed alone
    over `repeats` calls after a warm-up, weighted as a forward pass weights them."""
    import torch

    flops = seconds = 0.0
    for layers in layer_shapes(obs_dim, act_dim).values():
        for n_in, n_out in layers:
            x, w, bias = torch.randn(BATCH, n_in), torch.randn(n_in, n_out), torch.randn(n_out)
            for _ in range(max(10, repeats // 10)):
                torch.addmm(bias, x, w)
            start = time.perf_counter()
            for _ in range(repeats):
                torch.addmm(bias, x, w)
            seconds += time.perf_counter() - start
            flops += 2 * BATCH * n_in * n_out * repeats
    return flops / seconds / 1e9


def measure(threads: int, precision: str, updates: int, warmup: int, steps: int) -> dict:
    def run(expr: str) -> float:
        return in_subprocess("sac_speed", expr, threads)

    figures: dict = {}
    ratios = []
    for env_id, (obs_dim, act_dim) in SIZES.items():
        ours = run(f"b.robotrl_updates_per_s({obs_dim}, {act_dim}, {updates}, {precision!r})")
        theirs = run(f"b.sb3_updates_per_s({env_id!r}, {updates})")
        figures[env_id] = {
            "robotrl_updates_per_s": round(ours, 1),
            "sb3_updates_per_s": round(theirs, 1),
            "ratio": round(ours / theirs, 2),
        }
        ratios.append(ours / theirs)
    if precision == "fp32":  # the update's share of what these cores' matrix multiplies reach
        obs_dim, act_dim = SIZES["HalfCheetah-v5"]
        peak = run(f"b.gemm_gflops({obs_dim}, {act_dim}, {max(200, updates)})")
        rate = update_flops(obs_dim, act_dim) * figures["HalfCheetah-v5"]["robotrl_updates_per_s"] / 1e9
        figures.update(
            gemm_gflops=round(peak, 1),
            update_flops=update_flops(obs_dim, act_dim),
            update_gflops_per_s=round(rate, 1),
            gemm_peak_share=round(rate / peak, 3),
        )
    slowest = min(SIZES, key=lambda e: figures[e]["ratio"])
    figures["robotrl_updates_per_s"] = figures[slowest]["robotrl_updates_per_s"]
    figures["sb3_updates_per_s"] = figures[slowest]["sb3_updates_per_s"]
    figures["ratio"] = round(min(ratios), 2)
    ours = run(f"b.robotrl_loop_steps_per_s('HalfCheetah-v5', {warmup}, {steps}, {precision!r})")
    theirs = run(f"b.sb3_loop_steps_per_s('HalfCheetah-v5', {warmup}, {steps})")
    figures.update(
        robotrl_loop_steps_per_s=round(ours, 1),
        sb3_loop_steps_per_s=round(theirs, 1),
        loop_ratio=round(ours / theirs, 2),
    )
    return figures


def cuda_figures(updates: int, threads: int) -> dict:
    """HalfCheetah-sized updates on the GPU: eager and compiled at batch 256 against SB3's (on an env of those
    sizes), and compiled bf16 at batch 32,768 (the large-batch regime of thousands of envs)."""
    import torch

    def run(expr: str) -> float:
        return in_subprocess("sac_speed", expr, threads)

    obs_dim, act_dim = SIZES["HalfCheetah-v5"]
    small, large = 256, 32_768
    eager = run(f"b.robotrl_updates_per_s({obs_dim}, {act_dim}, {updates}, 'fp32', 'cuda')")
    compiled = run(f"b.robotrl_updates_per_s({obs_dim}, {act_dim}, {5 * updates}, 'fp32', 'cuda', compile=True)")
    theirs = run(f"b.sb3_updates_per_s('shapes:{obs_dim},{act_dim}', {updates}, 'cuda')")
    large_updates = max(20, updates // 4)
    large_eager = run(f"b.robotrl_updates_per_s({obs_dim}, {act_dim}, {large_updates}, 'bf16', 'cuda', {large})")
    large_compiled = run(
        f"b.robotrl_updates_per_s({obs_dim}, {act_dim}, {large_updates}, 'bf16', 'cuda', {large}, compile=True)"
    )
    return {
        "device": torch.cuda.get_device_name(),
        "robotrl_updates_per_s": round(eager, 1),
        "compiled_updates_per_s": round(compiled, 1),
        "compile_s": round(run(f"b.robotrl_compile_s({obs_dim}, {act_dim}, 'fp32', {small})"), 1),
        "sb3_updates_per_s": round(theirs, 1),
        "ratio": round(eager / theirs, 2),
        "compiled_ratio": round(compiled / theirs, 2),
        f"bf16_batch_{large}_updates_per_s": round(large_eager, 1),
        f"compiled_bf16_batch_{large}_updates_per_s": round(large_compiled, 1),
    }


def main() -> None:
    def extra(parser):
        parser.add_argument("--cuda-only", action="store_true", help="only the GPU figures (on a GPU machine)")

    args = parse_args(__doc__, extra)
    updates = 60 if args.quick else 2_000
    warmup, steps = (150, 150) if args.quick else (2_000, 6_000)
    # Headline figures use the default precision (fp32); bf16 mixed precision is reported beside them.
    figures = {"threads": args.threads, "updates_timed": updates, "precision": "fp32"}
    if not args.cuda_only:
        figures.update(measure(args.threads, "fp32", updates, warmup, steps))
        figures["sb3_updates_per_s_retained_alloc"] = round(
            in_subprocess(
                "sac_speed", f"b.sb3_updates_per_s('HalfCheetah-v5', {updates}, retain_alloc=True)", args.threads
            ),
            1,
        )
        figures["bf16"] = measure(args.threads, "bf16", updates, warmup, steps)
    import torch

    if torch.cuda.is_available():  # update speed on the GPU, both sides there
        figures["cuda"] = cuda_figures(updates, args.threads)
    emit("sac_speed", figures, args.save)


if __name__ == "__main__":
    main()
