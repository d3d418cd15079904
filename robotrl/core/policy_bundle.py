"""A policy bundle: an exported policy as a directory a robot PC runs without the training stack.

robotrl-export (robotrl/export.py, the graph built by robotrl/runtime/policy_export.py) writes it:

    policy.onnx        one graph from the raw observation entries (one named input per entry, batch first, camera
                       entries uint8 as the robot's stacked frames) to the action in the task's bounds
      or policy.pt2    the same graph as a torch.export program (`format=pt2`), for a robot PC that runs torch
                       (or compiles the program ahead of time); its inputs positional, in the manifest's order
    deploy_spec.json   the run's deploy spec (robotrl/core/deploy_spec.py): what the robot feeds each input from
    bundle.json        the manifest: format version, sha256 of the two files above, the source run and checkpoint,
                       each input's name, shape and dtype, the output and its bounds, the export's own parity check

The graph also carries the deploy spec and the format version in its own metadata (`SPEC_METADATA`,
`VERSION_METADATA`; a pt2 program's extra files, with its inputs' names, `INPUTS_METADATA`), so a graph copied
alone still says what it expects.

`load_bundle` reads it back and refuses, naming the file and the entry, a manifest that is not whole and valid, a
bundle from a newer robotrl, a file whose sha256 is not the manifest's, a deploy spec whose observations or action
do not match the inputs and output, and a graph whose inputs or embedded deploy spec differ from the manifest's
and deploy_spec.json, before the bundle can act: what runs is exactly the bytes that were hashed. onnxruntime
(extra `export`) is imported only then, torch only for a pt2 program. torch.export's loader unpickles whatever a
program marks as pickled, and falls back to full unpickling where its weights-only loader fails: a pt2 program
holding any such payload is refused before torch reads it (`_refuse_pickles`). The manifest's hashes check that a
bundle is whole, not who made it: deploy bundles from a source you trust.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robotrl.core.checksum import SHA256_HEX, mismatch_problem, sha256_of_bytes
from robotrl.core.deploy_spec import FILE_NAME as SPEC_FILE
from robotrl.core.deploy_spec import DeploySpec, DeploySpecError

FORMAT_VERSION = 1
MANIFEST_FILE = "bundle.json"
ONNX_FILE = "policy.onnx"
PT2_FILE = "policy.pt2"
FORMATS = {"onnx": ONNX_FILE, "pt2": PT2_FILE}  # format -> the graph's file
DTYPES = ("float32", "uint8")
BATCH = "batch"  # the name of every input's and the output's dynamic first dimension
INSTALL_HINT = "pip install 'robotrl[export]'"
# the graph's own metadata (ONNX metadata_props): the deploy spec's JSON, as deploy_spec.json holds it, and the
# bundle format version, so a policy.onnx copied alone still says what it expects
SPEC_METADATA = "robotrl.deploy_spec"
VERSION_METADATA = "robotrl.bundle_format_version"
INPUTS_METADATA = "robotrl.inputs"  # a pt2 program's positional inputs, named (JSON list): ONNX names its own


class BundleError(ValueError):
    """A policy bundle that cannot be used: the message names the file and what is wrong."""


@dataclass(frozen=True)
class BundleInput:
    """One input of the graph: an observation entry, [batch, *shape] of `dtype`."""

    name: str
    shape: tuple[int, ...]  # without the batch dimension
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": [BATCH, *self.shape], "dtype": self.dtype}


@dataclass(frozen=True)
class BundleManifest:
    """bundle.json's contents, validated."""

    format: str
    agent: str
    run: str
    checkpoint: str
    inputs: tuple[BundleInput, ...]
    output: str
    action_dim: int
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    sha256: dict[str, str]  # file name -> its sha256: the graph's and the deploy spec's
    parity: dict[str, Any]  # what the export measured: max |onnxruntime - torch| over `samples` observations
    opset: int  # the ONNX opset; 0 for a pt2 program
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "format": self.format,
            "agent": self.agent,
            "source": {"run": self.run, "checkpoint": self.checkpoint},
            "inputs": [entry.to_json() for entry in self.inputs],
            "output": {
                "name": self.output,
                "shape": [BATCH, self.action_dim],
                "dtype": "float32",
                "low": list(self.action_low),
                "high": list(self.action_high),
            },
            "sha256": dict(self.sha256),
            "parity": dict(self.parity),
            "opset": self.opset,
        }

    @classmethod
    def from_json(cls, data: Any) -> BundleManifest:
        """The manifest in `data` (parsed JSON); BundleError naming the entry that is missing or wrong."""
        if not isinstance(data, dict):
            raise BundleError(f"the manifest must be a JSON object, got {type(data).__name__}")
        version = data.get("format_version")
        if not (isinstance(version, int) and not isinstance(version, bool) and version >= 1):
            raise BundleError(f"format_version must be an integer >= 1, got {version!r}")
        if version > FORMAT_VERSION:
            raise BundleError(f"format_version {version} is newer than this robotrl reads ({FORMAT_VERSION})")
        fmt = _get(data, "format", str)
        if fmt not in FORMATS:
            raise BundleError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        source = _get(data, "source", dict)
        inputs = tuple(_input(entry, i) for i, entry in enumerate(_get(data, "inputs", list)))
        if not inputs or len({entry.name for entry in inputs}) != len(inputs):
            raise BundleError(f"inputs must name one or more distinct entries, got {[e.name for e in inputs]}")
        output = _get(data, "output", dict)
        shape = _get(output, "shape", list, "output.shape")
        if len(shape) != 2 or shape[0] != BATCH or not _count(shape[1]):
            raise BundleError(f"output.shape must be ['{BATCH}', action_dim], got {shape!r}")
        low = _numbers(_get(output, "low", list, "output.low"), "output.low")
        high = _numbers(_get(output, "high", list, "output.high"), "output.high")
        if len(low) != shape[1] or len(high) != shape[1] or not all(lo < hi for lo, hi in zip(low, high, strict=True)):
            raise BundleError(f"output.low/high must give {shape[1]} bounds each with low < high: {low}, {high}")
        hashes = _get(data, "sha256", dict)
        for name in (FORMATS[fmt], SPEC_FILE):
            if not (isinstance(hashes.get(name), str) and SHA256_HEX.fullmatch(hashes[name])):
                raise BundleError(f"sha256.{name} must be a sha256 hex digest, got {hashes.get(name)!r}")
        opset = _get(data, "opset", int)
        return cls(
            format=fmt,
            agent=_get(data, "agent", str),
            run=_get(source, "run", str, "source.run"),
            checkpoint=_get(source, "checkpoint", str, "source.checkpoint"),
            inputs=inputs,
            output=_get(output, "name", str, "output.name"),
            action_dim=shape[1],
            action_low=tuple(low),
            action_high=tuple(high),
            sha256={name: hashes[name] for name in (FORMATS[fmt], SPEC_FILE)},
            parity=_get(data, "parity", dict),
            opset=opset,
            format_version=version,
        )


