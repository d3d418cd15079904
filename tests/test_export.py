"""robotrl-export: a tiny trained SAC (state) and DrQ-v2 (pixels) run exported as bundles whose onnxruntime actions
equal torch's deterministic actions on recorded observations; bad input refused before anything is written."""

import hashlib
import io
import json
import shutil
import sys
import zipfile

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime", reason="the export extra (onnxruntime) is not installed")
pytest.importorskip("onnxscript", reason="the export extra (onnxscript, torch's ONNX exporter) is not installed")

from helpers import run_module

from robotrl.agents import make_agent
from robotrl.core.policy_bundle import MANIFEST_FILE, BundleError, load_bundle
from robotrl.runtime import policy_export
from robotrl.runtime.assembly import make_training_env
from robotrl.runtime.checkpoint import latest_checkpoint, load_checkpoint
from robotrl.runtime.run_config import load_run_config

TOL = 1e-5
COMMON = [
    "task=panda_reach",
    "log_interval=100",
    "eval_interval=100000",
    "video=false",
    "progress=false",
    "replay_capacity=5000",
]
SAC_RUN = [
    *COMMON,
    "total_steps=300",
    "learning_starts=100",
    "checkpoint_interval=300",
    "agent.batch_size=32",
    "agent.actor_hidden=[32,32]",
    "agent.critic_hidden=[32,32]",
    "agent.obs_norm=true",  # the normaliser's statistics are part of the graph
]
DRQ_RUN = [
    *COMMON,
    "agent=drqv2_light",
    "agent.precision=fp32",  # the bundle computes in float32; a bf16 agent's torch actions are the coarser ones
    "agent.obs_norm=true",
    "task.obs=state+pixels",
    "task.image_size=64",
    "total_steps=200",
    "learning_starts=100",
    "checkpoint_interval=200",
    "agent.batch_size=16",
    "agent.hidden=[32]",
]


class TrainedRuns:
    """The tiny runs, each trained on first use: a worker that runs only the state tests (the DDS one runs
    apart from the others) trains no pixel policy."""

    ARGS = {"state": SAC_RUN, "pixels": DRQ_RUN}

    def __init__(self, root):
        self.root, self.made = root, {}

    def __getitem__(self, kind: str):
        if kind not in self.made:
            run_module("robotrl.train", *self.ARGS[kind], f"hydra.run.dir={self.root / kind}")
            self.made[kind] = self.root / kind
        return self.made[kind]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return TrainedRuns(tmp_path_factory.mktemp("export_runs"))


def recorded_observations(run_dir, steps: int, num_envs: int = 8):
    """Observations from rollouts of the run's own policy, a little noise added so that they spread."""
    cfg = load_run_config(run_dir)
    env = make_training_env(cfg, num_envs=num_envs)
    agent = make_agent(cfg.agent, env.obs_spec, env.action_dim, torch.device("cpu"))
    load_checkpoint(latest_checkpoint(run_dir / "checkpoints"), agent, replay=None, restore_rng=False)
    agent.eval()
    obs, recorded = env.reset(seed=3), []
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        recorded.append({k: v.clone() for k, v in obs.items()})
        action = agent.act(obs, deterministic=True)
        action = (action + 0.3 * torch.randn(action.shape, generator=generator)).clamp(-1, 1)
        obs = env.step(action).next_obs
    env.close()
    return agent, {k: torch.cat([o[k] for o in recorded]) for k in recorded[0]}


