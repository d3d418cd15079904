"""agent.compile=true: the compiled update computes what the eager one does (losses and weights over several
updates), falls back to eager with one warning where compilation is unavailable, and on CUDA replays the
whole update as a CUDA graph with the same results."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings

import pytest
import torch
import torch._inductor.config as inductor_config

from robotrl.agents import SAC, DrQv2, DrQv2Config, SACConfig
from robotrl.agents import compiled as compiled_module
from robotrl.agents.compiled import GraphedStep
from robotrl.agents.config import EncoderConfig
from robotrl.core.spec import TensorSpec
from robotrl.data.replay import Batch

FRESH = "ROBOTRL_TEST_FRESH_INTERPRETER"  # set in the interpreter a test re-runs itself in
STATE = {"state": TensorSpec((5,))}
PIXELS = {"pixels_front": TensorSpec((6, 24, 24), torch.uint8), "state": TensorSpec((3,))}
UPDATES = 4


@pytest.fixture(autouse=True)
def eager_random_numbers():
    """Inductor draws random numbers its own way; with its fallback the compiled program draws eager's, so the
    two runs can be compared value for value."""
    with inductor_config.patch(fallback_random=True):
        yield


def _batches(spec, action_dim: int, count: int, demo: bool = False, device: str = "cpu") -> list[Batch]:
    gen = torch.Generator().manual_seed(0)

    def obs(rows: int) -> dict[str, torch.Tensor]:
        out = {}
        for key, entry in spec.items():
            if entry.dtype == torch.uint8:
                out[key] = torch.randint(0, 256, (rows, *entry.shape), dtype=torch.uint8, generator=gen)
            else:  # a strided view, as replays sample some entries: the compiled step must not retrace on them
                out[key] = torch.randn(rows, 2 * entry.shape[0], generator=gen)[:, ::2]
        return out

    batches = []
    for _ in range(count):
        rows = 32
        batch = Batch(
            obs(rows),
            torch.rand(rows, action_dim, generator=gen) * 2 - 1,
            torch.randn(rows, 1, generator=gen),
            torch.full((rows, 1), 0.99),
            obs(rows),
            demo=torch.rand(rows, generator=gen) < 0.5 if demo else None,
        )
        batches.append(_to(batch, device))
    return batches


def _to(batch: Batch, device: str) -> Batch:
    move = lambda o: {k: v.to(device) for k, v in o.items()}  # noqa: E731
    demo = None if batch.demo is None else batch.demo.to(device)
    return Batch(
        move(batch.obs),
        batch.action.to(device),
        batch.reward.to(device),
        batch.discount.to(device),
        move(batch.next_obs),
        demo=demo,
    )


def _train(make_agent, batches: list[Batch], seed: int = 1):
    torch.manual_seed(seed)
    agent = make_agent()
    metrics = [agent.update(batch) for batch in batches]
    return agent, metrics


def _assert_same_run(eager, compiled, atol: float) -> None:
    (agent_a, metrics_a), (agent_b, metrics_b) = eager, compiled
    for step, (a, b) in enumerate(zip(metrics_a, metrics_b, strict=True)):
        assert a.keys() == b.keys(), step
        for name in a:
            torch.testing.assert_close(b[name].float(), a[name].float(), atol=atol, rtol=1e-4, msg=f"{name} @ {step}")
    state_a, state_b = agent_a.state_dict(), agent_b.state_dict()
    for name in state_a:
        torch.testing.assert_close(state_b[name].float(), state_a[name].float(), atol=atol, rtol=1e-4, msg=name)


@pytest.mark.skipif(
    not any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++")), reason="Inductor's CPU kernels need a C++ compiler"
)
def test_compiled_sac_update_equals_eager():
    """Several updates, a critic-only one among them (actor_update_interval=2), behaviour cloning on demo rows
    with a decaying weight (a per-update value the compiled program must read afresh).

    In an interpreter of its own: Inductor's C++ build imports setuptools, whose distutils shim fails an
    assertion in a process where the standard library's distutils came first, and in a full `make test` worker
    some earlier test file left it so (AssertionError naming distutils/core.py, twice on 2026-11-28; alone it
    passes). What this test checks is the compiled update, not the worker's import history."""
    if os.environ.get(FRESH) != "1":
        node = f"{__file__}::test_compiled_sac_update_equals_eager"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", node],
            env={**os.environ, FRESH: "1"},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]
        return
    cfg = dict(actor_update_interval=2, bc_weight=2.0, bc_weight_final=0.5, bc_decay_updates=3)
    batches = _batches(STATE, 2, UPDATES, demo=True)
    eager = _train(lambda: SAC(SACConfig(**cfg), STATE, 2), batches)
    compiled = _train(lambda: SAC(SACConfig(compile=True, **cfg), STATE, 2), batches)
    assert compiled[0]._losses.compiled, "the losses fell back to eager: compilation should work here"
    assert {"bc_loss", "actor_loss", "alpha_loss"} <= compiled[1][-1].keys()
    _assert_same_run(eager, compiled, atol=1e-5)