def check_against_spec(manifest: BundleManifest, spec: DeploySpec) -> None:
    """BundleError where the deploy spec's observations or action disagree with the graph's inputs and output:
    the robot would feed the graph what the spec describes."""
    entries = {entry.name: entry for entry in manifest.inputs}
    if set(entries) != set(spec.observations):
        raise BundleError(
            f"{SPEC_FILE}: its observation entries {sorted(spec.observations)} are not the graph's inputs "
            f"{sorted(entries)}"
        )
    for name, entry in entries.items():
        observed = spec.observations[name]
        if tuple(observed.shape) != entry.shape or observed.dtype != entry.dtype:
            raise BundleError(
                f"{SPEC_FILE}: observations.{name} is {observed.dtype} {list(observed.shape)}, the graph's input "
                f"is {entry.dtype} {list(entry.shape)}"
            )
    if spec.action_dim != manifest.action_dim:
        raise BundleError(f"{SPEC_FILE}: action_dim is {spec.action_dim}, the graph's is {manifest.action_dim}")
    bounds = (tuple(map(float, spec.action_low)), tuple(map(float, spec.action_high)))
    if bounds != (manifest.action_low, manifest.action_high):
        raise BundleError(
            f"{SPEC_FILE}: action bounds {list(spec.action_low)}..{list(spec.action_high)} are not the graph's "
            f"{list(manifest.action_low)}..{list(manifest.action_high)}"
        )


