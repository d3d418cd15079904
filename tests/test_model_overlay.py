"""A model overlay (robotrl/core/model_overlay.py), what robotrl-sysid writes: read back as written, the same model
as a fresh compile with its values, taken by the simulated tasks (their randomization then centring on it, the
actuator model adding its latency) and by the twin, and bad files refused by name."""

import mujoco
import pytest
from robotrl.hardware.sim_twin import SimTwinConfig, load_twin_model
from robotrl.sim2real.actuation import ActuationConfig
from robotrl.sim2real.randomization import RandomizationConfig, RandomizationTerm
from robotrl.sim2real.sysid import load_priors
from robotrl.tasks import TASK_CONFIGS, make_task
from robotrl.tasks.arm_task import ASSETS, TaskVecEnv

from robotrl.core.model_overlay import ModelOverlay, load_overlay
from robotrl.runtime.assembly import add_actuation, add_randomization

PANDA = ASSETS / "panda.xml"
VALUES = {
    "joint2.armature": 0.15,
    "joint2.damping": 2.5,
    "joint4.frictionloss": 0.4,
    "act2.kp": 1600.0,
    "act6.kp": 420.0,
    "command_latency": 0.012,
}


@pytest.fixture
def overlay_file(tmp_path):
    path = tmp_path / "overlay.yaml"
    ModelOverlay("panda", dict(VALUES), {"act2.kp": 3.0}, ["joint7.damping"]).save(path)
    return path


def test_an_overlay_reads_back_as_written(overlay_file):
    overlay = load_overlay(overlay_file)
    assert overlay.robot == "panda" and overlay.parameters == VALUES
    assert overlay.half_width_95 == {"act2.kp": 3.0} and overlay.not_identified == ["joint7.damping"]
    assert overlay.command_latency == 0.012
    assert overlay.of_kind("kp") == {"act2": 1600.0, "act6": 420.0}


def test_an_overlaid_spec_compiles_to_the_model_with_those_values(overlay_file):
    spec = mujoco.MjSpec.from_file(str(PANDA))
    load_overlay(overlay_file).apply_to_spec(spec)
    overlaid = spec.compile()
    by_hand = mujoco.MjSpec.from_file(str(PANDA))
    by_hand.joint("joint2").armature = 0.15
    by_hand.joint("joint2").damping[0] = 2.5
    by_hand.joint("joint4").frictionloss = 0.4
    for actuator, kp in (("act2", 1600.0), ("act6", 420.0)):
        by_hand.actuator(actuator).gainprm[0], by_hand.actuator(actuator).biasprm[1] = kp, -kp
    expected = by_hand.compile()
    for field in ("dof_armature", "dof_damping", "dof_frictionloss", "actuator_gainprm", "actuator_biasprm", "dof_M0"):
        assert (getattr(overlaid, field) == getattr(expected, field)).all(), field
    assert overlaid.dof_armature[1] == 0.15 and overlaid.actuator_gainprm[1, 0] == 1600.0


def test_a_task_trains_on_the_overlay_and_its_randomization_centres_on_it(overlay_file):
    cfg = TASK_CONFIGS["panda_pick_cube"](name="panda_pick_cube", model_overlay=str(overlay_file))
    env = TaskVecEnv(make_task(cfg, num_envs=2))
    try:
        backend = env.task.backend

        def read(param, names):
            return backend.physics(param, names).flatten().tolist()

        assert read("joint_armature", ["joint2", "joint3"]) == pytest.approx([0.15, 0.1] * 2)
        assert read("joint_damping", ["joint2"]) == pytest.approx([2.5, 2.5])
        assert read("joint_frictionloss", ["joint4"]) == pytest.approx([0.4, 0.4])
        assert read("actuator_gain", ["act2", "act6"]) == pytest.approx([1600.0, 420.0] * 2)
        terms = {"stiffness": RandomizationTerm(param="actuator_gain", low=0.9, high=1.1)}
        randomizer = add_randomization(env, RandomizationConfig(name="probe", terms=terms), seed=0)
        gains = randomizer.values()["stiffness"]  # [E, actuators]: drawn around the identified stiffness
        index = randomizer.terms[0].names.index("act2")
        assert ((gains[:, index] >= 1600 * 0.9 - 1e-9) & (gains[:, index] <= 1600 * 1.1 + 1e-9)).all()
        # 12 ms of identified latency is 6 physics steps, added to the actuator model's range
        assert add_actuation(env, ActuationConfig(), seed=0).cfg.latency_min == 6
        assert add_actuation(env, ActuationConfig(latency_min=1, latency_max=3), seed=0).cfg.latency_max == 9
    finally:
        env.close()


