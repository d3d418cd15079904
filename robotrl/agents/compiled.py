"""`agent.compile=true`: an agent's update as one compiled program, with the eager update as its reference.

Two layers:
- `CompiledFunction`: an agent's loss functions under `torch.compile` (Inductor fuses the elementwise work of the
  forward pass and of the backward pass AOTAutograd derives from it). Where compilation is unavailable (no C++
  compiler for a CPU build, a Python torch cannot trace) the first call warns once and the eager function runs
  instead, with the same arguments: results never change silently.
- `GraphedStep`, on CUDA only: the whole update (losses, backward pass, optimizer steps, target lerp) captured
  as a CUDA graph and replayed once per update: one launch and no host work per kernel. SAC's batch-256 update
  is bound by launches, not arithmetic: 166 eager updates/s on an H100 (bench/results/sac_speed.jsonl, line 4).

Graph rules an agent's step must keep (each is why a field of the agents is a tensor, not a float):
- No host synchronisation and no value read back to Python inside the step (no `.item()`, no branch on a
  tensor's value).
- Per-update values that change (a behaviour-cloning schedule) live in device tensors filled before the step;
  a Python number read inside would be frozen at capture.
- Python flags that select a different program (an actor step this update or not) are passed as arguments:
  each distinct combination, and each batch layout, gets its own graph.
- The optimizers are `capturable` (their step counts on the device), and nothing replaces the tensors a graph
  reads or writes once it is captured: checkpoints load (into new optimizer-state tensors) before the first
  update, as every entry point does today; `agent.load_state_dict` copies into the existing weights.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import torch

from robotrl.data.replay import Batch

log = logging.getLogger(__name__)

WARMUP_CALLS = 3  # eager calls on a side stream before capture (cuBLAS/cuDNN handles, Inductor's first compile)
# torch.compile's backend for the losses. Tests on two CPU cores check DrQ-v2 through "aot_eager" (the same
# traced forward and backward graphs, run by eager kernels): Inductor's C++ build of its convolution kernels
# takes about two minutes there. The CUDA test runs it through Inductor.
BACKEND = "inductor"


def compile_failures() -> tuple[type[BaseException], ...]:
    """The exceptions that mean "this function cannot be compiled here", not "this function is wrong"."""
    import torch._dynamo.exc as dynamo_exc

    failures: list[type[BaseException]] = [dynamo_exc.BackendCompilerFailed, dynamo_exc.Unsupported]
    try:
        from torch._inductor.exc import InductorError

        failures.append(InductorError)
    except ImportError:  # older torch: Inductor's errors reach us as BackendCompilerFailed
        pass
    return tuple(failures)


class CompiledFunction:
    """`fn` under `torch.compile`, falling back to `fn` itself, with one warning naming the cause, where
    compilation fails. The fallback reruns the call eagerly, so `fn` must not have changed state before the
    compiled call failed (a loss function that only reads its module's state: true of the agents' losses)."""

    def __init__(self, fn: Callable[..., Any], label: str):
        self._eager, self.label = fn, label
        self._compiled: Callable[..., Any] | None = None
        if torch._dynamo.is_dynamo_supported():
            self._compiled = torch.compile(fn, dynamic=False, backend=BACKEND)
        else:
            self._fall_back("torch.compile does not support this Python")

    @property
    def compiled(self) -> bool:
        """Whether calls run the compiled program (False after a fallback)."""
        return self._compiled is not None

    def __call__(self, *args: Any) -> Any:
        if self._compiled is None:
            return self._eager(*args)
        try:
            return self._compiled(*args)
        except compile_failures() as err:
            self._fall_back(f"{type(err).__name__}: {_first_lines(err)}")
            return self._eager(*args)

    def _fall_back(self, cause: str) -> None:
        self._compiled = None
        message = f"agent.compile=true: {self.label} runs eagerly, compilation is unavailable here ({cause})"
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        log.warning(message)


def _first_lines(err: BaseException) -> str:
    """An error's first line, and the next one where the first only introduces it ("backend='inductor' raised:")."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [repr(err)]
    return " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]


