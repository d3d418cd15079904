"""System identification on mujoco.sysid (robotrl/sim2real/sysid.py): a Panda model with known changes records a
multi-sine excitation, and the fit recovers them, with intervals that hold the true values, a command latency to
the physics step, a flag on what the data cannot identify, and bad input named."""

import mujoco
import pytest
from robotrl.sim2real.sysid import Unknown, fit, multisine, overlay_of, simulate
from robotrl.tasks.arm_task import ASSETS

PANDA = ASSETS / "panda.xml"
JOINTS = tuple(f"joint{i}" for i in range(1, 8))
ACTUATORS = tuple(f"act{i}" for i in range(1, 8))


def _changed_robot(armature=0.15, kp=1600.0):
    """The Panda with joint2's armature x1.5 and act2's stiffness x0.8: the robot the model must be fitted to."""
    spec = mujoco.MjSpec.from_file(str(PANDA))
    spec.joint("joint2").armature = armature
    spec.actuator("act2").gainprm[0], spec.actuator("act2").biasprm[1] = kp, -kp
    return spec.compile()


def _recording(latency_steps=0, excited=JOINTS, seconds=4.0):
    nominal = mujoco.MjSpec.from_file(str(PANDA)).compile()
    actuators = [ACTUATORS[JOINTS.index(joint)] for joint in excited]
    times, commands, q0 = multisine(nominal, excited, actuators, seconds, seed=0)
    return simulate(_changed_robot(), times, commands, q0, JOINTS, latency_steps=latency_steps, noise=1e-4, seed=1)


def test_a_known_change_and_a_command_latency_are_recovered_within_their_intervals():
    unknowns = [
        Unknown("armature", "joint2", 0.01, 1.0),
        Unknown("kp", "act2", 500, 5000),
        Unknown("latency", "", 0, 0.03),
    ]
    result = fit(mujoco.MjSpec.from_file(str(PANDA)), _recording(latency_steps=3), unknowns)
    truth = {"joint2.armature": 0.15, "act2.kp": 1600.0, "command_latency": 0.006}
    assert result.nominal == {"joint2.armature": 0.1, "act2.kp": 2000.0, "command_latency": 0.0}
    for name, value in truth.items():
        assert result.identifiable[name], name
        assert abs(result.values[name] - value) <= 1.5 * result.half_width[name] + 1e-9, (name, result)
    assert abs(result.values["act2.kp"] / 1600.0 - 1) < 0.05
    assert abs(result.values["command_latency"] - 0.006) < 0.002
    assert result.rms_residual == pytest.approx(1e-4, rel=0.2)  # down to the recording's noise


@pytest.mark.parametrize("steps", [0, 5])
def test_the_latency_is_fitted_to_the_physics_step(steps):
    result = fit(
        mujoco.MjSpec.from_file(str(PANDA)),
        _recording(latency_steps=steps, seconds=2.0),
        [Unknown("kp", "act2", 500, 5000), Unknown("latency", "", 0, 0.03)],
    )
    assert result.values["command_latency"] == pytest.approx(0.002 * steps, abs=5e-4)


def test_a_parameter_the_data_cannot_show_is_flagged():
    """joint7 held still while the other joints move: its dry friction never acts, whatever its value."""
    unknowns = [Unknown("kp", "act2", 500, 5000), Unknown("frictionloss", "joint7", 0, 5.0)]
    result = fit(mujoco.MjSpec.from_file(str(PANDA)), _recording(excited=JOINTS[:6], seconds=2.0), unknowns)
    assert result.identifiable == {"act2.kp": True, "joint7.frictionloss": False}
    # not shown at all: left at nominal in the overlay, and listed
    assert result.observable == {"act2.kp": True, "joint7.frictionloss": False}
    overlay = overlay_of(result, "panda")
    assert set(overlay.parameters) == {"act2.kp"} and overlay.not_identified == ["joint7.frictionloss"]


@pytest.mark.parametrize(
    ("unknown", "message"),
    [
        (Unknown("mass", "joint2", 0, 1), r"unknown parameter kind 'mass'"),
        (Unknown("armature", "joint2", 1, 1), r"joint2.armature: bounds must satisfy 0 <= low < high"),
        (Unknown("latency", "act2", 0, 1), r"a latency names no target"),
        (Unknown("armature", "joint9", 0, 1), r"joint9.armature: the model has no joint 'joint9'"),
        (Unknown("kp", "act9", 0, 1), r"act9.kp: the model has no actuator 'act9'"),
    ],
)
def test_bad_unknowns_are_refused_naming_them(unknown, message):
    recording = _recording(seconds=0.2)
    with pytest.raises(ValueError, match=message):
        fit(mujoco.MjSpec.from_file(str(PANDA)), recording, [unknown])


def test_a_recording_of_the_wrong_shape_is_refused():
    recording = _recording(seconds=0.2)
    recording.qpos = recording.qpos[:, :6]
    with pytest.raises(ValueError, match=r"qpos must be \[T, joints\] = \[101, 7\], got \[101, 6\]"):
        fit(mujoco.MjSpec.from_file(str(PANDA)), recording, [Unknown("kp", "act2", 500, 5000)])


def test_a_missing_extra_is_named(monkeypatch):
    import sys

    from robotrl.sim2real.sysid import import_sysid

    monkeypatch.setitem(sys.modules, "mujoco.sysid", None)  # as if its imports were missing
    monkeypatch.delattr(mujoco, "sysid", raising=False)  # an earlier import leaves it on the package
    with pytest.raises(ImportError, match=r'pip install -e "\.\[sysid\]"'):
        import_sysid()


def test_closing_absl_logging_leaves_stderr_open():
    """A Hydra program reconfiguring logging closes every handler, absl's (which mujoco.sysid imports) among them;
    before, that closed sys.stderr for the rest of the process."""
    import sys

    import absl.logging
    from robotrl.sim2real.sysid import import_sysid

    import_sysid()
    absl.logging.get_absl_handler().python_handler.close()
    assert not sys.stderr.closed
    print("still writable", file=sys.stderr)


def test_intervals_hold_the_truth_when_the_errors_are_correlated_in_time():
    """A straight-line fit whose errors stay correlated for ~30 samples (as a recording over DDS leaves them): the
    interval that treats each sample as independent holds the true slope far less often than 95%; the block
    sandwich holds it about as often as it says."""
    import numpy as np
    from robotrl.sim2real.sysid import block_intervals

    rng = np.random.default_rng(0)
    samples, channels, slope, rho = 2000, 2, 0.7, 0.9
    x = rng.normal(size=(samples, channels)).cumsum(axis=0) / 30  # a slowly wandering input, as an excitation
    jac = np.stack([x.ravel(), np.ones(x.size)], axis=1)
    held, held_iid = 0, 0
    trials = 300
    for _ in range(trials):
        noise = np.zeros((samples, channels))
        shocks = rng.normal(size=(samples, channels))
        for t in range(1, samples):
            noise[t] = rho * noise[t - 1] + shocks[t]
        y = slope * x.ravel() + 0.2 + noise.ravel()
        params, *_ = np.linalg.lstsq(jac, y, rcond=None)
        residual = jac @ params - y
        _, half = block_intervals(residual, jac, channels)
        held += abs(params[0] - slope) <= half[0]
        iid = 1.96 * np.sqrt(residual @ residual / (y.size - 2) * np.linalg.inv(jac.T @ jac)[0, 0])
        held_iid += abs(params[0] - slope) <= iid
    assert 0.88 <= held / trials <= 0.99, held / trials
    assert held_iid / trials < 0.7, held_iid / trials