def test_the_twin_runs_the_overlaid_model(overlay_file):
    overlay = load_overlay(overlay_file)
    model = load_twin_model(SimTwinConfig(overlay=str(overlay_file)), overlay)
    assert model.dof_armature[1] == 0.15 and model.actuator_gainprm[1, 0] == 1600.0
    assert model.ngeom > mujoco.MjModel.from_xml_path(str(PANDA)).ngeom  # the shared scene around the robot


def test_the_panda_priors_bound_every_joint_and_actuator_and_the_latency():
    robot, unknowns = load_priors("panda")
    assert robot == "panda" and len(unknowns) == 7 * 3 + 7 + 1
    friction = {u.target: u.high for u in unknowns if u.kind == "frictionloss"}
    assert friction["joint4"] == pytest.approx(2 * 1.2794, abs=1e-3)  # twice Gaz et al.'s span for joint 4


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"joint2.inertia": 1.0}, "overlay parameter 'joint2.inertia' is not"),
        ({"act2.kp": 0.0}, "act2.kp (a stiffness) must be > 0"),
        ({"joint2.damping": -1.0}, "joint2.damping must be >= 0"),
        ({"joint2.armature": float("nan")}, "joint2.armature must be a finite number"),
        ({"command_latency": 3.0}, "command_latency must be at most 1.0 s"),
        ({"act2.kp": True}, "act2.kp must be a finite number"),
    ],
)
def test_a_bad_overlay_is_refused_naming_the_parameter(tmp_path, parameters, message):
    path = tmp_path / "overlay.yaml"
    path.write_text(f"robot: panda\nparameters: {parameters}\n".replace("nan", ".nan"))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        load_overlay(path)


def test_an_overlay_naming_a_joint_the_model_lacks_is_refused(tmp_path):
    path = tmp_path / "overlay.yaml"
    ModelOverlay("panda", {"joint9.armature": 0.2}).save(path)
    with pytest.raises(KeyError, match=r"overlay joint9\.armature: the model has no joint 'joint9'"):
        load_overlay(path).apply_to_spec(mujoco.MjSpec.from_file(str(PANDA)))
    cfg = TASK_CONFIGS["panda_reach"](name="panda_reach", model_overlay=str(path))
    with pytest.raises((KeyError, ValueError), match="joint9"):
        make_task(cfg, num_envs=1)


def test_an_overlay_of_another_robot_or_a_missing_file_is_refused(tmp_path):
    path = tmp_path / "overlay.yaml"
    ModelOverlay("ur5e", {"act2.kp": 1000.0}).save(path)
    with pytest.raises(ValueError, match="identified a ur5e; panda_reach runs a panda"):
        make_task(TASK_CONFIGS["panda_reach"](name="panda_reach", model_overlay=str(path)), num_envs=1)
    with pytest.raises(FileNotFoundError, match=r"model overlay .*nope\.yaml' does not exist"):
        load_overlay(tmp_path / "nope.yaml")
    with pytest.raises(FileNotFoundError, match="sysid priors 'kuka': no file"):
        load_priors("kuka")


def test_a_run_keeps_its_own_copy_of_the_overlay(tmp_path, overlay_file):
    """The saved config names the run's copy: resuming, evaluating or exporting the run meets the dynamics it
    trained on after the original is edited, and after the run directory moves."""
    from omegaconf import OmegaConf

    from robotrl.runtime.run_config import PINNED_OVERLAY, read_run_config, save_run_config

    original = overlay_file.read_text()
    run = tmp_path / "run"
    run.mkdir()
    save_run_config(OmegaConf.create({"task": {"name": "panda_reach", "model_overlay": str(overlay_file)}}), run)
    assert OmegaConf.load(run / "config.yaml").task.model_overlay == PINNED_OVERLAY
    overlay_file.write_text(original.replace("1600", "900"))  # the lab refits its robot
    assert overlay_file.read_text() != original
    moved = run.rename(tmp_path / "moved")
    saved = read_run_config(moved)
    assert saved.task.model_overlay == str(moved / PINNED_OVERLAY)
    assert (moved / PINNED_OVERLAY).read_text() == original
    save_run_config(saved, moved)  # as a resume saves it again: the copy stays the run's
    assert (moved / PINNED_OVERLAY).read_text() == original
    with pytest.raises(FileNotFoundError, match=r"task.model_overlay='/no/such.yaml': no such file"):
        save_run_config(OmegaConf.create({"task": {"name": "panda_reach", "model_overlay": "/no/such.yaml"}}), run)
