"""Sample efficiency of the action-chunk critic against SAC, both robotrl agents run by this script with
the same settings apart from the agent.

    python bench/chunk_vs_sac.py [--quick] [--tasks panda_pick_cube,panda_push] [--seeds 3] [--steps N]
                                 [--sac-steps N] [--demos 10] [--demo-disturb-steps 0] [--threshold 0.8]
                                 [--entropy-per-dim -1] [--jobs 2] [--device auto] [--workdir DIR] [--save]
                                 [OVERRIDE ...] [--sac OVERRIDE ...] [--chunk OVERRIDE ...]

Agent and task settings are Hydra overrides, as robotrl-train takes them: positional ones reach every run
(`her_ratio=0.8 agent.obs_norm=true hil.pretrain_updates=200 agent.q_normalize=1 eval_interval=2000`),
`--sac OVERRIDE` SAC's runs alone and `--chunk OVERRIDE` the chunk critic's alone (repeatable: `--chunk
agent.chunk_len=5 --chunk agent.num_samples=32 --chunk agent.policy_chunk_len=2 --chunk agent.execution=ensemble
--chunk agent.noise_correlation=0.5`; chunk-only keys go there, SAC has no such key). They win over the bench's
defaults (below), a later one over an earlier one of the same key; an override of what the bench's own options set
(agent, task, seed, total_steps, hil.demos, device) exits naming the option, and every run's overrides are composed
before any run starts, so an unknown key or a bad value fails naming it.

Every (task, agent, seed) run is its own `robotrl-train` process on one thread, `--jobs` of them side by
side. Every `eval_interval` env steps (1000 with demos, else 5000) a deterministic evaluation (`eval_episodes`,
10) measures the success rate. Per task, the success curves are averaged over seeds and `steps_to_success` is the
first evaluation step where the mean reaches `--threshold` (80%). `<task>.steps_ratio` = chunk's steps / SAC's
(goal: at most 0.5), and the headline `steps_ratio` is the largest over the tasks. An agent that never
reaches the threshold has `steps_to_success` null; then `steps_ratio` is null if the chunk critic missed
it, and an upper bound (SAC's steps taken as its budget, flagged `sac_censored`) if only SAC did; SAC's runs
may go on past the chunk critic's (`--sac-steps`) to measure a ratio that budget would only bound.
`steps_to_sustained_success` is the first step where the mean curve averaged over five evaluations (that
one and the four before it) reaches the threshold, and `<task>.sustained_steps_ratio` their ratio (null
unless both get there): where both curves plateau near 80% the first crossing measures evaluation noise,
this the level an agent holds. The headline stays the issue's first-crossing `steps_ratio`.
`--entropy-per-dim` sets both agents' target entropy per sampled action entry (SAC samples |A| entries an
action, the chunk critic plan length * |A| a chunk, its plan length read from its composed config); -1 is SAC's
default, -|A|. An agent.target_entropy override wins over it.
The JSON line records the settings as the runs' composed configs hold them (chunk_len, execution, chunk_samples,
noise_correlation, policy_chunk_len, obs_norm, her_ratio, pretrain_updates, q_normalize, sac_n_step,
target_entropy; a shared one as {"sac": ..., "chunk": ...} where the agents differ) and the overrides given
(`overrides`, `sac_overrides`, `chunk_overrides`).
`--workdir DIR` keeps the demonstrations and runs (default: a temporary directory, removed at the end). A run
found there that got to its end with exactly the overrides it would be started with, on the same code (each
run's directory holds the digest of robotrl/, tasks/ and configs/ it ran: bench/common.py source_digest), is
read instead of re-run (`<task>.<agent>.reused_runs` counts them; its `minutes` are those it recorded); anything else
there is replaced. Runs are deterministic per seed on one machine, so a stopped bench resumes where it stopped,
and settings that change only the chunk critic (`--chunk`) share SAC's reference runs.

Two settings (`setting` in the JSON line):
- `demos` (`--demos N`, default 10): the offline-to-online setting of Q-chunking (Li et al. 2025) and of
  bench/hil_pick.py, without an operator: sparse reward, episodes end at the first success, N scripted
  demonstrations recorded once per task and seed and given to both agents (50/50 offline/online batches,
  a BC term of weight 10, layer-normed critics, two updates per env step). SAC backs up over
  3 steps (agent.n_step=3: its best on pick in hil_pick; `--sac agent.n_step=1` for one); the chunk critic over
  its chunk.
- `scratch` (`--demos 0`): dense reward and the agents' defaults. On these tasks neither agent reaches
  80% within 30k steps (push, 1 seed: bench/results/chunk_vs_sac.jsonl line 1, 2026-11-22); the full
  comparison needs 100k+ steps and hours on 2 CPU cores.
What was measured, setting by setting, and why (including the screens no line holds):
bench/results/chunk_vs_sac.md; the saved lines: bench/results/chunk_vs_sac.jsonl. Pick's steps_ratio is 0.47
(`--tasks panda_pick_cube --entropy-per-dim -3 --sac-steps 45000 --chunk agent.chunk_len=5`); push's 0.26
(sustained 0.40) with `--chunk agent.num_samples=32`, its chunk critic measured to 14k only (the results file
has the full command lines).
A bench of 3 seeds per agent on push takes about two hours on 2 cores (~17-25 env steps/s per run with 2 jobs).
--quick: panda_reach from scratch, 1 seed, 2k steps and small networks, to check that everything runs
(about a minute); at that size the threshold is usually not reached. Overrides still apply.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    emit,
    merge_overrides,
    parse_args,
    record_scripted_demos,
    refuse_keys,
    run_logged,
    source_digest,
    train_config,
)

SUSTAIN_WINDOW = 5  # evaluations averaged for steps_to_sustained_success
CODE_STAMP = "code_digest"  # in a run's directory: the source_digest of the code it ran
QUICK_SIZE = ["agent.actor_hidden=[64,64]", "agent.critic_hidden=[64,64]", "agent.batch_size=64"]
WITH_DEMOS = [
    "task.reward=sparse",
    "task.terminate_on_success=true",
    "hil.operator=none",
    "agent.critic_layer_norm=true",
    "agent.utd_ratio=2",
    "agent.bc_weight=10.0",
]
SAC_WITH_DEMOS = ["agent.n_step=3"]  # SAC's best backup length on pick in bench/hil_pick.py
AGENTS = ("sac", "chunk")
# What the bench's own options set: an override of one of these keys exits naming the option.
BENCH_KEYS = {
    "agent": "each run's agent: --sac/--chunk set their agent's keys",
    "task": "--tasks",
    "seed": "--seeds",
    "total_steps": "--steps, --sac-steps",
    "hil.demos": "--demos",
    "device": "--device",
}
ONE_AGENT_HINT = (
    "\n(positional overrides reach both agents: give a key of one agent alone as --chunk or --sac KEY=VALUE)"
)


def action_dim(task: str) -> int:
    from robotrl.tasks import TASK_CONFIGS, make_task

    return make_task(TASK_CONFIGS[task](name=task)).action_dim


def bench_defaults(agent: str, args) -> list[str]:
    """The bench's settings of `agent`'s runs, before the overrides it was given (which win over them)."""
    interval = 500 if args.quick else 1_000 if args.demos else 5_000
    setting = [*WITH_DEMOS, *(SAC_WITH_DEMOS if agent == "sac" else [])] if args.demos else []
    return [
        f"agent={agent}",
        *setting,
        *(QUICK_SIZE if args.quick else []),
        f"learning_starts={300 if args.quick else interval}",
        f"eval_interval={interval}",
        f"eval_episodes={3 if args.quick else 10}",
        "log_interval=${eval_interval}",
        "checkpoint_interval=1000000000",
        "checkpoint_replay=false",
        "video=false",
        "progress=false",
        "threads=1",
    ]


def run_overrides(agent: str, task: str, seed: int, args, workdir: Path, entropy: float | None) -> list[str]:
    """Every override of one run, one per key: the bench's defaults, the target entropy (`entropy`, None: the
    agent's default), the overrides given to every run and then those given to this agent's (each later one
    winning), and what the bench's own options set."""
    demos = demos_dir(workdir, task, seed, args.demo_disturb_steps)
    return merge_overrides(
        [f"task={task}"],
        bench_defaults(agent, args),
        [] if entropy is None else [f"agent.target_entropy={entropy:g}"],
        args.overrides,
        getattr(args, agent),
        [f"hil.demos=[{demos}]"] if args.demos else [],
        [f"seed={seed}", f"total_steps={args.sac_steps if agent == 'sac' else args.steps}"],
        [f"device={args.device}"] if args.device != "auto" else [],
    )


