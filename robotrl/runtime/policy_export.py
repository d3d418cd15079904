"""Export a run's policy as a bundle (robotrl/core/policy_bundle.py): one graph (ONNX, or a torch.export program
with `format=pt2`) from the raw observation entries to the action in the task's bounds, beside the run's deploy
spec and a manifest of hashes.

The graph is the agent's own deterministic `act` (`DeterministicPolicy`), traced by torch's exporter
(`torch.onnx.export(..., dynamo=True)`; for pt2 `torch.export.export`, which the ONNX exporter also starts from),
so it holds whatever that computes: the observation normaliser, the
encoders (camera entries uint8 [B, frame_stack * 3, H, W], the stack an input the caller fills, oldest frame
first), the mean, tanh, and an affine map from [-1, 1] to the deploy spec's action bounds. It always computes in
float32: an agent trained with `precision=bf16` acts in bf16 under torch, so its bundle is the more exact of
the two. Before anything is written the exported graph is loaded as a robot loads it (onnxruntime, or torch for
pt2) and run against the eager policy on drawn observations; a difference above `PARITY_TOL` is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from robotrl.agents import make_agent
from robotrl.agents.drqv2 import DrQv2
from robotrl.agents.sac import SAC, GSDEActor
from robotrl.core.checksum import sha256_of_bytes
from robotrl.core.deploy_spec import DeploySpec, read_deploy_spec, spec_path
from robotrl.core.durable import fsync_dir, write_atomic
from robotrl.core.policy_bundle import (
    FORMAT_VERSION as BUNDLE_FORMAT_VERSION,
)
from robotrl.core.policy_bundle import (
    FORMATS,
    INPUTS_METADATA,
    INSTALL_HINT,
    MANIFEST_FILE,
    SPEC_FILE,
    SPEC_METADATA,
    VERSION_METADATA,
    BundleInput,
    BundleManifest,
    load_bundle,
)
from robotrl.runtime.assembly import privileged_entry
from robotrl.runtime.checkpoint import latest_checkpoint, load_checkpoint
from robotrl.runtime.run_config import load_run_config, run_config_file
from robotrl.tasks import deploy_spec_for

log = logging.getLogger(__name__)

EXPORTABLE_AGENTS = ("sac", "drqv2")
OUTPUT = "action"
OPSET = 18
PARITY_SAMPLES = 64  # drawn observations the export checks onnxruntime against torch on
PARITY_TOL = 1e-5  # max |onnxruntime - torch| the export accepts, in action units
MAX_BATCH = 1 << 16
EXPORTER_LOGGERS = ("torch.onnx", "onnxscript", "onnx_ir")


class ExportError(ValueError):
    """An export refused before anything was written: the message names the setting or file."""


class DeterministicPolicy(nn.Module):
    """Raw observation entries (positional, in `keys` order) -> the agent's deterministic action, mapped from
    [-1, 1] to [low, high]. Reads the agent's own modules, so it computes what `agent.act(obs, deterministic=True)`
    does (in float32)."""

    def __init__(self, agent: nn.Module, keys: list[str], low: tuple[float, ...], high: tuple[float, ...]):
        super().__init__()
        if not isinstance(agent, (SAC, DrQv2)):
            raise ExportError(f"cannot export agent {type(agent).__name__}; exportable: {', '.join(EXPORTABLE_AGENTS)}")
        self.agent, self.keys = agent, list(keys)
        low_t, high_t = torch.tensor(low, dtype=torch.float32), torch.tensor(high, dtype=torch.float32)
        self.register_buffer("scale", (high_t - low_t) / 2)
        self.register_buffer("offset", (high_t + low_t) / 2)

    def unit_action(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The deterministic action in [-1, 1], as the agent's `act` computes it."""
        agent = self.agent
        if isinstance(agent, DrQv2):
            return agent.actor(agent.encoder(obs), agent.encoder.state_features(obs)).float()
        features = agent.encoder(obs)
        if isinstance(agent.actor, GSDEActor):  # its mode: tanh of the mean (the noise's variance is not needed)
            return torch.tanh(agent.actor.latent_and_mean(features)[1].float())
        return agent.actor(features).mode.float()

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.unit_action(dict(zip(self.keys, inputs, strict=True))) * self.scale + self.offset


