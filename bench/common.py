"""Shared pieces of the benchmarks: argument parsing, thread pinning, the one JSON line."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]

# robotrl's settings for gym locomotion (the README's SAC section). Its defaults are set for the arm tasks'
# small dense rewards (an initial entropy coefficient of 0.1, 1000 random steps); locomotion rewards are
# O(1) per step (Hopper's alive bonus alone is 1), where a start in scale with them explores past the
# "stand still" optimum. Hopper-v5, 100k steps, seeds 1/2: defaults 242/367, init_alpha=1.0 alone 586/526,
# all three 1146/1092 (SB3 with its defaults: 1331/324).
LOCOMOTION = ["learning_starts=100", "agent.init_alpha=1.0", "agent.log_std_min=-20"]


def parse_args(
    description: str, extra=None, overrides: bool = False, sides: tuple[str, ...] = (), argv: list[str] | None = None
) -> argparse.Namespace:
    """The bench's options. A bench that trains takes `overrides=True`: positional Hydra overrides for every run it
    trains, as robotrl-train takes them (`agent.chunk_len=5 her_ratio=0.8 ...`), in `args.overrides`; each of
    `sides` (the arms a comparative bench trains, e.g. "sac", "chunk") adds a repeatable `--<side> OVERRIDE` for
    that arm's runs alone, in `args.<side>` (dashes as underscores). Options and overrides may be interleaved."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smaller run (about a minute), same JSON keys")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads for both sides")
    parser.add_argument("--save", action="store_true", help="also append the JSON line to bench/results/")
    if overrides:
        parser.add_argument(
            "overrides",
            nargs="*",
            metavar="OVERRIDE",
            help="Hydra overrides for every run this bench trains, as robotrl-train takes them",
        )
    for side in sides:
        parser.add_argument(
            f"--{side}",
            action="append",
            default=[],
            metavar="OVERRIDE",
            help=f"a Hydra override for the {side} runs alone (repeatable); wins over the positional ones",
        )
    if extra:
        extra(parser)
    args = parser.parse_intermixed_args(argv)
    for name in ("overrides", *(side.replace("-", "_") for side in sides)):
        for override in getattr(args, name, None) or []:
            if not override.startswith("~") and "=" not in override:
                parser.error(f"{override!r} is not a Hydra override: give key=value (e.g. agent.chunk_len=5)")
    os.environ.setdefault("MUJOCO_GL", "egl")
    import torch

    torch.set_num_threads(args.threads)
    return args


def override_key(override: str) -> str:
    """The key a Hydra override sets: `agent.chunk_len=5` -> agent.chunk_len, `+x=1`, `++x=1` and `~x` -> x,
    `agent=chunk` -> agent (the group)."""
    return override.partition("=")[0].lstrip("+~")


def merge_overrides(*lists: list[str] | tuple[str, ...]) -> list[str]:
    """The overrides of `lists`, in order, one per key: where a key comes again, the later one wins and the
    earlier is dropped (a bench's defaults first, then what it was given). Hydra's compose takes a repeated
    key and keeps the last too, but a run's recorded overrides would then hold both: one per key keeps them
    what the run ran. Without a repeated key the result is the concatenation."""
    merged = [override for overrides in lists for override in overrides]
    seen: set[str] = set()
    kept = []
    for override in reversed(merged):
        key = override_key(override)
        if key not in seen:
            seen.add(key)
            kept.append(override)
    return kept[::-1]


def refuse_keys(overrides: list[str], keys: dict[str, str], where: str = "") -> None:
    """Exit naming the override if one of `overrides` sets a key of `keys` ({key: what sets it instead}): the
    settings a bench compares or counts by (the agent of an arm, the steps, the seed) are its own options."""
    for override in overrides:
        key = override_key(override)
        if key in keys:
            raise SystemExit(f"{where}{override}: {key} is set by the bench ({keys[key]}), not by an override")