def configure(args, tasks: list[str], workdir: Path) -> dict[tuple[str, str], tuple[float, object]]:
    """{(task, agent): (its target entropy, the TrainConfig its seed-1 run composes)}, every run's overrides
    composed before any starts (an unknown key or a bad value exits naming it). The target entropy is
    `--entropy-per-dim` times the dimensions the agent's actor samples: |A| for SAC, |A| times the plan
    length (agent.policy_chunk_len, or agent.chunk_len) for the chunk critic, read from its composed config,
    so both agents explore alike per action entry; an agent.target_entropy override wins over it."""
    for agent in AGENTS:
        refuse_keys([*args.overrides, *getattr(args, agent)], BENCH_KEYS, where=f"{agent}: ")
    configured = {}
    for task in tasks:
        dims = action_dim(task)
        for agent in AGENTS:
            name = f"{task} {agent} run"
            composed = train_config(run_overrides(agent, task, 1, args, workdir, None), name, ONE_AGENT_HINT)
            entropy = args.entropy_per_dim * dims * getattr(composed.agent, "plan_len", 1)
            composed = train_config(run_overrides(agent, task, 1, args, workdir, entropy), name, ONE_AGENT_HINT)
            configured[task, agent] = entropy, composed
    return configured


def success_curve(
    agent: str, task: str, seed: int, args, workdir: Path, entropy: float
) -> tuple[dict[int, float], float, bool]:
    """{eval step: success rate} of one training run (its own process), its wall time in seconds, and
    whether it was a finished run of the same overrides found in `workdir` (read, not re-run)."""
    from robotrl.runtime.metrics import read_metrics

    run_dir = workdir / f"{task}_{agent}_s{seed}"
    overrides = run_overrides(agent, task, seed, args, workdir, entropy)
    code = source_digest()
    reused = finished_run(run_dir, overrides, code)
    if reused:
        seconds = json.loads((run_dir / "summary.json").read_text())["eval/wall_s"]
    else:
        shutil.rmtree(run_dir, ignore_errors=True)  # an unfinished run, or one of other settings or code
        run_dir.mkdir(parents=True)
        (run_dir / CODE_STAMP).write_text(code + "\n")
        start = time.perf_counter()
        cmd = [sys.executable, "-m", "robotrl.train", *overrides, f"hydra.run.dir={run_dir}"]
        run_logged(cmd, run_dir.with_suffix(".log"))
        seconds = time.perf_counter() - start
    series = read_metrics(run_dir / "metrics.csv")["eval/success"]
    return dict(series), seconds, reused


