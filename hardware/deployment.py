"""A run directory or a policy bundle loaded for a robot: its deploy spec and its policy, with no simulator and no
robot env imported.

robotrl-train and robotrl-learner write `deploy_spec.json` (robotrl/core/deploy_spec.py) into the run directory
when the run starts. A run made before they did has none: `load_deploy_spec` then derives it once from the run's
config.yaml, building the simulated env as deployment used to, writes it, and logs that it did.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from robotrl.tasks import deploy_spec_for

from robotrl.agents import make_agent
from robotrl.core.deploy_spec import DeploySpec, DeploySpecError, read_deploy_spec, spec_path, write_deploy_spec
from robotrl.core.policy_bundle import BundleError, PolicyBundle, load_bundle
from robotrl.runtime.assembly import make_training_env, resolve_device
from robotrl.runtime.checkpoint import latest_checkpoint, load_checkpoint
from robotrl.runtime.run_config import load_run_config

log = logging.getLogger(__name__)


def load_deploy_spec(run: str | Path, train_cfg: Any = None) -> DeploySpec:
    """The deploy spec of run directory `run` (`train_cfg`: its config, when already loaded). Unreadable or
    invalid, or from a newer robotrl: DeploySpecError naming the file and what is wrong. Missing (a run from
    before deploy specs): derived from config.yaml (a simulated env is built for it), written, logged."""
    run_dir = Path(run)
    path = spec_path(run_dir)
    if path.exists():
        spec = read_deploy_spec(path)
        if train_cfg is not None and spec.task != train_cfg.task.name:
            raise DeploySpecError(
                f"{path}: its task is {spec.task!r}, the run's config.yaml trains {train_cfg.task.name!r}"
            )
        return spec
    train_cfg = train_cfg if train_cfg is not None else load_run_config(run_dir)
    env = make_training_env(train_cfg, num_envs=1)  # as deployment did before runs carried their spec
    try:
        spec = deploy_spec_for(train_cfg.task, train_cfg.agent.frame_stack, env=env)
    finally:
        env.close()
    try:
        write_deploy_spec(spec, run_dir)
    except OSError as error:  # a run directory one may read but not write: deploy all the same
        log.warning("%s: derived the deploy spec from config.yaml but could not write it: %s", path, error)
    else:
        log.info("%s: the run has no deploy spec (made before runs carried one); derived it from config.yaml", path)
    return spec


def load_policy(run: str | Path, device: str = "cpu") -> tuple[Any, DeploySpec, str]:
    """(agent in evaluation mode, deploy spec, checkpoint name) of run directory `run` (robotrl-train's, or
    robotrl-learner's: a fine-tuning session), its policy built for the spec's observations and actions."""
    run_dir = Path(run)
    train_cfg = load_run_config(run_dir)
    spec = load_deploy_spec(run_dir, train_cfg)
    agent = make_agent(train_cfg.agent, spec.obs_spec(), spec.action_dim, resolve_device(device))
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    load_checkpoint(ckpt, agent, replay=None, restore_rng=False)
    agent.eval()
    return agent, spec, ckpt.name


class BundlePolicy:
    """A verified policy bundle (robotrl/core/policy_bundle.py) in the place of an agent: `act` runs its graph in
    onnxruntime on the CPU. The graph holds no state (frame stacks are inputs), so the evaluation clock is a no-op."""

    device = torch.device("cpu")

    def __init__(self, bundle: PolicyBundle):
        self.bundle = bundle

    def reset_evaluation(self, num_envs: int) -> None:
        pass

    def advance_evaluation(self, episode_start: torch.Tensor) -> None:
        pass

    def act(self, obs: Mapping[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        if not deterministic:
            raise ValueError("a policy bundle acts deterministically only")
        return torch.from_numpy(self.bundle.act({key: value.cpu().numpy() for key, value in obs.items()}))


def load_bundle_policy(path: str | Path) -> tuple[BundlePolicy, DeploySpec, str]:
    """(policy, deploy spec, source checkpoint) of the policy bundle in directory `path`, every file checked against
    the manifest's sha256 and the spec against the graph (`load_bundle`). Its actions go to a robot env as they
    are, so the bundle's action bounds must be the robot env's, [-1, 1]: BundleError otherwise."""
    bundle = load_bundle(path)
    unit = (tuple([-1.0] * bundle.manifest.action_dim), tuple([1.0] * bundle.manifest.action_dim))
    if (bundle.manifest.action_low, bundle.manifest.action_high) != unit:
        raise BundleError(
            f"policy={str(path)!r}: its actions are in {list(bundle.manifest.action_low)}.."
            f"{list(bundle.manifest.action_high)}; a robot env takes [-1, 1] in each dimension"
        )
    return BundlePolicy(bundle), bundle.spec, bundle.manifest.checkpoint