@pytest.mark.slow
@pytest.mark.parametrize("kind, steps", [("state", 40), ("pixels", 25)])
@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_the_bundle_acts_as_torch_does_on_recorded_observations(runs, tmp_path, kind, steps, fmt):
    out = tmp_path / "bundle"
    proc = run_module("robotrl.export", f"run={runs[kind]}", f"format={fmt}", f"out={out}")
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert printed["bundle"] == str(out) and printed["parity"]["max_abs_action_diff"] <= TOL
    bundle = load_bundle(out)
    assert bundle.manifest.format == fmt and (out / f"policy.{fmt}").is_file()
    spec = bundle.spec
    names = {entry.name for entry in bundle.manifest.inputs}
    assert names == set(spec.observations)
    if kind == "pixels":
        frames = spec.observations["pixels_front"]
        assert frames.dtype == "uint8" and frames.shape == (3 * spec.frame_stack, 64, 64)

    agent, obs = recorded_observations(runs[kind], steps)
    total = next(iter(obs.values())).shape[0]
    assert total >= 200
    eager = agent.act(obs, deterministic=True).numpy()
    low, high = np.array(spec.action_low), np.array(spec.action_high)
    eager = low + (eager + 1) / 2 * (high - low)
    whole = bundle.act({k: v.numpy() for k, v in obs.items()})
    assert whole.dtype == np.float32 and whole.shape == eager.shape
    assert np.abs(whole - eager).max() <= TOL
    for batch in (1, 7):
        for start in range(0, 4 * batch, batch):
            part = bundle.act({k: v[start : start + batch].numpy() for k, v in obs.items()})
            assert part.shape == (batch, spec.action_dim)
            assert np.abs(part - eager[start : start + batch]).max() <= TOL