def batch_tensors(batch: Batch) -> list[torch.Tensor]:
    """Every tensor of `batch` in a fixed order: its fields in declaration order, observation entries by key."""
    tensors = []
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, dict):
            tensors.extend(value[key] for key in sorted(value))
        elif isinstance(value, torch.Tensor):
            tensors.append(value)
    return tensors


def batch_layout(batch: Batch) -> Hashable:
    """What a captured graph was recorded for: the batch's class, its fields' presence, keys, shapes and dtypes."""
    layout: list[Hashable] = [type(batch).__name__]
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, dict):
            layout.append((f.name, tuple((k, tuple(value[k].shape), value[k].dtype) for k in sorted(value))))
        elif isinstance(value, torch.Tensor):
            layout.append((f.name, tuple(value.shape), value.dtype))
        else:
            layout.append((f.name, None))
    return tuple(layout)


@dataclasses.dataclass
class _Program:
    """One (flags, batch layout)'s static batch, and once captured its graph and packed metrics."""

    batch: Batch  # contiguous buffers every call's batch is copied into: the step sees the same strides each time
    calls: int = 0
    graph: torch.cuda.CUDAGraph | None = None
    names: list[str] = dataclasses.field(default_factory=list)
    packed: torch.Tensor | None = None  # the step's metrics, stacked inside the graph (one copy out per update)


class GraphedStep:
    """Runs `step(batch, *flags) -> {name: 0-dim tensor}` (a whole update, optimizer steps included) as CUDA
    graphs. Each (flags, batch layout) has its own static batch, into which every call's batch is copied: the
    first `WARMUP_CALLS` calls run the step eagerly on it on a side stream (real updates), the next captures the
    graph and replays it, and every later one replays it. The step always sees the same contiguous tensors, so a
    compiled function inside it is never recompiled during capture (a batch sampled as a strided view would
    otherwise trace again there, and compiling inside a capture invalidates it). Returned metrics are copies: a
    later replay does not change them."""

    def __init__(self, step: Callable[..., dict[str, torch.Tensor]], device: torch.device):
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        self._step, self.device = step, device
        self._programs: dict[Hashable, _Program] = {}
        self._stream = torch.cuda.Stream(device)

    @property
    def graphs(self) -> int:
        """Graphs captured so far."""
        return sum(program.graph is not None for program in self._programs.values())

    def __call__(self, batch: Batch, *flags: Hashable) -> dict[str, torch.Tensor]:
        key = (flags, batch_layout(batch))
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = _Program(_contiguous_like(batch))
        for static, value in zip(batch_tensors(program.batch), batch_tensors(batch), strict=True):
            static.copy_(value, non_blocking=True)
        if program.graph is None:
            program.calls += 1
            if program.calls <= WARMUP_CALLS:
                return self._eager(program.batch, flags)
            self._capture(program, flags)
        program.graph.replay()
        return dict(zip(program.names, program.packed.clone().unbind(), strict=True))

    def _eager(self, batch: Batch, flags: tuple[Hashable, ...]) -> dict[str, torch.Tensor]:
        # Warm-up runs on a side stream, as graph capture requires of the work it will record.
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            metrics = {name: value.detach().clone() for name, value in self._step(batch, *flags).items()}
        torch.cuda.current_stream(self.device).wait_stream(self._stream)
        return metrics

    def _capture(self, program: _Program, flags: tuple[Hashable, ...]) -> None:
        graph = torch.cuda.CUDAGraph()
        # Each graph its own memory pool: a graph's gradients and outputs outlive its replay.
        with torch.cuda.graph(graph):
            metrics = self._step(program.batch, *flags)
            names = list(metrics)
            packed = torch.stack([metrics[name].detach().float() for name in names])
        program.graph, program.names, program.packed = graph, names, packed
        log.info("captured the update as a CUDA graph (flags %s, %d metrics)", flags, len(names))


def _contiguous_like(batch: Batch) -> Batch:
    changes = {}
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, dict):
            changes[f.name] = {k: torch.empty_like(v, memory_format=torch.contiguous_format) for k, v in value.items()}
        elif isinstance(value, torch.Tensor):
            changes[f.name] = torch.empty_like(value, memory_format=torch.contiguous_format)
    return dataclasses.replace(batch, **changes)
