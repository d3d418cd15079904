"""Sample efficiency of the action-chunk critic against SAC, both robotrl agents run by this script with
the same settings apart from the agent.

    python bench/chunk_vs_sac.py [--quick] [--tasks panda_pick_cube,panda_push] [--seeds 3] [--steps N]
                                 [--sac-steps N] [--demos 10] [--chunk-len 4] [--chunk-samples 1]
                                 [--execution open_loop] [--noise-correlation 0] [--policy-chunk-len K]
                                 [--entropy-per-dim -1]
                                 [--obs-norm] [--her-ratio 0] [--pretrain-updates 0] [--demo-disturb-steps 0]
                                 [--q-normalize 0] [--jobs 2] [--device auto]
                                 [--workdir DIR] [--save]

Every (task, agent, seed) run is its own `robotrl-train` process on one thread, `--jobs` of them side by
side. Every `--eval-interval` env steps a deterministic evaluation (`--eval-episodes` episodes) measures
the success rate. Per task, the success curves are averaged over seeds and `steps_to_success` is the first
evaluation step where the mean reaches `--threshold` (80%). `<task>.steps_ratio` = chunk's steps / SAC's
(goal: at most 0.5), and the headline `steps_ratio` is the largest over the tasks. An agent that never
reaches the threshold has `steps_to_success` null; then `steps_ratio` is null if the chunk critic missed
it, and an upper bound (SAC's steps taken as its budget, flagged `sac_censored`) if only SAC did; SAC's runs
may go on past the chunk critic's (`--sac-steps`) to measure a ratio that budget would only bound.
`steps_to_sustained_success` is the first step where the mean curve averaged over five evaluations (that
one and the four before it) reaches the threshold, and `<task>.sustained_steps_ratio` their ratio (null
unless both get there): where both curves plateau near 80% the first crossing measures evaluation noise,
this the level an agent holds. The headline stays the issue's first-crossing `steps_ratio`.
`--entropy-per-dim` sets both agents' target entropy per sampled action entry (SAC samples |A| entries an
action, the chunk critic chunk_len * |A| a chunk); -1 is SAC's default, -|A|.
`--workdir DIR` keeps the demonstrations and runs (default: a temporary directory, removed at the end). A run
found there that got to its end with exactly the overrides it would be started with, on the same code (each
run's directory holds the digest of robotrl/, tasks/ and configs/ it ran: bench/common.py source_digest), is
read instead of re-run (`<task>.<agent>.reused_runs` counts them; its `minutes` are those it recorded); anything else
there is replaced. Runs are deterministic per seed on one machine, so a stopped bench resumes where it stopped,
and settings that change only the chunk critic share SAC's reference runs.

Two settings (`setting` in the JSON line):
- `demos` (`--demos N`, default 10): the offline-to-online setting of Q-chunking (Li et al. 2025) and of
  bench/hil_pick.py, without an operator: sparse reward, episodes end at the first success, N scripted
  demonstrations recorded once per task and seed and given to both agents (50/50 offline/online batches,
  a BC term of weight 10, layer-normed critics, two updates per env step). SAC backs up over
  `--sac-n-step` steps (3: its best on pick in hil_pick); the chunk critic over its chunk.
- `scratch` (`--demos 0`): dense reward and the agents' defaults. On these tasks neither agent reaches
  80% within 30k steps (push, 1 seed: bench/results/chunk_vs_sac.jsonl line 1, 2026-11-22); the full
  comparison needs 100k+ steps and hours on 2 CPU cores.
What was measured, setting by setting, and why (including the screens no line holds):
bench/results/chunk_vs_sac.md; the saved lines: bench/results/chunk_vs_sac.jsonl. Pick's steps_ratio is 0.47
(`--tasks panda_pick_cube --chunk-len 5 --entropy-per-dim -3 --sac-steps 45000`); push's 0.26 (sustained 0.40) with
`--chunk-samples 32`, its chunk critic measured to 14k only (the results file has the full flags).
A bench of 3 seeds per agent on push takes about two hours on 2 cores (~17-25 env steps/s per run with 2 jobs).
--quick: panda_reach from scratch, 1 seed, 2k steps and small networks, to check that everything runs
(about a minute); at that size the threshold is usually not reached.
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
from common import emit, parse_args, record_scripted_demos, run_logged, source_digest

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


def action_dim(task: str) -> int:
    from robotrl.tasks import TASK_CONFIGS, make_task

    return make_task(TASK_CONFIGS[task](name=task)).action_dim


def agent_overrides(agent: str, task: str, args) -> list[str]:
    """The agent's settings; its target entropy is `--entropy-per-dim` times the dimensions its actor samples
    (a chunk critic's actor samples a plan of chunk_len, or policy_chunk_len, actions at once), so both agents
    explore alike per action entry."""
    plan = args.policy_chunk_len or args.chunk_len
    dims = action_dim(task) * (plan if agent == "chunk" else 1)
    entropy = f"agent.target_entropy={args.entropy_per_dim * dims:g}"
    shared = [
        entropy,
        *(["agent.obs_norm=true"] if args.obs_norm else []),
        *([f"her_ratio={args.her_ratio:g}"] if args.her_ratio else []),
        *([f"agent.q_normalize={args.q_normalize:g}"] if args.q_normalize else []),
    ]
    if agent == "chunk":
        return [
            "agent=chunk",
            f"agent.chunk_len={args.chunk_len}",
            f"agent.execution={args.execution}",
            f"agent.num_samples={args.chunk_samples}",
            *([f"agent.noise_correlation={args.noise_correlation}"] if args.noise_correlation else []),
            *([f"agent.policy_chunk_len={args.policy_chunk_len}"] if args.policy_chunk_len else []),
            *shared,
        ]
    return ["agent=sac", *([f"agent.n_step={args.sac_n_step}"] if args.demos else []), *shared]


def success_curve(agent: str, task: str, seed: int, args, workdir: Path) -> tuple[dict[int, float], float, bool]:
    """{eval step: success rate} of one training run (its own process), its wall time in seconds, and
    whether it was a finished run of the same overrides found in `workdir` (read, not re-run)."""
    from robotrl.runtime.metrics import read_metrics

    run_dir = workdir / f"{task}_{agent}_s{seed}"
    demos = demos_dir(workdir, task, seed, args.demo_disturb_steps)
    setting = [*WITH_DEMOS, f"hil.demos=[{demos}]"] if args.demos else []
    if args.demos and args.pretrain_updates:
        setting.append(f"hil.pretrain_updates={args.pretrain_updates}")
    overrides = [
        f"task={task}",
        *agent_overrides(agent, task, args),
        *setting,
        *(QUICK_SIZE if args.quick else []),
        f"seed={seed}",
        f"total_steps={args.sac_steps if agent == 'sac' else args.steps}",
        f"learning_starts={args.learning_starts}",
        f"eval_interval={args.eval_interval}",
        f"eval_episodes={args.eval_episodes}",
        f"log_interval={args.eval_interval}",
        "checkpoint_interval=1000000000",
        "checkpoint_replay=false",
        "video=false",
        "progress=false",
        "threads=1",
        *([f"device={args.device}"] if args.device != "auto" else []),
    ]
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


def main() -> None:
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
        p.add_argument("--sac-n-step", type=int, default=3, help="SAC's backup length in the demos setting")
        p.add_argument("--learning-starts", type=int, default=None, help="1000 with demos, else 5000")
        p.add_argument("--eval-interval", type=int, default=None, help="1000 with demos, else 5000")
        p.add_argument("--eval-episodes", type=int, default=10)
        p.add_argument("--threshold", type=float, default=0.8)
        p.add_argument("--chunk-len", type=int, default=4)
        p.add_argument("--execution", default="open_loop")
        p.add_argument("--chunk-samples", type=int, default=1, help="the chunk critic's best-of-N (agent.num_samples)")
        p.add_argument(
            "--noise-correlation",
            type=float,
            default=0.0,
            help="the chunk critic's exploration noise correlation between a chunk's steps (agent.noise_correlation)",
        )
        p.add_argument(
            "--policy-chunk-len",
            type=int,
            default=None,
            help="the chunk critic's actor plans and executes this many actions (agent.policy_chunk_len, DQC)",
        )
        p.add_argument(
            "--entropy-per-dim",
            type=float,
            default=-1.0,
            help="each agent's target entropy per sampled action entry (-1: SAC's -|A|; hil_pick uses -3)",
        )
        p.add_argument(
            "--obs-norm",
            action="store_true",
            help="both agents standardise their state features with running statistics (agent.obs_norm)",
        )
        p.add_argument(
            "--her-ratio",
            type=float,
            default=0.0,
            help="both agents relabel this share of their samples with goals reached later (her_ratio; push only)",
        )
        p.add_argument(
            "--pretrain-updates",
            type=int,
            default=0,
            help="both agents' updates on the demos alone before the first env step (hil.pretrain_updates)",
        )
        p.add_argument(
            "--demo-disturb-steps",
            type=int,
            default=0,
            help="each demo starts after up to this many unrecorded noisy expert steps (robotrl-record disturb_steps)",
        )
        p.add_argument(
            "--q-normalize",
            type=float,
            default=0.0,
            help="both agents scale the actor's critic term to this over the batch's mean |Q| (agent.q_normalize)",
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

    args = parse_args(__doc__, extra)
    if not (args.device in ("auto", "cpu") or args.device.startswith("cuda")):
        raise SystemExit(f"--device must be auto, cpu, cuda or cuda:N, got {args.device!r}")
    if args.pretrain_updates and not args.demos:
        raise SystemExit(f"--pretrain-updates {args.pretrain_updates} pretrains on demos: it needs --demos > 0")
    if args.demo_disturb_steps and not args.demos:
        raise SystemExit(f"--demo-disturb-steps {args.demo_disturb_steps} disturbs demos: it needs --demos > 0")
    if args.demo_disturb_steps < 0 or not args.q_normalize >= 0:
        raise SystemExit(
            f"need --demo-disturb-steps >= 0 and --q-normalize >= 0; got {args.demo_disturb_steps}, {args.q_normalize}"
        )
    if args.demos < 0 or args.jobs < 1 or args.seeds < 1:
        raise SystemExit(f"need --demos >= 0, --jobs >= 1, --seeds >= 1; got {args.demos}, {args.jobs}, {args.seeds}")
    tasks, seeds = args.tasks.split(","), range(1, args.seeds + 1)
    with_demos = args.demos > 0
    args.steps = args.steps or (30_000 if with_demos else 100_000)
    args.sac_steps = args.sac_steps or args.steps
    if args.sac_steps < args.steps:
        raise SystemExit(f"--sac-steps ({args.sac_steps}) must be at least --steps ({args.steps})")
    args.learning_starts = args.learning_starts or (1_000 if with_demos else 5_000)
    args.eval_interval = args.eval_interval or (1_000 if with_demos else 5_000)
    if args.quick:
        tasks, seeds, args.demos, args.pretrain_updates, args.demo_disturb_steps = ["panda_reach"], range(1, 2), 0, 0, 0
        args.steps, args.learning_starts, args.eval_interval, args.eval_episodes = 2_000, 300, 500, 3
        args.sac_steps = args.steps
    figures: dict = {
        "setting": "demos" if args.demos else "scratch",
        "demos": args.demos,
        "steps": args.steps,
        "sac_steps": args.sac_steps,
        "seeds": len(seeds),
        "threshold": args.threshold,
        "chunk_len": args.chunk_len,
        "execution": args.execution,
        "chunk_samples": args.chunk_samples,
        "noise_correlation": args.noise_correlation,
        "policy_chunk_len": args.policy_chunk_len,
        "entropy_per_dim": args.entropy_per_dim,
        "obs_norm": args.obs_norm,
        "her_ratio": args.her_ratio,
        "pretrain_updates": args.pretrain_updates,
        "demo_disturb_steps": args.demo_disturb_steps,
        "q_normalize": args.q_normalize,
        "device": args.device,
        **({"sac_n_step": args.sac_n_step} if args.demos else {}),
    }
    ratios = []
    with (
        tempfile.TemporaryDirectory(prefix="chunk_vs_sac_") as tmp,
        ThreadPoolExecutor(args.jobs) as pool,
    ):
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.demos:
            for task in tasks:
                for seed in seeds:
                    ensure_demos(workdir, task, seed, args.demos, args.demo_disturb_steps)
        runs = {  # seed by seed, both agents' runs side by side: a stopped bench leaves whole pairs
            (task, agent, seed): pool.submit(success_curve, agent, task, seed, args, workdir)
            for task in tasks
            for seed in seeds
            for agent in ("sac", "chunk")
        }
        for task in tasks:
            result: dict = {}
            for agent in ("sac", "chunk"):
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