def _listing(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_bad_input_is_refused_before_anything_is_written(runs, tmp_path):
    run = runs["state"]
    before = _listing(run)
    bad = run_module("robotrl.export", check=False)
    assert bad.returncode == 1 and "run=<run dir>" in bad.stderr
    missing = tmp_path / "no_such_run"
    bad = run_module("robotrl.export", f"run={missing}", check=False)
    assert bad.returncode == 1 and "no_such_run" in bad.stderr and not missing.exists()
    not_a_run = tmp_path / "empty"
    not_a_run.mkdir()
    bad = run_module("robotrl.export", f"run={not_a_run}", check=False)
    assert bad.returncode == 1 and "not a robotrl run directory" in bad.stderr
    assert list(not_a_run.iterdir()) == []
    bad = run_module("robotrl.export", f"run={run}", "format=tflite", check=False)
    assert bad.returncode == 1 and "'tflite'" in bad.stderr
    bad = run_module("robotrl.export", f"run={run}", "checkpoint=step_9", check=False)
    assert bad.returncode == 1 and "'step_9'" in bad.stderr
    bad = run_module("robotrl.export", f"run={run}", f"out={run}", check=False)
    assert bad.returncode == 1 and "already exists" in bad.stderr
    assert _listing(run) == before


def test_an_agent_that_cannot_be_exported_is_named(runs, tmp_path, monkeypatch):
    monkeypatch.setattr(policy_export, "EXPORTABLE_AGENTS", ("drqv2",))
    with pytest.raises(policy_export.ExportError, match=r"agent 'sac'"):
        policy_export.export_bundle(runs["state"], tmp_path / "bundle")
    assert not (tmp_path / "bundle").exists()


def test_a_run_from_before_deploy_specs_gets_one_derived_into_the_bundle_only(runs, tmp_path):
    old = tmp_path / "old_run"
    shutil.copytree(runs["state"], old, ignore=shutil.ignore_patterns("bundles", "replay*"))
    (old / "deploy_spec.json").unlink()
    out, _ = policy_export.export_bundle(old, tmp_path / "bundle")
    assert (out / "deploy_spec.json").read_bytes() == (runs["state"] / "deploy_spec.json").read_bytes()
    assert not (old / "deploy_spec.json").exists()  # the run is left as it was
    load_bundle(out)


@pytest.fixture(scope="module")
def state_bundle(runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundles") / "state"
    policy_export.export_bundle(runs["state"], out)
    return out


def test_a_bundle_whose_hash_does_not_match_is_refused(state_bundle, tmp_path):
    for name in ("policy.onnx", "deploy_spec.json"):
        copy = tmp_path / name
        shutil.copytree(state_bundle, copy)
        data = bytearray((copy / name).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (copy / name).write_bytes(bytes(data))
        with pytest.raises(BundleError, match=rf"{name}: checksum mismatch"):
            load_bundle(copy)


def test_a_pt2_program_is_checked_as_an_onnx_graph_is(runs, tmp_path):
    """The hash before anything loads, the inputs' names against the manifest, the deploy spec inside."""
    out = tmp_path / "pt2"
    policy_export.export_bundle(runs["state"], out, "pt2")
    copy = tmp_path / "tampered"
    shutil.copytree(out, copy)
    data = bytearray((copy / "policy.pt2").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "policy.pt2").write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"policy\.pt2: checksum mismatch"):
        load_bundle(copy)
    renamed = tmp_path / "renamed"
    shutil.copytree(out, renamed)
    manifest = json.loads((renamed / MANIFEST_FILE).read_text())
    manifest["inputs"][0]["name"] = "joint_angles"
    (renamed / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"observation entries .* are not the graph's inputs"):
        load_bundle(renamed)


def _resaved(bundle, out, **extra):
    """A copy of pt2 `bundle` at `out` whose program is saved again with `extra` files changed, the manifest's
    sha256 updated to match: only the graph's own checks can refuse it."""
    shutil.copytree(bundle, out)
    names = {"robotrl.deploy_spec": "", "robotrl.bundle_format_version": "", "robotrl.inputs": ""}
    program = torch.export.load(io.BytesIO((bundle / "policy.pt2").read_bytes()), extra_files=names)
    buffer = io.BytesIO()
    torch.export.save(program, buffer, extra_files={**names, **extra})
    (out / "policy.pt2").write_bytes(buffer.getvalue())
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    manifest["sha256"]["policy.pt2"] = hashlib.sha256(buffer.getvalue()).hexdigest()
    (out / MANIFEST_FILE).write_text(json.dumps(manifest))
    return out


def test_a_pt2_program_whose_inputs_or_spec_differ_or_that_holds_a_pickle_is_refused(runs, tmp_path):
    out = tmp_path / "pt2"
    policy_export.export_bundle(runs["state"], out, "pt2")
    names = [entry.name for entry in load_bundle(out).manifest.inputs]  # arm_qpos [7], arm_qvel [7], ee_pos [3]..
    wrong_shape = json.dumps([names[0], names[2], names[1], *names[3:]])  # arm_qvel's input named ee_pos
    with pytest.raises(BundleError, match=r"policy\.pt2: input .* after the batch, the manifest says"):
        load_bundle(_resaved(out, tmp_path / "shape", **{"robotrl.inputs": wrong_shape}))
    with pytest.raises(BundleError, match=r"policy\.pt2: its inputs .* are not the manifest's"):
        load_bundle(_resaved(out, tmp_path / "names", **{"robotrl.inputs": json.dumps(["a", *names[1:]])}))
    with pytest.raises(BundleError, match=r"the deploy spec inside the graph is not"):
        load_bundle(_resaved(out, tmp_path / "spec", **{"robotrl.deploy_spec": "{}"}))
    pickled = tmp_path / "pickled"  # a payload torch would unpickle is refused before torch reads the archive
    shutil.copytree(out, pickled)

    with zipfile.ZipFile(out / "policy.pt2") as source, zipfile.ZipFile(pickled / "policy.pt2", "w") as target:
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename.endswith("model_weights_config.json"):
                config = json.loads(data)
                next(iter(config["config"].values()))["use_pickle"] = True
                data = json.dumps(config).encode()
            target.writestr(item, data)
    manifest = json.loads((pickled / MANIFEST_FILE).read_text())
    manifest["sha256"]["policy.pt2"] = hashlib.sha256((pickled / "policy.pt2").read_bytes()).hexdigest()
    (pickled / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"marks \[.*\] as pickled; robotrl loads no pickles"):
        load_bundle(pickled)


def test_a_manifest_that_disagrees_or_is_not_whole_is_refused(state_bundle, tmp_path):
    manifest = json.loads((state_bundle / MANIFEST_FILE).read_text())
    cases = {
        "format_version": (lambda m: m.update(format_version=99), r"format_version 99 is newer"),
        "format": (lambda m: m.update(format="tflite"), r"format must be one of onnx, pt2, got 'tflite'"),
        "inputs": (lambda m: m["inputs"].pop(), r"observation entries .* are not the graph's inputs"),
        "shape": (lambda m: m["inputs"][0].update(shape=["batch", 99]), r"observations\.arm_qpos is float32 \[7\]"),
        "sha": (lambda m: m["sha256"].pop("policy.onnx"), r"sha256\.policy\.onnx must be a sha256"),
    }
    for name, (change, message) in cases.items():
        copy = tmp_path / name
        shutil.copytree(state_bundle, copy)
        edited = json.loads(json.dumps(manifest))
        change(edited)
        (copy / MANIFEST_FILE).write_text(json.dumps(edited))
        with pytest.raises(BundleError, match=message):
            load_bundle(copy)
    with pytest.raises(FileNotFoundError, match="not a policy bundle"):
        load_bundle(tmp_path)


def test_the_bundle_checks_what_it_is_fed(state_bundle):
    bundle = load_bundle(state_bundle)
    obs = {e.name: np.zeros((2, *e.shape), np.float32) for e in bundle.manifest.inputs}
    assert bundle.act(obs).shape == (2, bundle.manifest.action_dim)
    with pytest.raises(ValueError, match=r"missing \['target'\]"):
        bundle.act({k: v for k, v in obs.items() if k != "target"})
    with pytest.raises(ValueError, match=r"'arm_qpos' must be float32, got float64"):
        bundle.act({**obs, "arm_qpos": obs["arm_qpos"].astype(np.float64)})
    with pytest.raises(ValueError, match=r"'arm_qpos' must be \[B, 7\]"):
        bundle.act({**obs, "arm_qpos": np.zeros((2, 6), np.float32)})


def test_running_a_bundle_without_onnxruntime_names_the_extra(state_bundle, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ImportError, match=r"robotrl\[export\]"):
        load_bundle(state_bundle)


@pytest.mark.dds  # on DDS: runs alone after the parallel tests (tests/conftest.py)
def test_robotrl_deploy_runs_a_bundle_on_the_twin_and_refuses_a_tampered_one(state_bundle, tmp_path):
    pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')
    pytest.importorskip("rosbags", reason='needs the ros extra: pip install "robotrl[ros]"')
    import threading

    from robotrl.hardware.sim_twin import SimTwin, SimTwinConfig

    rate, domain = 250.0, 231
    tampered = tmp_path / "tampered"
    shutil.copytree(state_bundle, tampered)
    data = bytearray((tampered / "policy.onnx").read_bytes())
    data[-10] ^= 0xFF
    (tampered / "policy.onnx").write_bytes(bytes(data))
    twin = SimTwin(SimTwinConfig(rate_hz=rate, domain_id=domain, report_interval=0))
    thread = threading.Thread(target=twin.run, daemon=True)
    thread.start()
    args = ["hardware=sim_twin", f"hardware.domain_id={domain}", f"hardware.control_rate_hz={rate}", "episodes=1"]
    try:
        bad = run_module(
            "robotrl.hardware.deploy",
            f"policy={tampered}",
            *args,
            f"hydra.run.dir={tmp_path / 'hydra_bad'}",
            check=False,
            timeout=60,
        )
        assert bad.returncode == 1 and "policy.onnx: checksum mismatch" in bad.stderr
        assert twin.accepted["commands"] == 0  # refused before a robot env existed
        proc = run_module(
            "robotrl.hardware.deploy",
            f"policy={state_bundle}",
            *args,
            "episode_steps=15",
            f"hydra.run.dir={tmp_path / 'hydra'}",
            timeout=120,
        )
    finally:
        twin.stop()
        thread.join(timeout=5)
        twin.close()
    summary = json.loads(proc.stdout.strip().splitlines()[-1])["deploy"]
    assert summary["bundle"] == str(state_bundle) and summary["checkpoint"] == "step_000000300"
    assert summary["steps"] == 15 and summary["policy_errors"] == 0 and summary["control"] == "ee_delta"
    assert summary["commands"] > 50 and summary.get("stale_observations", 0) == 0
    assert twin.accepted["commands"] > 50 and sum(twin.rejected.values()) == 0
    both = run_module("robotrl.hardware.deploy", f"policy={state_bundle}", f"run={state_bundle}", check=False)
    assert both.returncode == 1 and "one of them: got both" in both.stderr


@pytest.mark.parametrize("variant", ["sac_gsde_state", "sac_pixels"])
def test_other_sac_policies_export_as_torch_acts(variant):
    """SAC's gSDE actor (its mode without the noise's variance) and SAC from pixels (its shared image encoder),
    untrained: the graph against the agent's own deterministic act, batch sizes 1 and 7."""
    import onnxruntime

    from robotrl.agents.config import EncoderConfig
    from robotrl.agents.sac import SAC, SACConfig
    from robotrl.core.spec import TensorSpec

    torch.manual_seed(0)
    if variant == "sac_gsde_state":
        spec = {"arm_qpos": TensorSpec((7,)), "target": TensorSpec((3,))}
        cfg = SACConfig(exploration="gsde", actor_hidden=[32, 32], critic_hidden=[32], obs_norm=True)
    else:
        spec = {"pixels_front": TensorSpec((9, 32, 32), torch.uint8), "arm_qpos": TensorSpec((7,))}
        cfg = SACConfig(actor_hidden=[32], critic_hidden=[32], encoder=EncoderConfig(conv_layers=2, conv_stride=2))
    agent = SAC(cfg, spec, 4).eval()
    if cfg.obs_norm:
        agent.encoder.observe({k: torch.randn(64, *s.shape) * 3 + 1 for k, s in spec.items()})
    keys = sorted(spec)
    low, high = (-1.0, -2.0, 0.0, -1.0), (1.0, 2.0, 0.5, 1.0)
    policy = policy_export.DeterministicPolicy(agent, keys, low, high).eval()

    def draw(batch):
        return {
            k: torch.randint(0, 256, (batch, *s.shape), dtype=torch.uint8)
            if s.dtype == torch.uint8
            else torch.randn(batch, *s.shape) * 3
            for k, s in spec.items()
        }

    graph = policy_export._onnx_bytes(policy, tuple(draw(2)[k] for k in keys))
    session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
    for batch in (1, 7, 64):
        obs = draw(batch)
        eager = agent.act(obs, deterministic=True).numpy()
        eager = np.array(low) + (eager + 1) / 2 * (np.array(high) - np.array(low))
        ort = session.run(None, {k: v.numpy() for k, v in obs.items()})[0]
        assert ort.shape == (batch, 4) and np.abs(ort - eager).max() <= TOL


def test_the_bundle_loader_imports_no_training_code():
    """A robot PC loads a bundle with robotrl's core: no agent, runtime, task or simulator module is imported."""
    import subprocess

    code = (
        "import sys, robotrl.core.policy_bundle; "
        "bad = [m for m in sys.modules if m.split('.')[:2] in (['robotrl', 'agents'], ['robotrl', 'runtime'], "
        "['robotrl', 'tasks'], ['robotrl', 'nn']) or m in ('mujoco', 'onnxruntime', 'onnx', 'onnxscript')]; "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_the_graph_carries_the_deploy_spec_and_a_graph_whose_spec_differs_is_refused(state_bundle, tmp_path):
    import hashlib

    import onnx

    from robotrl.core.policy_bundle import SPEC_METADATA, VERSION_METADATA

    model = onnx.load(state_bundle / "policy.onnx")
    props = {p.key: p.value for p in model.metadata_props}
    assert props[SPEC_METADATA] == (state_bundle / "deploy_spec.json").read_text() and props[VERSION_METADATA] == "1"
    copy = tmp_path / "other_spec"
    shutil.copytree(state_bundle, copy)
    for prop in model.metadata_props:
        if prop.key == SPEC_METADATA:
            prop.value = prop.value.replace('"episode_steps"', '"episode_steps" ', 1)
    graph = model.SerializeToString()
    (copy / "policy.onnx").write_bytes(graph)
    manifest = json.loads((copy / MANIFEST_FILE).read_text())
    manifest["sha256"]["policy.onnx"] = hashlib.sha256(graph).hexdigest()  # a consistent forgery of the hash
    (copy / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"the deploy spec inside the graph is not deploy_spec\.json's"):
        load_bundle(copy)


def test_exporting_without_the_export_extra_names_it(runs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    with pytest.raises(policy_export.ExportError, match=r"needs onnxscript: pip install 'robotrl\[export\]'"):
        policy_export.export_bundle(runs["state"], tmp_path / "bundle")
    assert not (tmp_path / "bundle").exists()


def test_an_export_whose_graph_disagrees_with_torch_leaves_nothing(runs, monkeypatch):
    run = runs["state"]
    before = _listing(run)
    monkeypatch.setattr(policy_export, "PARITY_TOL", -1.0)  # any difference, even 0, is too large
    with pytest.raises(policy_export.ExportError, match=r"differ from torch's by .*: not written"):
        policy_export.export_bundle(run)  # the default out, <run>/bundles/<checkpoint>_onnx
    assert _listing(run) == before


def test_a_bundle_is_readable_by_whoever_deploys_it(state_bundle):
    assert state_bundle.stat().st_mode & 0o777 == 0o755