def finished_run(run_dir: Path, overrides: list[str], code: str) -> bool:
    """Whether `run_dir` holds a run that got to its end (its summary.json is written last), was started
    with exactly `overrides`, as Hydra recorded them, and ran the code whose `source_digest` is `code`."""
    from omegaconf import OmegaConf

    recorded, stamp = run_dir / ".hydra" / "overrides.yaml", run_dir / CODE_STAMP
    if not all(p.is_file() for p in (run_dir / "summary.json", recorded, stamp)):
        return False
    return stamp.read_text().strip() == code and OmegaConf.to_container(OmegaConf.load(recorded)) == overrides


def demos_dir(workdir: Path, task: str, seed: int, disturb_steps: int = 0) -> Path:
    return workdir / (f"demos_{task}_s{seed}" + (f"_d{disturb_steps}" if disturb_steps else ""))


def ensure_demos(workdir: Path, task: str, seed: int, episodes: int, disturb_steps: int = 0) -> None:
    """Record the scripted demonstrations a (task, seed) trains with, unless `workdir` holds all of them,
    recorded by the same code (a changed scripted expert records other demonstrations)."""
    from robotrl.data.dataset import DatasetError, EpisodeDataset

    path, code = demos_dir(workdir, task, seed, disturb_steps), source_digest()
    stamp = path / CODE_STAMP
    try:
        if len(EpisodeDataset.open(path)) == episodes and stamp.exists() and stamp.read_text().strip() == code:
            return
    except DatasetError:
        pass
    shutil.rmtree(path, ignore_errors=True)
    record_scripted_demos(task, path, episodes, seed, reward="sparse", disturb_steps=disturb_steps)
    stamp.write_text(code + "\n")