class PolicyBundle:
    """A loaded, verified bundle: `act(obs)` runs the graph (onnxruntime on the CPU; a pt2 program in torch) on a
    batch of raw observations."""

    def __init__(self, path: Path, manifest: BundleManifest, spec: DeploySpec, graph: _Graph):
        self.path, self.manifest, self.spec, self.graph = path, manifest, spec, graph
        self.inputs = {entry.name: entry for entry in manifest.inputs}

    def act(self, obs: Mapping[str, Any]) -> np.ndarray:
        """Actions [B, action_dim] (float32, in the task's bounds) for observations {entry: [B, *shape]} (numpy
        arrays or anything `np.asarray` takes, a CPU torch tensor included). ValueError naming an entry that is
        missing, unexpected, of the wrong shape or dtype, or a batch size that differs between entries."""
        if set(obs) != set(self.inputs):
            missing, extra = sorted(set(self.inputs) - set(obs)), sorted(set(obs) - set(self.inputs))
            raise ValueError(f"the policy takes entries {sorted(self.inputs)}: missing {missing}, unexpected {extra}")
        feed, batch = {}, None
        for name, entry in self.inputs.items():
            value = np.asarray(obs[name])
            if value.dtype != np.dtype(entry.dtype):
                raise ValueError(f"observation {name!r} must be {entry.dtype}, got {value.dtype}")
            if value.ndim != len(entry.shape) + 1 or tuple(value.shape[1:]) != entry.shape:
                raise ValueError(
                    f"observation {name!r} must be [B, {', '.join(map(str, entry.shape))}], got {list(value.shape)}"
                )
            if batch is not None and value.shape[0] != batch:
                raise ValueError(f"observation {name!r} has batch {value.shape[0]}, the others {batch}")
            batch = value.shape[0]
            feed[name] = np.ascontiguousarray(value)
        if batch == 0:
            raise ValueError("an empty batch of observations")
        return self.graph.run(feed)


def read_manifest(path: str | Path) -> BundleManifest:
    """The manifest of bundle directory `path`; FileNotFoundError or BundleError naming the file."""
    bundle = Path(path)
    file = bundle / MANIFEST_FILE
    if not bundle.is_dir():
        raise FileNotFoundError(f"policy={str(path)!r}: no such bundle directory")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{file}: missing (not a policy bundle? robotrl-export writes one)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BundleError(f"{file}: cannot be read as JSON: {error}") from None
    try:
        return BundleManifest.from_json(data)
    except BundleError as error:
        raise BundleError(f"{file}: {error}") from None


def _verified_bytes(bundle: Path, name: str, expected: str) -> bytes:
    file = bundle / name
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise BundleError(f"{file}: missing ({MANIFEST_FILE} lists it)") from None
    digest = sha256_of_bytes(data)
    if digest != expected:
        raise BundleError(f"{file}: {mismatch_problem(digest, expected, MANIFEST_FILE)}")
    return data


