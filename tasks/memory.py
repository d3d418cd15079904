"""Will `num_envs` copies of a task's scene fit? An estimate made before any backend is built.

The estimate is per-env state times `num_envs` plus a backend's fixed cost, against the memory the
backend would allocate from: the CPU's available RAM, or the free CUDA memory where Genesis or MuJoCo Warp
would run on a GPU. Per env it counts a probe of the task's own scene (one MuJoCo `MjData`: its buffer and the
arena one control step uses) plus the per-env overhead each backend showed on top of it, measured as
resident-memory growth from 16 to 256 envs (Genesis hand_reorient also 1024), 2026-11, 2 CPU cores:

- mujoco: 0.50 MB per env on panda_pick_cube (reach 0.49, hand_reorient 0.54; the MjData probe is 37-56 KB
  of that);
- genesis (CPU backend): per env, probe included, panda_reach 0.42 MB, panda_pick_cube 0.64, panda_push
  0.66, panda_peg_insert 0.88, hand_reorient 0.97 (0.97 to 1024 envs: linear), plus about 0.4 GB for the
  scene and its kernels whatever `num_envs` is (0.48 GB counted). Genesis's buffers grow with the scene's
  collision pairs and dofs in a way the MjData probe does not follow, so its overhead is the largest
  measured one (hand_reorient's) with 10% headroom, for every scene: hand_reorient is estimated at 1.07 MB
  per env, panda_reach over-estimated 2.5x. On CUDA the same figures are used against free GPU memory (not
  measured there; on an H100, 32768 panda_pick_cube envs, estimated at 33 GB, passed and ran, 2026-11-24).
- mujoco_warp (warp's CPU device, the backend's nconmax and njmax), 2026-11-29, growth from 256 to 1024 envs:
  per env, probe included, panda_reach 0.22 MB, panda_pick_cube 0.26, panda_push 0.25, panda_peg_insert 0.25,
  hand_reorient 0.44 (0.39 beyond its probe), plus about 0.25 GB for the loaded kernels and the nominal model
  whatever `num_envs` is (0.3 GB counted). As for Genesis, the largest overhead (hand_reorient's) with 10% headroom
  is used for every scene, and on CUDA the same figures against free GPU memory (not measured there). Frames (videos,
  pixel observations) add a C MuJoCo copy of each env on the CPU (the mujoco figure), not counted here.

It is an estimate: a `num_envs` far beyond the machine fails here, with the figure, instead of deep
inside a simulator's allocation; one near the limit may pass on MuJoCo (within about 15%) or be refused
on Genesis for a small scene.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from robotrl.core.memory import available_bytes

MB = 1 << 20
GB = 1 << 30
# beyond the MjData probe
PER_ENV_OVERHEAD = {"mujoco": int(0.48 * MB), "genesis": int(1.02 * MB), "mujoco_warp": int(0.43 * MB)}
FIXED = {"mujoco": 0, "genesis": int(0.48 * GB), "mujoco_warp": int(0.3 * GB)}


@cache
def scene_state_bytes(xml: str) -> int:
    """One env's MuJoCo state for the scene: MjData's buffer and the arena a control step uses."""
    import mujoco

    model = mujoco.MjModel.from_xml_path(xml)
    data = mujoco.MjData(model)
    mujoco.mj_step(model, data, 20)
    return int(data.nbuffer + data.maxuse_arena)


def bytes_needed(kind: str, xml: str | Path, num_envs: int) -> int:
    return FIXED[kind] + num_envs * (PER_ENV_OVERHEAD[kind] + scene_state_bytes(str(xml)))


def available_memory(kind: str) -> tuple[str, int]:
    """(where the backend allocates its state, free bytes there): Genesis and MuJoCo Warp run on CUDA whenever torch
    sees a GPU (robotrl/tasks/genesis_backend.py, warp_backend.py), MuJoCo on the CPU."""
    import torch

    on_gpu = kind in ("genesis", "mujoco_warp") and torch.cuda.is_available()
    return available_bytes(torch.device("cuda" if on_gpu else "cpu"))


def check_num_envs_fits(kind: str, xml: str | Path, num_envs: int) -> None:
    """Raise MemoryError, naming the memory `num_envs` would need, where it cannot fit."""
    need = bytes_needed(kind, xml, num_envs)
    where, free = available_memory(kind)
    if need > free:
        per_env = (need - FIXED[kind]) / num_envs
        raise MemoryError(
            f"num_envs={num_envs} on the {kind} backend needs about {need / GB:.1f} GB ({per_env / MB:.2f} MB per env "
            f"for {Path(xml).name}{f' + {FIXED[kind] / GB:.2f} GB fixed' if FIXED[kind] else ''}), but the {where} "
            f"is {free / GB:.1f} GB; at most about {max(0, (free - FIXED[kind]) // per_env):.0f} envs fit"
        )
