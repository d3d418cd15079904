"""Atomic checkpoints of the whole training state, as safetensors plus JSON (nothing pickled).

A checkpoint is a directory `checkpoints/step_<N>/`, written under a temporary name, fsynced and
renamed; the `checkpoints/latest` pointer is then replaced atomically. A process killed at any moment
therefore leaves `latest` naming a complete checkpoint. Its last file, `manifest.json`, holds the sha256 of
every other one; loads check them, and the weights' finiteness, before restoring anything
(`checkpoint_files.py`). `latest` is followed only to a name the saver writes, inside `checkpoints/`.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from robotrl.agents.base import Agent
from robotrl.core.durable import fsync_dir, write_atomic
from robotrl.data.replay import ReplayBuffer
from robotrl.runtime.checkpoint_files import (
    CheckpointError,
    CheckpointFiles,
    first_non_finite,
    write_json,
    write_manifest,
)

__all__ = ["CheckpointError", "kept_checkpoint_note", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]

LATEST = "latest"
# the only directory names the saver writes, and so the only ones `latest` may hold
_STEP_DIR = re.compile(r"step_\d{9,}")
_TEMP_DIR = re.compile(r"\.tmp_step_\d{9,}_\d+")


def _save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path))
    with path.open("rb") as f:
        os.fsync(f.fileno())


def _optimizer_state(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    state = opt.state_dict()
    tensors, scalars = {}, {}
    for param_id, slots in state["state"].items():
        for slot, value in slots.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{param_id}.{slot}"] = value
            else:
                scalars[f"{param_id}.{slot}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


STEP_IMPLEMENTATION = ("capturable", "fused", "foreach", "differentiable")  # optimizer flags, not state


def _load_optimizer_state(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        param_id, slot = key.split(".", 1)
        state.setdefault(int(param_id), {})[slot] = value
    for key, value in meta["scalars"].items():
        param_id, slot = key.split(".", 1)
        state.setdefault(int(param_id), {})[slot] = value
    # How a step is computed belongs to this run's optimizer, not to the run that saved it: a run resumed with
    # agent.compile=true on a GPU needs its capturable step (a CUDA graph records it), one resumed on a CPU not.
    groups = [
        {**saved, **{flag: live[flag] for flag in STEP_IMPLEMENTATION if flag in live}}
        for saved, live in zip(meta["param_groups"], opt.param_groups, strict=False)
    ]
    groups += meta["param_groups"][len(groups) :]  # a count that differs: load_state_dict names the mismatch
    opt.load_state_dict({"state": state, "param_groups": groups})


def _rng_state() -> tuple[dict[str, torch.Tensor], dict]:
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = s
    np_state = np.random.get_state()  # noqa: NPY002  (the global RNG third-party code may use)
    meta = {
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }
    return tensors, meta


def _set_rng_state(tensors: dict[str, torch.Tensor], meta: dict) -> None:
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("cuda."))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    kind, keys, *rest = meta["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))  # noqa: NPY002
    version, internal, gauss = meta["python"]
    random.setstate((version, tuple(internal), gauss))


def _check_finite(agent: Agent) -> None:
    if (name := first_non_finite(agent.state_dict())) is not None:
        raise FloatingPointError(f"agent parameter {name!r} is not finite; refusing to checkpoint it")


def save_checkpoint(
    ckpt_root: Path,
    step: int,
    agent: Agent,
    replay: ReplayBuffer | None,
    counters: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write the checkpoint for `step` and point `latest` at it; returns its directory."""
    _check_finite(agent)
    ckpt_root.mkdir(parents=True, exist_ok=True)
    _finish_interrupted_replace(ckpt_root)
    final = ckpt_root / f"step_{step:09d}"
    tmp = ckpt_root / f".tmp_step_{step:09d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()

    _save_tensors(tmp / "agent.safetensors", agent.state_dict())
    optim_meta = {}
    for name, opt in agent.optimizers().items():
        tensors, meta = _optimizer_state(opt)
        _save_tensors(tmp / f"optim_{name}.safetensors", tensors)
        optim_meta[name] = meta
    if replay is not None:
        _save_tensors(tmp / "replay.safetensors", replay.state_dict())
    rng_tensors, rng_meta = _rng_state()
    _save_tensors(tmp / "rng.safetensors", rng_tensors)
    write_json(
        tmp / "state.json",
        {
            "step": step,
            "counters": counters,
            "optimizers": optim_meta,
            "rng": rng_meta,
            "has_replay": replay is not None,
        },
    )
    write_manifest(tmp)
    fsync_dir(tmp)

    if final.exists():  # the same step again (an interrupt right after a periodic checkpoint, a resumed
        # finished run): `latest` may name `final`, so it names the complete new copy while `final` is replaced
        _point_latest(ckpt_root, tmp.name)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _point_latest(ckpt_root, final.name)

    older = sorted(p for p in ckpt_root.glob("step_*") if p.name < final.name)
    for old in older[: max(len(older) - (keep - 1), 0)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _finish_interrupted_replace(ckpt_root: Path) -> None:
    """`latest` names a complete `.tmp_step_*` copy when a save of an existing step was interrupted between
    removing the old copy and renaming the new one: finish that rename before anything touches temp dirs."""
    name = _pointed_name(ckpt_root)
    if name is None or not _TEMP_DIR.fullmatch(name) or not (ckpt_root / name).is_dir():
        return
    final = ckpt_root / name.removeprefix(".tmp_").rsplit("_", 1)[0]
    shutil.rmtree(final, ignore_errors=True)
    os.replace(ckpt_root / name, final)
    _point_latest(ckpt_root, final.name)


def _point_latest(ckpt_root: Path, name: str) -> None:
    """Atomically make `latest` name the checkpoint directory `name`."""
    write_atomic(ckpt_root / LATEST, name.encode())


def _pointed_name(ckpt_root: Path) -> str | None:
    """The directory name `latest` holds (None without a pointer), refused unless it is one the saver writes and
    stays inside `ckpt_root`: a save deletes and renames what the pointer names."""
    pointer = ckpt_root / LATEST
    try:
        name = pointer.read_text().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(pointer, f"cannot read the checkpoint pointer: {err}") from None
    if not (_STEP_DIR.fullmatch(name) or _TEMP_DIR.fullmatch(name)):
        raise CheckpointError(pointer, f"names {name!r}, not a checkpoint directory of {ckpt_root} (step_<9 digits>)")
    if (ckpt_root / name).resolve().parent != ckpt_root.resolve():  # a link out of checkpoints/
        raise CheckpointError(pointer, f"names {name!r}, which leads outside {ckpt_root}")
    return name


def kept_checkpoint_note(ckpt_root: Path, resume_with: str) -> str:
    """What a run stopped by a non-finite value still has: its last good checkpoint (nothing is saved after the
    value), and how to resume from it, or that none was written yet."""
    try:
        path = latest_checkpoint(ckpt_root)
    except FileNotFoundError:
        return "no checkpoint had been written yet, so there is nothing to resume from"
    except CheckpointError as err:
        return f"no checkpoint can be resumed from ({err})"
    return f"the last good checkpoint, {path.name}, is kept ({resume_with} restarts from it)"


def latest_checkpoint(ckpt_root: Path) -> Path:
    pointer = ckpt_root / LATEST
    name = _pointed_name(ckpt_root)
    if name is None:
        raise FileNotFoundError(f"no checkpoint in {ckpt_root} (missing {pointer})")
    path = ckpt_root / name
    if not (path / "state.json").exists():
        raise FileNotFoundError(f"checkpoint {path} named by {pointer} is incomplete or missing")
    return path


def load_checkpoint(
    path: Path, agent: Agent, replay: ReplayBuffer | None = None, restore_rng: bool = True
) -> dict[str, Any]:
    """Restore agent (+ optimizers), optionally the replay buffer and RNGs; returns the saved counters.

    Every file is read and checked (checksum, format, finite weights) before anything is restored: a bad file
    raises CheckpointError naming it before `agent` or `replay` is touched."""
    files = CheckpointFiles(path)
    state = files.json("state.json")
    agent_tensors = files.tensors("agent.safetensors", agent.device, finite=True)
    optim_tensors = {
        name: files.tensors(f"optim_{name}.safetensors", agent.device, finite=True) for name in agent.optimizers()
    }
    replay_tensors = None
    if replay is not None:
        if not state.get("has_replay"):
            raise FileNotFoundError(f"checkpoint {path} holds no replay buffer (checkpoint_replay was off)")
        replay_tensors = files.tensors("replay.safetensors", replay.device)
    rng_tensors = files.tensors("rng.safetensors") if restore_rng else None
    try:
        optim_meta = {name: state["optimizers"][name] for name in optim_tensors}
        rng_meta, counters = state["rng"], state["counters"]
    except (KeyError, TypeError) as err:
        raise CheckpointError(path / "state.json", f"lacks the entry {err}") from None

    agent.load_state_dict(agent_tensors)
    for name, opt in agent.optimizers().items():
        _load_optimizer_state(opt, optim_tensors[name], optim_meta[name])
    if replay_tensors is not None:
        replay.load_state_dict(replay_tensors)
    if rng_tensors is not None:
        _set_rng_state(rng_tensors, rng_meta)
    return counters