def draw_observations(spec: DeploySpec, batch: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Observations to check the graph on: uniform uint8 frames, standard-normal state entries."""
    obs = {}
    for key, entry in spec.observations.items():
        shape = (batch, *entry.shape)
        if entry.dtype == "uint8":
            obs[key] = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
        else:
            obs[key] = torch.randn(shape, generator=generator)
    return obs


def _checkpoint_path(run_dir: Path, checkpoint: str | None) -> Path:
    root = run_dir / "checkpoints"
    if checkpoint is None:
        return latest_checkpoint(root)
    path = root / checkpoint
    if "/" in checkpoint or checkpoint in (".", "..") or not (path / "state.json").is_file():
        names = sorted(p.name for p in root.iterdir() if (p / "state.json").is_file()) if root.is_dir() else []
        raise ExportError(f"checkpoint={checkpoint!r}: no such checkpoint in {root} (there are: {names or 'none'})")
    return path


def run_deploy_spec(run_dir: Path, train_cfg: Any) -> tuple[DeploySpec, bytes]:
    """The run's deploy spec and the bytes the bundle carries: its deploy_spec.json as written; for a run made
    before runs carried one, derived from its config.yaml (`robotrl.tasks.deploy_spec_for`) and carried in the
    bundle only, the run left as it is. ValueError naming the task for one no robot runs (`gym`)."""
    path = spec_path(run_dir)
    if path.is_file():
        return read_deploy_spec(path), path.read_bytes()
    spec = deploy_spec_for(train_cfg.task, train_cfg.agent.frame_stack)
    spec.validate()
    log.info("%s: the run has no deploy spec (made before runs carried one); derived it from config.yaml", path)
    return spec, (json.dumps(spec.to_json(), indent=2) + "\n").encode("utf-8")


def load_exportable(run: str | Path, checkpoint: str | None = None) -> tuple[nn.Module, DeploySpec, bytes, Path, str]:
    """(agent in evaluation mode on the CPU, deploy spec, its bytes, checkpoint path, agent name) of run
    directory `run`. ExportError, ValueError or FileNotFoundError naming what is wrong: not a run, an agent that
    cannot be exported, a task no robot runs, no such checkpoint."""
    run_dir = Path(run)
    run_config_file(run_dir)  # FileNotFoundError naming run= where it is no run directory
    train_cfg = load_run_config(run_dir)
    name = train_cfg.agent.name
    if name not in EXPORTABLE_AGENTS:
        raise ExportError(
            f"run={str(run)!r} trains agent {name!r}; robotrl-export exports {', '.join(EXPORTABLE_AGENTS)}"
        )
    spec, spec_bytes = run_deploy_spec(run_dir, train_cfg)
    ckpt = _checkpoint_path(run_dir, checkpoint)
    obs_spec = {**spec.obs_spec(), **privileged_entry(run_dir)}  # the critic's input, for its weights to load
    agent = make_agent(train_cfg.agent, obs_spec, spec.action_dim, torch.device("cpu"))
    load_checkpoint(ckpt, agent, replay=None, restore_rng=False)
    agent.eval()
    return agent, spec, spec_bytes, ckpt, name


def _onnx_bytes(policy: DeterministicPolicy, example: tuple[torch.Tensor, ...]) -> bytes:
    """The ONNX graph of `policy`, its first dimension dynamic, from torch's exporter (its progress chatter on
    stdout, its INFO logs and its warnings about its own internals dropped; errors still raise)."""
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    chatter = io.StringIO()
    with contextlib.redirect_stdout(chatter), torch.no_grad(), warnings.catch_warnings(), _quiet(EXPORTER_LOGGERS):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            policy,
            example,
            dynamo=True,
            input_names=policy.keys,
            output_names=[OUTPUT],
            dynamic_shapes=(tuple({0: batch} for _ in policy.keys),),
            opset_version=OPSET,
            optimize=True,
            verbose=False,
        )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "policy.onnx"
        program.save(path)
        return path.read_bytes()


def _pt2_bytes(policy: DeterministicPolicy, example: tuple[torch.Tensor, ...], metadata: dict[str, str]) -> bytes:
    """The torch.export program of `policy`, its first dimension dynamic, saved with `metadata` and its inputs'
    names as extra files."""
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    with torch.no_grad():
        program = torch.export.export(policy, example, dynamic_shapes=(tuple({0: batch} for _ in policy.keys),))
    buffer = io.BytesIO()
    torch.export.save(program, buffer, extra_files={**metadata, INPUTS_METADATA: json.dumps(policy.keys)})
    return buffer.getvalue()


def _with_metadata(graph: bytes, metadata: dict[str, str]) -> bytes:
    """`graph` with `metadata` in its model's metadata_props (what onnxruntime reports as custom metadata)."""
    import onnx  # the export extra, present wherever torch's exporter ran

    model = onnx.load_from_string(graph)
    for key, value in metadata.items():
        model.metadata_props.add(key=key, value=value)
    return model.SerializeToString()


def require_exporter(fmt: str = "onnx") -> None:
    """ExportError naming the extra where torch's ONNX exporter or onnxruntime is missing (a pt2 program needs
    torch alone)."""
    for module in ("onnx", "onnxscript", "onnxruntime") if fmt == "onnx" else ():
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ExportError(f"robotrl-export needs {module}: {INSTALL_HINT} ({error})") from None