def load_bundle(path: str | Path, threads: int = 1) -> PolicyBundle:
    """The verified bundle in directory `path`: an ONNX graph in an onnxruntime session on `threads` CPU threads,
    or a pt2 program in torch. Files, manifest and spec are checked before the graph is loaded (see the module
    docstring); ImportError naming the extra where onnxruntime is not installed."""
    bundle = Path(path)
    manifest = read_manifest(bundle)
    graph = _verified_bytes(bundle, FORMATS[manifest.format], manifest.sha256[FORMATS[manifest.format]])
    spec_bytes = _verified_bytes(bundle, SPEC_FILE, manifest.sha256[SPEC_FILE])
    try:
        spec = DeploySpec.from_json(json.loads(spec_bytes.decode("utf-8")))
    except (UnicodeDecodeError, json.JSONDecodeError, DeploySpecError) as error:
        raise BundleError(f"{bundle / SPEC_FILE}: {error}") from None
    check_against_spec(manifest, spec)
    where = bundle / FORMATS[manifest.format]
    runner = _OnnxGraph(graph, threads, manifest.output) if manifest.format == "onnx" else _Pt2Graph(graph, where)
    _check_graph(bundle, manifest, runner)
    _check_metadata(bundle, manifest, runner, spec_bytes)
    return PolicyBundle(bundle, manifest, spec, runner)


class _Graph:
    """What a bundle reads of its graph, whichever format: inputs as (name, dtype, shape after the batch),
    outputs' names, metadata, and a run on a feed of numpy arrays."""

    inputs: list[tuple[str, str, list]]
    outputs: list[str]
    metadata: dict[str, str]

    def run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        raise NotImplementedError


class _OnnxGraph(_Graph):
    """An ONNX graph in an onnxruntime session on `threads` CPU threads."""

    TYPES = {"tensor(float)": "float32", "tensor(uint8)": "uint8"}

    def __init__(self, graph: bytes, threads: int, output: str):
        try:
            import onnxruntime  # the export extra: only a program that runs a bundle needs it
        except ImportError as error:
            raise ImportError(f"running a policy bundle needs onnxruntime: {INSTALL_HINT} ({error})") from None
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        self.inputs = [(n.name, self.TYPES.get(n.type, n.type), list(n.shape[1:])) for n in self.session.get_inputs()]
        self.outputs = [node.name for node in self.session.get_outputs()]
        self.metadata = dict(self.session.get_modelmeta().custom_metadata_map)
        self._output = output

    def run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        return self.session.run([self._output], feed)[0]


class _Pt2Graph(_Graph):
    """A torch.export program, run by torch on the CPU (the process's torch threads); its positional inputs are
    named by its INPUTS_METADATA."""

    def __init__(self, graph: bytes, where: Path):
        import io

        import torch  # only a pt2 bundle needs torch on the robot PC

        _refuse_pickles(graph, where)
        extra = {SPEC_METADATA: "", VERSION_METADATA: "", INPUTS_METADATA: ""}
        try:
            program = torch.export.load(io.BytesIO(graph), extra_files=extra)
        except Exception as error:  # torch's own errors for a file that is not a program it reads
            raise BundleError(f"{where}: cannot be read as a torch.export program: {error}") from None
        self.metadata = {key: value for key, value in extra.items() if value}
        try:
            names = json.loads(extra[INPUTS_METADATA] or "null")
        except json.JSONDecodeError:
            names = None
        user = program.graph_signature.user_inputs
        placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
        if not (isinstance(names, list) and len(names) == len(user)):
            names = list(user)  # unnamed: the manifest check below names the mismatch
        self.inputs = []
        for name, node_name in zip(names, user, strict=True):
            value = placeholders[node_name].meta["val"]
            self.inputs.append((name, str(value.dtype).removeprefix("torch."), [int(d) for d in value.shape[1:]]))
        self.outputs = [str(name) for name in program.graph_signature.user_outputs]
        self._order = names
        self._module = program.module()
        self._torch = torch

    def run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        with self._torch.no_grad():
            action = self._module(*(self._torch.from_numpy(feed[name]) for name in self._order))
        return action.numpy()