def mean_curve(curves: list[dict[int, float]]) -> list[tuple[int, float]]:
    """(eval step, success rate averaged over seeds) at the steps every seed evaluated."""
    return [(step, sum(c[step] for c in curves) / len(curves)) for step in sorted(set.intersection(*map(set, curves)))]


def steps_to_success(curves: list[dict[int, float]], threshold: float) -> int | None:
    """The first eval step where the success rate averaged over seeds reaches `threshold`. The mean is
    compared with a tolerance: in floating point (0.8 + 0.6 + 1.0) / 3 is 0.7999999999999999."""
    return next((step for step, mean in mean_curve(curves) if mean >= threshold - 1e-9), None)


def steps_to_sustained_success(
    curves: list[dict[int, float]], threshold: float, window: int = SUSTAIN_WINDOW
) -> int | None:
    """The first eval step at which the mean curve, averaged over that step and the `window - 1` evaluations
    before it, reaches `threshold`: a level the agent holds, where the first crossing of a curve that
    plateaus near the threshold measures evaluation noise."""
    curve = mean_curve(curves)
    for i in range(window - 1, len(curve)):
        if sum(mean for _, mean in curve[i - window + 1 : i + 1]) / window >= threshold - 1e-9:
            return curve[i][0]
    return None


def options(argv: list[str] | None = None):
    """The bench's options, its defaults resolved (`args.tasks` and `args.seeds` as lists)."""

    def extra(p):
        p.add_argument("--tasks", default="panda_pick_cube,panda_push")
        p.add_argument("--seeds", type=int, default=3)
        p.add_argument("--steps", type=int, default=None, help="env steps per run (30k with demos, else 100k)")
        p.add_argument(
            "--sac-steps",
            type=int,
            default=None,
            help="env steps of SAC's runs (default --steps): longer measures a ratio SAC's budget would only bound",
        )
        p.add_argument("--demos", type=int, default=10, help="scripted demonstrations per run; 0: from scratch")
        p.add_argument("--threshold", type=float, default=0.8)
        p.add_argument(
            "--entropy-per-dim",
            type=float,
            default=-1.0,
            help="each agent's target entropy per sampled action entry (-1: SAC's -|A|; hil_pick uses -3)",
        )
        p.add_argument(
            "--demo-disturb-steps",
            type=int,
            default=0,
            help="each demo starts after up to this many unrecorded noisy expert steps (robotrl-record disturb_steps)",
        )
        p.add_argument("--jobs", type=int, default=2, help="runs side by side, one thread each")
        p.add_argument(
            "--device",
            default="auto",
            help="every run's device (auto: a GPU when there is one); cpu for many --jobs on one GPU machine",
        )
        p.add_argument(
            "--workdir",
            default=None,
            help="keep demos and runs here (default: a temporary directory); a finished run of the same "
            "overrides found here is read instead of re-run",
        )

    args = parse_args(__doc__, extra, overrides=True, sides=AGENTS, argv=argv)
    if not (args.device in ("auto", "cpu") or args.device.startswith("cuda")):
        raise SystemExit(f"--device must be auto, cpu, cuda or cuda:N, got {args.device!r}")
    if args.demo_disturb_steps and not args.demos:
        raise SystemExit(f"--demo-disturb-steps {args.demo_disturb_steps} disturbs demos: it needs --demos > 0")
    if args.demo_disturb_steps < 0:
        raise SystemExit(f"need --demo-disturb-steps >= 0; got {args.demo_disturb_steps}")
    if args.demos < 0 or args.jobs < 1 or args.seeds < 1:
        raise SystemExit(f"need --demos >= 0, --jobs >= 1, --seeds >= 1; got {args.demos}, {args.jobs}, {args.seeds}")
    args.tasks, args.seeds = args.tasks.split(","), list(range(1, args.seeds + 1))
    args.steps = args.steps or (30_000 if args.demos else 100_000)
    args.sac_steps = args.sac_steps or args.steps
    if args.sac_steps < args.steps:
        raise SystemExit(f"--sac-steps ({args.sac_steps}) must be at least --steps ({args.steps})")
    if args.quick:
        args.tasks, args.seeds, args.demos, args.demo_disturb_steps = ["panda_reach"], [1], 0, 0
        args.steps = args.sac_steps = 2_000
    return args


