"""System identification of an arm's joint dynamics on `mujoco.sysid` (it ships inside mujoco; the `sysid` extra
adds the one package its import needs): armature, damping, dry friction and position-actuator stiffness per joint,
and the command latency, fitted to joint positions recorded under a known command, with confidence intervals and
a verdict on what the data can identify. `load_priors` reads the parameters to fit and their bounds
(configs/sysid_priors/), `overlay_of` turns a fit into the model overlay the tasks and the twin take
(robotrl/core/model_overlay.py); `robotrl-sysid` (hardware/identify.py) records a robot and runs both.

The residual is the plain position error in radians (`SignalTransform(normalize=False)`): mujoco.sysid's default
divides each joint's residual by its own norm, and its pooled variance then gave 95% intervals that held the true
value about half the time (a probe on the Panda, 2026-11-28; 90-100% without the normalisation). The intervals
come from a sandwich covariance over blocks of the recording (`block_intervals`), not from mujoco.sysid's, which
takes every sample for an independent one: a recording over DDS leaves residuals correlated over tens of
milliseconds (timing jitter, dropped periods), and those intervals held the twin's true values for 0.32 of the
parameters they called precise (bench/results/sysid.jsonl line 2). The latency is a
parameter that shifts the command in time inside the rollout (a custom rollout), not a delay of the measurement.
"""

from __future__ import annotations

import contextlib
import io
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from robotrl.core.model_overlay import JOINT_KINDS, LATENCY, ModelOverlay

KINDS = (*JOINT_KINDS, "kp", "latency")
PRIORS = Path(__file__).resolve().parent.parent / "configs" / "sysid_priors"
INSTALL_HINT = 'the sysid extra: pip install -e ".[sysid]"'


def import_sysid():
    try:
        from mujoco import sysid
    except ImportError as err:
        raise ImportError(f"system identification needs mujoco.sysid and its imports; install {INSTALL_HINT}") from err
    # mujoco.sysid imports absl.logging, whose handler holds sys.stderr and closes it when closed: a later Hydra
    # program in the process reconfigures logging, which closes every handler, and sys.stderr went with it (31
    # errors in one make test run, "I/O operation on closed file"). Its stream now writes to whatever sys.stderr
    # is and is never closed.
    import absl.logging

    absl.logging.get_absl_handler().python_handler.stream = _CurrentStderr()
    return sysid