def compose_config(overrides: list[str]):
    """The config `robotrl-train <overrides>` composes (Hydra's compose API, robotrl.configs), unchecked."""
    from hydra import compose, initialize_config_module

    from robotrl.config import register_configs

    register_configs()
    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def train_config(overrides: list[str], run: str = "run", hint: str = ""):
    """The validated TrainConfig that `robotrl-train <overrides>` would run (agent and task as their
    dataclasses, interpolations resolved): a bench composes each run's overrides once before it starts any,
    and reads the settings it reports from here. An unknown key or a bad value exits naming it and `run`
    (and `hint`, where the bench has one)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from robotrl.config import to_train_config

    try:
        return to_train_config(compose_config(overrides))
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise SystemExit(f"{run}: bad override: {e}{hint}") from None


def cpu() -> dict:
    """The CPU model and the vector flags that move speed ratios between hosts (AVX2 only, or AVX-512 with
    BF16): every bench line records them, and only ratios from one host and run are compared."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "fma")
    return {"cpu": model, "cpu_flags": [flag for flag in wanted if flag in flags]}


def emit(name: str, figures: dict, save: bool) -> None:
    """Print the benchmark's JSON line last; with --save, append it to bench/results/<name>.jsonl."""
    figures = {
        **figures,
        "bench": name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "host": platform.node(),
        "python": sys.version.split()[0],
        **cpu(),
    }
    line = json.dumps(figures, sort_keys=False)
    if save:
        RESULTS.mkdir(exist_ok=True)
        with (RESULTS / f"{name}.jsonl").open("a") as f:
            f.write(line + "\n")
    print(line, flush=True)


def in_subprocess(module: str, expr: str, threads: int) -> float:
    """Evaluate `expr` (with bench/<module>.py imported as `b`) in a fresh Python process on `threads` torch
    threads and return the number it prints: process-wide settings (the allocator, OpenMP pools) stay per
    side, and neither side warms or pollutes the other's caches."""
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import torch; "
        f"torch.set_num_threads({threads}); import {module} as b; print({expr})"
    )
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{module}: {expr} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


# What a training run executes: a run measured with other contents of these is not a run of this code.
RUN_SOURCES = ("robotrl", "tasks", "configs")


def source_digest() -> str:
    """sha256 over the path and bytes of every file under RUN_SOURCES (caches aside), in path order."""
    digest = hashlib.sha256()
    for top in RUN_SOURCES:
        for path in sorted((REPO / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def stop_process(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM `process` and wait `timeout` s for it (reading what it printed, if piped); then kill it."""
    process.terminate()
    try:
        process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()


def run_logged(cmd: list[str], log: Path) -> None:
    """Run `cmd` from the repository root on one thread (MUJOCO_GL=egl), its output into `log`; a failure
    raises with the log's last lines."""
    env = dict(os.environ, MUJOCO_GL="egl", OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="1")
    with log.open("w") as out:
        done = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({done.returncode}); log {log}:\n{tail}")


def record_scripted_demos(
    task: str, out: Path, episodes: int, seed: int, reward: str = "dense", disturb_steps: int = 0
) -> None:
    """`episodes` successful demonstrations of `task` by its scripted expert into the dataset `out`, as
    `robotrl-record teleop=scripted keep=success` writes them (`disturb_steps`: each starts after up to that
    many unrecorded noisy expert steps)."""
    from robotrl.tasks import TASK_CONFIGS

    from robotrl.record import RecordConfig, record

    task_cfg = TASK_CONFIGS[task](name=task, reward=reward)
    settings = RecordConfig(
        task=task_cfg, teleop="scripted", episodes=episodes, seed=seed, keep="success", disturb_steps=disturb_steps
    )
    summary = record(settings, out)
    if summary["episodes"] != episodes:
        raise RuntimeError(f"recorded {summary['episodes']} of {episodes} demonstrations of {task}: {summary}")


def train_sac(run_dir: Path, *overrides: str) -> dict:
    """Train the default job (SAC on the default task) in this process into `run_dir`, with Hydra `overrides`,
    as `robotrl-train` does (its config.yaml saved, so `robotrl-eval run=<run_dir>` reads it); no video, no
    progress bar, one checkpoint at the end. Returns the run's summary (its final evaluation)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from robotrl.config import apply_backend, register_configs, to_train_config
    from robotrl.runtime.loop import train

    register_configs()
    quiet = ["checkpoint_interval=1000000", "video=false", "progress=false"]
    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*quiet, *overrides])
    apply_backend(cfg)
    train_cfg = to_train_config(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    return train(train_cfg, run_dir)