def test_compiled_drqv2_update_equals_eager(monkeypatch):
    """Through AOTAutograd's traced graphs on eager kernels (`compiled.BACKEND`): Inductor's CPU build of the
    convolution kernels takes two minutes on two cores; the CUDA test runs Inductor."""
    monkeypatch.setattr(compiled_module, "BACKEND", "aot_eager")
    cfg = dict(encoder=EncoderConfig(conv_layers=2, conv_channels=8, feature_dim=16), hidden=[32, 32])
    batches = _batches(PIXELS, 3, UPDATES)
    eager = _train(lambda: DrQv2(DrQv2Config(**cfg), PIXELS, 3), batches)
    compiled = _train(lambda: DrQv2(DrQv2Config(compile=True, **cfg), PIXELS, 3), batches)
    assert compiled[0]._critic_losses.compiled and compiled[0]._actor_losses.compiled
    _assert_same_run(eager, compiled, atol=1e-5)


def test_compile_unavailable_falls_back_to_eager_with_one_warning():
    """No working C++ compiler for Inductor's CPU kernels: the update runs eagerly, warns once, and its results
    are the eager update's."""
    batches = _batches(STATE, 2, UPDATES)
    eager = _train(lambda: SAC(SACConfig(), STATE, 2), batches)
    with inductor_config.patch({"cpp.cxx": ("/nonexistent/c++",)}), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = _train(lambda: SAC(SACConfig(compile=True), STATE, 2), batches)
    fallbacks = [w for w in caught if "agent.compile=true" in str(w.message)]
    assert len(fallbacks) == 1, [str(w.message) for w in caught]
    assert "runs eagerly" in str(fallbacks[0].message)
    assert not compiled[0]._losses.compiled
    _assert_same_run(eager, compiled, atol=0.0)


def test_graphed_step_refuses_a_cpu_device():
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device, got cpu"):
        GraphedStep(lambda batch: {}, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("agent", ["sac", "drqv2"])
def test_cuda_graph_update_equals_eager(agent):
    """On CUDA the compiled update is captured once per program (here: with and without the actor step) after
    its warm-up calls, and replays give the eager run's losses and weights."""
    if agent == "sac":
        cfg = dict(actor_update_interval=2, bc_weight=2.0, bc_weight_final=0.5, bc_decay_updates=6)
        spec, make = STATE, lambda compile: SAC(SACConfig(compile=compile, **cfg), STATE, 2, "cuda")
        batches = _batches(spec, 2, 12, demo=True, device="cuda")
    else:
        cfg = dict(encoder=EncoderConfig(conv_layers=2, conv_channels=8, feature_dim=16), hidden=[32, 32])
        spec, make = PIXELS, lambda compile: DrQv2(DrQv2Config(compile=compile, **cfg), PIXELS, 3, "cuda")
        batches = _batches(spec, 3, 8, device="cuda")
    eager = _train(lambda: make(False), batches)
    compiled = _train(lambda: make(True), batches)
    assert compiled[0]._step.graphs == (2 if agent == "sac" else 1)
    _assert_same_run(eager, compiled, atol=1e-4)


def test_a_learner_refuses_a_compiled_update():
    """A learner's server threads write its replay on the GPU while an update would be captured."""
    from robotrl.runtime.learner_config import LearnerConfig

    with pytest.raises(ValueError, match=r"agent.compile=true is robotrl-train's: a learner's server threads"):
        LearnerConfig(agent=SACConfig(compile=True), task=None).validate()