class _CurrentStderr:
    """Whatever sys.stderr is when written to."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def close(self) -> None:
        pass  # sys.stderr is not absl's to close


@dataclass(frozen=True)
class Unknown:
    """One parameter to fit: its kind, the joint (armature, damping, frictionloss) or position actuator (kp) it
    belongs to ("" for the latency, in seconds), and the bounds the fit keeps it within."""

    kind: str
    target: str = ""
    low: float = 0.0
    high: float = 1.0

    @property
    def name(self) -> str:
        return LATENCY if self.kind == "latency" else f"{self.target}.{self.kind}"

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown parameter kind {self.kind!r}; known: {', '.join(KINDS)}")
        if not (math.isfinite(self.low) and math.isfinite(self.high) and 0 <= self.low < self.high):
            raise ValueError(f"{self.name}: bounds must satisfy 0 <= low < high, got [{self.low}, {self.high}]")
        if (self.kind == "latency") == bool(self.target):
            raise ValueError(f"{self.name}: a latency names no target; every other kind names its joint or actuator")


@dataclass
class Recording:
    """A trajectory recorded on a robot (or a model standing in for one), one sample per physics step."""

    times: np.ndarray  # [T] s since the first sample
    commands: np.ndarray  # [T, nu] actuator targets as sent, every actuator of the model
    qpos: np.ndarray  # [T, len(joints)] joint positions as measured at `times`
    joints: tuple[str, ...]
    initial_qpos: np.ndarray  # [nq] the state the recording starts from, at rest


@dataclass
class Fit:
    values: dict[str, float]
    nominal: dict[str, float]
    half_width: dict[str, float]  # of the 95% confidence interval
    identifiable: dict[str, bool]  # False: the interval is too wide, or the parameter moves with another one
    # False: the data does not constrain it even jointly with the others (an infinite interval): left at nominal.
    # A parameter that is observable but not identifiable (a wide interval: armature and damping trade off
    # against each other; or one moving in lockstep with another) is written all the same, since the fit's
    # combination is what reproduces the robot: writing only the 10-11 identified of 29 left the held-out error
    # ratio at 1.8-1.9, against 5.8 for the whole fit (bench/sysid.py on the twin, 2026-11-28), and leaving the
    # two stiffnesses in lockstep with other parameters at nominal (25% off, each fitted within 4.3%) gave 3.1 where
    # the same fit with them gave 43.7 (2026-11-29, one recording)
    observable: dict[str, bool]
    rms_residual: float  # rad
    seconds: float


def with_joint_sensors(spec, joints):
    """`spec` with a joint-position sensor per joint (mujoco.sysid compares sensor readings); returns it."""
    import mujoco

    for joint in joints:
        spec.add_sensor(
            name=f"{joint}_pos", type=mujoco.mjtSensor.mjSENS_JOINTPOS, objtype=mujoco.mjtObj.mjOBJ_JOINT, objname=joint
        )
    return spec


def multisine(model, joints, actuators, duration: float, seed: int, amplitude: float = 0.35, centre=None):
    """An excitation: per joint a sum of four sines (0.3-3 Hz, random phases) around `centre` (one position per
    joint; default the middle of each range) whose amplitudes add up to at most `amplitude` rad and 40% of the
    half-range (so it swings at most twice that from the centre, never past the range), ramped in over 0.5 s from
    rest and out over the last 0.5 s back to the centre. Returns (times [T], commands [T, nu], initial qpos [nq])."""
    rng = np.random.default_rng(seed)
    dt = model.opt.timestep
    times = np.arange(round(duration / dt) + 1) * dt

    def ramp_in(t):
        return np.where(t < 0.5, 0.5 * (1 - np.cos(np.pi * np.clip(t, 0.0, 0.5) / 0.5)), 1.0)

    ramp = np.minimum(ramp_in(times), ramp_in(times[-1] - times))
    commands = np.zeros((len(times), model.nu))
    q0 = model.qpos0.copy()
    for i, (joint, actuator) in enumerate(zip(joints, actuators, strict=True)):
        low, high = model.joint(joint).range
        middle = (low + high) / 2 if centre is None else float(centre[i])
        if not low <= middle <= high:
            raise ValueError(f"excitation centre {middle} of {joint} is outside its range [{low}, {high}]")
        reach = min(amplitude, 0.4 * (high - low) / 2, (middle - low) / 2, (high - middle) / 2)
        frequencies = rng.permutation([0.3, 0.5, 0.8, 1.1, 1.5, 1.9, 2.4, 3.0])[:4]
        weights = 1 / (1 + frequencies)
        amplitudes = reach * weights / weights.sum()
        phases = rng.uniform(0, 2 * np.pi, 4)
        wave = sum(
            a * (np.sin(2 * np.pi * f * times + p) - np.sin(p))
            for a, f, p in zip(amplitudes, frequencies, phases, strict=True)
        )
        commands[:, model.actuator(actuator).id] = middle + ramp * wave
        q0[model.jnt_qposadr[model.joint(joint).id]] = middle
    return times, commands, q0


def simulate(model, times, commands, q0, joints, latency_steps: int = 0, noise: float = 0.0, seed: int = 0):
    """What a robot with `model`'s dynamics records under `commands` arriving `latency_steps` physics steps late, with
    Gaussian position noise: a Recording (of the commands as sent)."""
    import mujoco
    from mujoco import rollout

    sysid = import_sysid()
    applied = commands.copy()
    if latency_steps:
        applied[latency_steps:], applied[:latency_steps] = commands[:-latency_steps], commands[0]
    start = sysid.create_initial_state(model, q0)
    state, _ = rollout.rollout(model, mujoco.MjData(model), start, applied[:-1])
    columns = np.array([model.jnt_qposadr[model.joint(j).id] for j in joints])
    qpos = np.concatenate([q0[columns][None], state[0][:, 1 + columns]])  # at t = 0, then after each step
    qpos = qpos + np.random.default_rng(seed).normal(0.0, noise, qpos.shape) if noise else qpos
    return Recording(times, commands, qpos, tuple(joints), q0)


def block_intervals(
    residual: np.ndarray, jac: np.ndarray, channels: int, confidence: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """(covariance, half widths at `confidence`) of least-squares parameters whose residual errors are correlated in
    time: `residual` [T * channels] time-major and its Jacobian [T * channels, P] at the optimum. A sandwich
    (J'J)^-1 S (J'J)^-1 whose middle S sums, over consecutive blocks of samples, each block's pull J'r on the
    parameters: blocks twice as long as the residual stays correlated (its pooled autocorrelation first below 0.05),
    at least 10 of them, so a correlated stretch counts once, not once per sample; Student's t over the blocks.
    With independent errors the blocks are single samples and this is the classic interval. A parameter that moves
    along a direction the data does not see (J'J's eigenvalue numerically 0, as mujoco.sysid judges it) gets an
    infinite interval."""
    from scipy import stats

    samples = residual.size // channels
    if residual.size != samples * channels or jac.shape[0] != residual.size:
        raise ValueError(f"residual of {residual.size} and Jacobian of {jac.shape[0]} rows are not T x {channels}")
    r = residual.reshape(samples, channels)
    pull = np.einsum("tc,tcp->tp", r, jac.reshape(samples, channels, -1))
    spectrum = np.fft.rfft(r, n=2 * samples, axis=0)
    autocorrelation = np.fft.irfft((spectrum * spectrum.conj()).real.sum(axis=1), axis=0)[:samples]
    below = np.flatnonzero(autocorrelation < 0.05 * autocorrelation[0]) if autocorrelation[0] > 0 else np.zeros(1)
    length = max(1, min(2 * int(below[0]) if len(below) else samples, samples // 10))
    count = samples // length
    blocks = pull[: count * length].reshape(count, length, -1).sum(axis=1)
    eigenvalues, vectors = np.linalg.eigh(jac.T @ jac)
    unseen = eigenvalues <= 1e-15 * max(eigenvalues.max(), 0.0)
    bread = (vectors[:, ~unseen] / eigenvalues[~unseen]) @ vectors[:, ~unseen].T
    covariance = bread @ (blocks.T @ blocks) @ bread
    quantile = stats.t.ppf(0.5 + confidence / 2, df=max(count - 1, 1))
    half = quantile * np.sqrt(np.abs(np.diag(covariance)))
    half[(np.abs(vectors[:, unseen]) > 1e-8).any(axis=1)] = np.inf
    return covariance, half


def check_targets(model, unknowns: list[Unknown]) -> None:
    """ValueError naming an unknown whose joint or actuator `model` lacks."""
    import mujoco

    for unknown in unknowns:
        kind = mujoco.mjtObj.mjOBJ_ACTUATOR if unknown.kind == "kp" else mujoco.mjtObj.mjOBJ_JOINT
        if unknown.target and mujoco.mj_name2id(model, kind, unknown.target) < 0:
            raise ValueError(
                f"{unknown.name}: the model has no {'actuator' if unknown.kind == 'kp' else 'joint'} {unknown.target!r}"
            )


def _modifier(unknown: Unknown):
    sysid = import_sysid()
    if unknown.kind == "kp":
        return lambda spec, p: sysid.apply_pgain(spec, unknown.target, p.value[0])
    if unknown.kind == "damping":  # a 3-vector in mujoco 3.11's MjSpec: [viscous, polynomial terms]

        def damping(spec, p):
            spec.joint(unknown.target).damping[0] = p.value[0]

        return damping
    return lambda spec, p: setattr(spec.joint(unknown.target), unknown.kind, p.value[0])


def _nominal(model, unknown: Unknown) -> float:
    if unknown.kind == "latency":
        return 0.0
    if unknown.kind == "kp":
        return float(model.actuator(unknown.target).gainprm[0])
    dof = model.joint(unknown.target).dofadr[0]
    return float(
        {"armature": model.dof_armature, "damping": model.dof_damping, "frictionloss": model.dof_frictionloss}[
            unknown.kind
        ][dof]
    )


def _delayed_rollout(
    *,
    models,
    datas,
    control_signal,
    initial_states,
    param_dicts,
    rollout_signal_mapping,
    rollout_state_mapping,
    ctrl_mapping,
):
    """mujoco.sysid's rollout with each command shifted by the `command_latency` parameter (the first held before)."""
    sysid = import_sysid()
    per = len(control_signal) // len(param_dicts)
    shifted = []
    for i, signal in enumerate(control_signal):
        delay = param_dicts[i // per][LATENCY].value[0]
        shifted.append(sysid.TimeSeries(signal.times, signal.interpolate(signal.times - delay), signal.signal_mapping))
    return sysid.sysid_rollout(
        models, datas, shifted, initial_states, rollout_signal_mapping, rollout_state_mapping, ctrl_mapping
    )


def fit(spec, recording: Recording, unknowns: list[Unknown], max_iters: int = 40) -> Fit:
    """Fit `unknowns` so that `spec` (an MjSpec of the robot, e.g. tasks/assets/panda.xml; joint sensors are added
    here) reproduces `recording`. Names a joint, an actuator or a kind the model lacks before fitting."""

    sysid = import_sysid()
    for unknown in unknowns:
        unknown.validate()
    if len({u.name for u in unknowns}) != len(unknowns):
        raise ValueError(f"a parameter is named twice in {[u.name for u in unknowns]}")
    spec = with_joint_sensors(spec, recording.joints)
    model = spec.compile()
    check_targets(model, unknowns)
    if recording.commands.shape != (len(recording.times), model.nu):
        raise ValueError(
            f"commands must be [T, nu] = [{len(recording.times)}, {model.nu}], got {list(recording.commands.shape)}"
        )
    params = sysid.ParameterDict()
    nominal = {}
    for unknown in unknowns:
        nominal[unknown.name] = _nominal(model, unknown)
        start = min(max(nominal[unknown.name], unknown.low), unknown.high)
        modifier = None if unknown.kind == "latency" else _modifier(unknown)
        params.add(sysid.Parameter(unknown.name, start, unknown.low, unknown.high, modifier=modifier))
    params.move_off_bounds()
    control = sysid.TimeSeries.from_control_names(recording.times, recording.commands, model)
    if recording.qpos.shape != (len(recording.times), len(recording.joints)):
        raise ValueError(
            f"qpos must be [T, joints] = [{len(recording.times)}, {len(recording.joints)}], "
            f"got {list(recording.qpos.shape)}"
        )
    names = [f"{joint}_pos" for joint in recording.joints]
    # mujoco.sysid's rollout applies the command stamped t during the step that ends at t (its control and sensor
    # series are one step apart): a measurement of the state at t is stamped t + dt to match. Stamped t, a command
    # 3 steps late was fitted as 2 (checked at 0, 3 and 5 steps in tests/test_sysid.py)
    dt = model.opt.timestep
    measured = sysid.TimeSeries.from_names(recording.times + dt, recording.qpos, model, names=names)
    start_state = sysid.create_initial_state(model, recording.initial_qpos)
    sequences = sysid.ModelSequences("robot", spec, "recording", start_state, control, measured)
    latency = any(u.kind == "latency" for u in unknowns)
    residual = sysid.build_residual_fn(
        models_sequences=[sequences],
        modify_residual=sysid.SignalTransform(normalize=False).apply,
        **({"custom_rollout": _delayed_rollout} if latency else {}),
    )
    began = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # its report table goes to stdout whatever `output` says
        fitted, result = sysid.optimize(
            params, residual, optimizer="mujoco", max_iters=max_iters, x_scale="jac", output=io.StringIO()
        )
    residuals, _, _ = residual(result.x, fitted)
    covariance, half = block_intervals(np.concatenate(residuals), result.jac, len(recording.joints))
    seconds = time.perf_counter() - began
    names = fitted.get_non_frozen_parameter_names()
    sd = np.sqrt(np.abs(np.diag(covariance)))
    with np.errstate(invalid="ignore", divide="ignore"):
        correlation = covariance / np.outer(sd, sd)
    identifiable, observable = {}, {}
    for i, name in enumerate(names):
        unknown = next(u for u in unknowns if u.name == name)
        scale = max(abs(result.x[i]), abs(nominal[name]), 0.05 * (unknown.high - unknown.low))
        others = np.abs(np.delete(correlation[i], i)) if len(names) > 1 else np.zeros(0)
        observable[name] = bool(np.isfinite(half[i]))
        identifiable[name] = observable[name] and not (others > 0.999).any() and bool(half[i] <= 0.5 * scale)
    return Fit(
        values={name: float(result.x[i]) for i, name in enumerate(names)},
        nominal=nominal,
        half_width={name: float(half[i]) for i, name in enumerate(names)},
        identifiable=identifiable,
        observable=observable,
        rms_residual=float(np.sqrt(np.mean(np.concatenate(residuals) ** 2))),
        seconds=seconds,
    )


def load_priors(priors: str | Path) -> tuple[str, list[Unknown]]:
    """(robot, unknowns) of a priors file: a name in configs/sysid_priors/ (panda) or a path to one. Every
    joint's armature, damping and dry friction, every actuator's stiffness and the command latency it bounds are
    fitted; a malformed entry is named."""
    path = Path(priors) if str(priors).endswith((".yaml", ".yml")) else PRIORS / f"{priors}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in PRIORS.glob("*.yaml"))
        raise FileNotFoundError(f"sysid priors {str(priors)!r}: no file {path}; known: {', '.join(known)}")
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"sysid priors {path}: not YAML: {error}") from None
    if not isinstance(document, dict):
        raise ValueError(f"sysid priors {path}: expected a mapping with robot, joints, actuators, command_latency")
    unknowns = []
    try:
        for group, kinds in (("joints", JOINT_KINDS), ("actuators", ("kp",))):
            for target, bounds in (document.get(group) or {}).items():
                extra = sorted(set(bounds) - set(kinds))
                if extra:
                    raise ValueError(f"{group}.{target}: unknown kinds {extra}; known: {', '.join(kinds)}")
                unknowns += [Unknown(kind, target, *map(float, bounds[kind])) for kind in kinds if kind in bounds]
        if LATENCY in document:
            unknowns.append(Unknown("latency", "", *map(float, document[LATENCY])))
        for unknown in unknowns:
            unknown.validate()
    except (TypeError, ValueError) as error:
        raise ValueError(f"sysid priors {path}: {error}") from None
    if not unknowns:
        raise ValueError(f"sysid priors {path} bound no parameter")
    return str(document.get("robot", "")), unknowns


def overlay_of(fit_result: Fit, robot: str) -> ModelOverlay:
    """The overlay a fit writes: every value the data constrains (Fit.observable), those not identified alone
    listed; the unobservable ones left at nominal."""
    identified = {name: value for name, value in fit_result.values.items() if fit_result.observable[name]}
    return ModelOverlay(
        robot=robot,
        parameters=identified,
        half_width_95=dict(fit_result.half_width),
        not_identified=[name for name, ok in fit_result.identifiable.items() if not ok],
    )