def _refuse_pickles(graph: bytes, where: Path) -> None:
    """BundleError where a pt2 archive holds a payload torch would unpickle: a weight or constant marked
    `use_pickle`, or a serialized tensor file (.pt: sample inputs) that torch's weights-only loader refuses (torch
    then retries it with full unpickling)."""
    import io
    import zipfile

    import torch

    try:
        archive = zipfile.ZipFile(io.BytesIO(graph))
    except zipfile.BadZipFile:
        raise BundleError(f"{where}: not a pt2 archive (a zip file)") from None
    with archive:
        for name in archive.namelist():
            if name.endswith(("_weights_config.json", "_constants_config.json")):
                try:
                    config = json.loads(archive.read(name))["config"]
                    pickled = sorted(key for key, entry in config.items() if entry.get("use_pickle"))
                except (ValueError, KeyError, TypeError, AttributeError):
                    raise BundleError(f"{where}: {name} is not a payload config torch.export wrote") from None
                if pickled:
                    raise BundleError(f"{where}: {name} marks {pickled} as pickled; robotrl loads no pickles")
            elif name.endswith(".pt"):
                try:
                    torch.load(io.BytesIO(archive.read(name)), weights_only=True)
                except Exception as error:
                    raise BundleError(
                        f"{where}: {name} does not load with torch's weights-only loader ({error}); robotrl loads no "
                        "pickles"
                    ) from None


def _check_graph(bundle: Path, manifest: BundleManifest, graph: _Graph) -> None:
    """BundleError where the graph's inputs or output are not the manifest's (names, ranks, fixed sizes, types)."""
    where = bundle / FORMATS[manifest.format]
    graph_inputs = {name: (dtype, shape) for name, dtype, shape in graph.inputs}
    if set(graph_inputs) != {entry.name for entry in manifest.inputs}:
        raise BundleError(
            f"{where}: its inputs {sorted(graph_inputs)} are not the manifest's {[e.name for e in manifest.inputs]}"
        )
    for entry in manifest.inputs:
        dtype, shape = graph_inputs[entry.name]
        if dtype != entry.dtype or shape != list(entry.shape):
            raise BundleError(
                f"{where}: input {entry.name!r} is {dtype} {shape} after the batch, the manifest says {entry.dtype} "
                f"{list(entry.shape)}"
            )
    expected = [manifest.output] if manifest.format == "onnx" else graph.outputs[:1]  # a pt2 output is unnamed
    if len(graph.outputs) != 1 or graph.outputs != expected:
        raise BundleError(f"{where}: its outputs {graph.outputs} are not the manifest's [{manifest.output!r}]")


def _check_metadata(bundle: Path, manifest: BundleManifest, graph: _Graph, spec_bytes: bytes) -> None:
    """BundleError where the deploy spec inside the graph is not deploy_spec.json."""
    where = bundle / FORMATS[manifest.format]
    embedded = graph.metadata.get(SPEC_METADATA)
    if embedded is None:
        raise BundleError(f"{where}: holds no deploy spec ({SPEC_METADATA}); export it again with robotrl-export")
    if embedded.encode("utf-8") != spec_bytes:
        raise BundleError(f"{where}: the deploy spec inside the graph is not {SPEC_FILE}'s")


# -- manifest parsing helpers -------------------------------------------------------------------------------


def _get(data: dict, key: str, kind: type, where: str | None = None) -> Any:
    where = where or key
    if key not in data:
        raise BundleError(f"{where} is missing")
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BundleError(f"{where} must be a {kind.__name__}, got {value!r}")
    return value


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _numbers(values: list, where: str) -> list[float]:
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        raise BundleError(f"{where} must hold finite numbers, got {values!r}")
    return [float(v) for v in values]


def _input(entry: Any, index: int) -> BundleInput:
    where = f"inputs[{index}]"
    if not isinstance(entry, dict):
        raise BundleError(f"{where} must be an object, got {entry!r}")
    name = _get(entry, "name", str, f"{where}.name")
    shape = _get(entry, "shape", list, f"{where}.shape")
    if len(shape) < 2 or shape[0] != BATCH or not all(_count(n) for n in shape[1:]):
        raise BundleError(f"{where}.shape must be ['{BATCH}', sizes >= 1 ...], got {shape!r}")
    dtype = _get(entry, "dtype", str, f"{where}.dtype")
    if dtype not in DTYPES:
        raise BundleError(f"{where}.dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return BundleInput(name, tuple(shape[1:]), dtype)