def both(configs: dict, read):
    """A setting both agents share: its value, or {"sac": ..., "chunk": ...} where they differ."""
    values = {agent: read(configs[agent]) for agent in AGENTS}
    return values["sac"] if values["sac"] == values["chunk"] else values


def main() -> None:
    args = options()
    tasks, seeds = args.tasks, args.seeds
    figures: dict = {
        "setting": "demos" if args.demos else "scratch",
        "demos": args.demos,
        "steps": args.steps,
        "sac_steps": args.sac_steps,
        "seeds": len(seeds),
        "threshold": args.threshold,
    }
    ratios = []
    with (
        tempfile.TemporaryDirectory(prefix="chunk_vs_sac_") as tmp,
        ThreadPoolExecutor(args.jobs) as pool,
    ):
        workdir = Path(args.workdir or tmp)
        configured = configure(args, tasks, workdir)
        configs = {agent: configured[tasks[0], agent][1] for agent in AGENTS}
        chunk = configs["chunk"].agent
        figures |= {
            "chunk_len": chunk.chunk_len,
            "execution": chunk.execution,
            "chunk_samples": chunk.num_samples,
            "noise_correlation": chunk.noise_correlation,
            "policy_chunk_len": chunk.policy_chunk_len,
            "entropy_per_dim": args.entropy_per_dim,
            "obs_norm": both(configs, lambda c: c.agent.obs_norm),
            "her_ratio": both(configs, lambda c: c.her_ratio),
            "pretrain_updates": both(configs, lambda c: c.hil.pretrain_updates),
            "demo_disturb_steps": args.demo_disturb_steps,
            "q_normalize": both(configs, lambda c: c.agent.q_normalize),
            "target_entropy": {agent: configs[agent].agent.target_entropy for agent in AGENTS},
            "device": args.device,
            **({"sac_n_step": configs["sac"].agent.n_step} if args.demos else {}),
            "overrides": args.overrides,
            "sac_overrides": args.sac,
            "chunk_overrides": args.chunk,
        }
        workdir.mkdir(parents=True, exist_ok=True)
        if args.demos:
            for task in tasks:
                for seed in seeds:
                    ensure_demos(workdir, task, seed, args.demos, args.demo_disturb_steps)
        runs = {  # seed by seed, both agents' runs side by side: a stopped bench leaves whole pairs
            (task, agent, seed): pool.submit(
                success_curve, agent, task, seed, args, workdir, configured[task, agent][0]
            )
            for task in tasks
            for seed in seeds
            for agent in AGENTS
        }
        for task in tasks:
            result: dict = {}
            for agent in AGENTS:
                done = [runs[task, agent, seed].result() for seed in seeds]
                curves = [curve for curve, _, _ in done]
                result[agent] = {
                    "steps_to_success": steps_to_success(curves, args.threshold),
                    "steps_to_sustained_success": steps_to_sustained_success(curves, args.threshold),
                    "final_success": [round(curve[max(curve)], 2) for curve in curves],
                    "curve": [(step, round(mean, 2)) for step, mean in mean_curve(curves)],
                    "minutes": round(sum(seconds for _, seconds, _ in done) / 60, 2),
                    "reused_runs": sum(reused for _, _, reused in done),
                }
            chunk_steps, sac_steps = result["chunk"]["steps_to_success"], result["sac"]["steps_to_success"]
            result["sac_censored"] = sac_steps is None
            ratio = None if chunk_steps is None else chunk_steps / (sac_steps or args.sac_steps)
            result["steps_ratio"] = None if ratio is None else round(ratio, 3)
            held = result["chunk"]["steps_to_sustained_success"], result["sac"]["steps_to_sustained_success"]
            result["sustained_steps_ratio"] = None if None in held else round(held[0] / held[1], 3)
            ratios.append(ratio)
            figures[task] = result
    figures["steps_ratio"] = None if None in ratios else round(max(ratios), 3)
    emit("chunk_vs_sac", figures, args.save)


if __name__ == "__main__":
    main()