def default_out(run: str | Path, checkpoint: str, fmt: str) -> Path:
    return Path(run) / "bundles" / f"{checkpoint}_{fmt}"


def _check_out(out: Path, key: str = "out") -> None:
    if out.exists():
        raise ExportError(f"{key}={str(out)!r} already exists: give a new directory for the bundle")


@contextlib.contextmanager
def _quiet(names: tuple[str, ...]):
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def export_bundle(
    run: str | Path, out: str | Path | None = None, fmt: str = "onnx", checkpoint: str | None = None
) -> tuple[Path, dict[str, Any]]:
    """Export run directory `run`'s policy (`checkpoint`, default the latest) as a bundle at `out` (a directory
    that must not exist yet; default `<run>/bundles/<checkpoint>_<format>`), written whole or not at all: built in
    a sibling temporary directory, verified with `load_bundle` and a parity check, then renamed into place.
    Returns (the bundle's path, its manifest's JSON)."""
    if fmt not in FORMATS:
        raise ExportError(f"format={fmt!r}: robotrl-export writes {', '.join(FORMATS)}")
    require_exporter(fmt)
    if out is not None:
        _check_out(Path(out))
        if not Path(out).parent.is_dir():
            raise ExportError(f"out={str(out)!r}: its parent directory {Path(out).parent} does not exist")
    agent, spec, spec_bytes, ckpt, name = load_exportable(run, checkpoint)
    out_dir = Path(out) if out is not None else default_out(run, ckpt.name, fmt)
    _check_out(out_dir, "out" if out is not None else "the default out")
    keys = sorted(spec.observations)
    policy = DeterministicPolicy(agent, keys, spec.action_low, spec.action_high).eval()
    generator = torch.Generator().manual_seed(0)
    example = draw_observations(spec, 2, generator)
    # the deploy spec travels inside the graph too: a graph copied alone still says what it expects
    metadata = {SPEC_METADATA: spec_bytes.decode("utf-8"), VERSION_METADATA: str(BUNDLE_FORMAT_VERSION)}
    inputs = tuple(example[key] for key in keys)
    if fmt == "onnx":
        graph = _with_metadata(_onnx_bytes(policy, inputs), metadata)
    else:
        graph = _pt2_bytes(policy, inputs, metadata)
    manifest = BundleManifest(
        format=fmt,
        agent=name,
        run=str(Path(run).resolve()),
        checkpoint=ckpt.name,
        inputs=tuple(
            BundleInput(key, tuple(spec.observations[key].shape), spec.observations[key].dtype) for key in keys
        ),
        output=OUTPUT,
        action_dim=spec.action_dim,
        action_low=tuple(map(float, spec.action_low)),
        action_high=tuple(map(float, spec.action_high)),
        sha256={FORMATS[fmt]: sha256_of_bytes(graph), SPEC_FILE: sha256_of_bytes(spec_bytes)},
        parity={},
        opset=OPSET if fmt == "onnx" else 0,
    )
    made_parent = not out_dir.parent.exists()  # the default out's bundles/: removed again if the export fails
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        write_atomic(tmp / FORMATS[fmt], graph)
        write_atomic(tmp / SPEC_FILE, spec_bytes)
        _write_manifest(tmp, manifest)
        observations = draw_observations(spec, PARITY_SAMPLES, generator)
        diff = max_action_diff(policy, load_bundle(tmp), observations)
        if not diff <= PARITY_TOL:
            raise ExportError(
                f"the exported graph's actions differ from torch's by {diff:.3g} (> {PARITY_TOL}) on "
                f"{PARITY_SAMPLES} drawn observations: not written"
            )
        manifest = dataclasses.replace(manifest, parity={"max_abs_action_diff": diff, "samples": PARITY_SAMPLES})
        _write_manifest(tmp, manifest)
        os.chmod(tmp, 0o755)  # mkdtemp's 0o700 would keep the bundle from whoever deploys it
        os.rename(tmp, out_dir)
        fsync_dir(out_dir.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if made_parent:
            with contextlib.suppress(OSError):
                out_dir.parent.rmdir()
        raise
    log.info("exported %s (%s, checkpoint %s) to %s", run, name, ckpt.name, out_dir)
    return out_dir, manifest.to_json()


def _write_manifest(bundle: Path, manifest: BundleManifest) -> None:
    write_atomic(bundle / MANIFEST_FILE, (json.dumps(manifest.to_json(), indent=2) + "\n").encode("utf-8"))


@torch.no_grad()
def max_action_diff(policy: DeterministicPolicy, bundle: Any, observations: Mapping[str, torch.Tensor]) -> float:
    """max |bundle.act - policy| over `observations` (torch tensors on the CPU), in action units."""
    eager = policy(*(observations[key] for key in policy.keys))
    ort = bundle.act({key: value.numpy() for key, value in observations.items()})
    return float((eager - torch.from_numpy(ort)).abs().max())
