"""Physics randomization on the MuJoCo backend: per-env draws that repeat with the seed, their distributions, a
changed model equal to a freshly compiled one, interval draws, the draw log, the presets and bad ranges. The same
per-env draws on Genesis are checked in test_genesis_backend.py (its scenes share one process's compiled kernels)."""

import itertools
import json
import math

import mujoco
import numpy as np
import pytest
import torch
from helpers import run_module
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from robotrl.sim2real.randomization import (
    RandomizationConfig,
    RandomizationTargets,
    RandomizationTerm,
    sample,
)
from robotrl.tasks import TASK_CONFIGS, make_task
from robotrl.tasks.arm_task import ASSETS, TaskVecEnv
from robotrl.tasks.mujoco_backend import MujocoBackend, scene_spec
from scipy import stats

from robotrl.config import register_configs
from robotrl.runtime.assembly import add_randomization


def _preset(name: str) -> RandomizationConfig:
    """A preset as robotrl-train composes it (configs/randomization/<name>.yaml)."""
    register_configs()
    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"randomization={name}"])
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RandomizationConfig), cfg.randomization))


def _env(name="panda_pick_cube", num_envs=4, backend="mujoco"):
    return TaskVecEnv(make_task(TASK_CONFIGS[name](name=name, backend=backend), num_envs))


def _randomized(preset="default", seed=3, num_envs=4, name="panda_pick_cube", log=None):
    env = _env(name, num_envs)
    randomizer = add_randomization(env, _preset(preset), seed, log)
    env.reset(seed=0)
    return env, randomizer


def test_per_env_values_differ_and_repeat_with_the_seed():
    env, first = _randomized(seed=3)
    again_env, again = _randomized(seed=3)
    other_env, other = _randomized(seed=4)
    for key, values in first.values().items():
        assert not torch.equal(values[0], values[1]), key  # per env
        assert torch.equal(values, again.values()[key]), key
        assert not torch.equal(values, other.values()[key]), key
    # and the simulator runs with them: env 1's cube weighs what was drawn for env 1
    cube = env.task.backend.model.body("cube").id
    drawn = first.values()["object_mass"][:, 0]
    assert [env.task.backend.models[i].body_mass[cube] for i in range(4)] == pytest.approx(drawn.tolist())
    for e in (env, again_env, other_env):
        e.close()


def test_reset_draws_change_only_the_reset_envs_and_leave_states_alone():
    env, randomizer = _randomized()
    before = randomizer.values()
    qpos = env.task.backend.joint_pos(env.task.robot.joints)
    randomizer.on_reset(torch.tensor([2]))
    after = randomizer.values()
    assert torch.equal(env.task.backend.joint_pos(env.task.robot.joints), qpos)
    for key in before:
        assert torch.equal(after[key][[0, 1, 3]], before[key][[0, 1, 3]]), key
        assert not torch.equal(after[key][2], before[key][2]), key
    env.close()


@pytest.mark.parametrize(
    ("distribution", "cdf"),
    [
        ("uniform", lambda x: stats.uniform(0.5, 1.5).cdf(x)),
        ("log_uniform", lambda x: stats.loguniform(0.5, 2.0).cdf(x)),
        ("gaussian", lambda x: stats.truncnorm(-1.5, 1.5, loc=1.25, scale=0.5).cdf(x)),
    ],
)
def test_draws_follow_their_distribution(distribution, cdf):
    term = RandomizationTerm(distribution=distribution, low=0.5, high=2.0, std=0.5)
    term.validate("t")
    draws = sample(term, (20_000,), torch.Generator().manual_seed(0)).numpy()
    assert draws.min() >= 0.5 and draws.max() <= 2.0
    assert stats.kstest(draws, cdf).pvalue > 0.01


def _fresh_compile(xml, changed: mujoco.MjModel, bodies, joints, actuators, resized=()) -> mujoco.MjModel:
    """The scene compiled from its MJCF with `changed`'s values written into the spec (shapes: of `resized`)."""
    spec = scene_spec(xml)
    for name in bodies:
        body, i = spec.body(name), changed.body(name).id
        body.explicitinertial = True
        body.mass = float(changed.body_mass[i])
        body.ipos, body.iquat, body.inertia = changed.body_ipos[i], changed.body_iquat[i], changed.body_inertia[i]
        body.fullinertia = [math.nan, 0, 0, 0, 0, 0]
        first = changed.body(name).geomadr[0]
        for k, geom in enumerate(body.geoms):
            geom.friction[0] = changed.geom_friction[first + k, 0]
            if name in resized:
                geom.size, geom.pos = changed.geom_size[first + k], changed.geom_pos[first + k]
        for site in body.sites if name in resized else ():
            site.pos, site.size = changed.site(site.name).pos, changed.site(site.name).size
    for name in joints:
        joint, dof = spec.joint(name), changed.joint(name).dofadr[0]
        joint.armature, joint.frictionloss = float(changed.dof_armature[dof]), float(changed.dof_frictionloss[dof])
        joint.damping = [float(changed.dof_damping[dof]), 0.0, 0.0]
    for name in actuators:
        actuator, i = spec.actuator(name), changed.actuator(name).id
        actuator.gainprm[0], actuator.biasprm[1] = changed.actuator_gainprm[i, 0], changed.actuator_biasprm[i, 1]
    spec.option.gravity = changed.opt.gravity
    return spec.compile()


@pytest.mark.parametrize("name", ["panda_pick_cube", "hand_reorient"])
def test_a_randomized_model_equals_a_fresh_compile_with_its_values(name):
    """MuJoCo derives constants from masses, centres of mass, sizes and armatures (mj_setConst); the backend
    recomputes them, and moves and scales each body's bounding volumes with its centre of mass and size, so nothing
    stale is left."""
    env, randomizer = _randomized(name=name, num_envs=2, preset="wide")
    if name == "panda_pick_cube":  # the cube resized (after its centre of mass moved), hand_reorient's cube not
        assert randomizer.values()["object_size"][1, 0] != 1.0
    backend = env.task.backend
    # a centre-of-mass shift on every robot body too (the presets move only the objects')
    targets = RandomizationTargets.of_task(env.task)
    bodies = targets.robot_bodies
    backend.set_physics("body_com", torch.tensor([1]), bodies, backend.physics("body_com", bodies)[1:] + 0.01)
    changed = backend.models[1]
    fresh = _fresh_compile(
        ASSETS / env.task.scene,
        changed,
        targets.robot_bodies + targets.objects,
        targets.robot_joints,
        targets.robot_actuators,
        targets.resizable,
    )
    differ = [
        field
        for field in dir(fresh)
        if not field.startswith("_")
        and isinstance(getattr(fresh, field), np.ndarray)
        and not np.allclose(getattr(fresh, field), getattr(changed, field), rtol=1e-9, atol=1e-12, equal_nan=True)
    ]
    assert differ == []
    assert not np.allclose(changed.body_mass, backend.model.body_mass)  # something was changed
    env.close()


def test_a_resized_cube_rests_on_the_table_and_is_judged_by_its_size():
    """body_size scales the cube (mass kept, inertia with the size squared); the task places each env's cube on the
    table by its own half size and measures its lift from there, so the expert still picks every size."""
    cfg = RandomizationConfig(
        terms={"size": RandomizationTerm(param="body_size", target="object", low=0.75, high=1.25, when="startup")}
    )
    env = _env("panda_pick_cube", 4)
    randomizer = add_randomization(env, cfg, seed=0)
    env.reset(seed=0)
    sizes = randomizer.values()["size"][:, 0]
    backend = env.task.backend
    assert sizes.min() < 0.9 and sizes.max() > 1.1
    for e, size in enumerate(sizes.tolist()):
        model = backend.models[e]
        cube = model.body("cube").id
        assert model.geom_size[model.body("cube").geomadr[0]] == pytest.approx([0.02 * size] * 3)
        assert model.body_mass[cube] == pytest.approx(backend.model.body_mass[cube])
        assert model.body_inertia[cube] == pytest.approx(backend.model.body_inertia[cube] * size**2)
    for _ in range(5):  # settled: each cube rests on the table at its own half size, not sunk in or dropped
        env.step(torch.zeros(4, env.action_dim))
    height = backend.body_pose("cube")[0][:, 2].double()
    assert height.numpy() == pytest.approx((0.02 * sizes).numpy(), abs=1e-3)
    won = torch.zeros(4, dtype=torch.bool)
    for _ in range(env.task.episode_steps):
        result = env.step(env.task.expert_action())
        won |= result.success
        if won.all():
            break
    assert won.all(), sizes
    with pytest.raises(ValueError, match=r"body_size: body 'world' has a mesh, height field or plane"):
        backend.set_physics("body_size", torch.tensor([0]), ["world"], torch.tensor([[1.1]]))
    with pytest.raises(ValueError, match=r"size.target of body_size must be object"):
        RandomizationTerm(param="body_size", target="robot", low=0.9, high=1.1).validate("size")
    with pytest.raises(ValueError, match=r"size.when of body_size must be startup or reset"):
        RandomizationTerm(param="body_size", target="object", low=0.9, high=1.1, when="interval", every=5).validate(
            "size"
        )
    with pytest.raises(ValueError, match=r"body_size of \['cube'\] must be > 0"):
        backend.set_physics("body_size", torch.tensor([0]), ["cube"], torch.tensor([[0.0]]))
    env.close()


def test_interval_draws_come_every_k_steps_per_env():
    cfg = RandomizationConfig(
        terms={"gain": RandomizationTerm(param="actuator_gain", low=0.8, high=1.2, when="interval", every=3)}
    )
    env = _env("panda_reach", 2)
    randomizer = add_randomization(env, cfg, seed=0)
    env.reset(seed=0)
    history = [randomizer.values()["gain"]]
    zero = torch.zeros(2, env.action_dim)
    for _ in range(7):
        env.step(zero)
        history.append(randomizer.values()["gain"])
    changed = [not torch.equal(a, b) for a, b in itertools.pairwise(history)]
    assert changed == [False, False, True, False, False, True, False]
    env.close()


def test_every_draw_is_logged_per_env_and_episode(tmp_path):
    log = tmp_path / "randomization.jsonl"
    env, randomizer = _randomized(num_envs=2, log=log)
    zero = torch.zeros(2, env.action_dim)
    for _ in range(env.task.episode_steps):  # every env's episode ends once
        env.step(zero)
    randomizer.close()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    resets = [line for line in lines if line["when"] == "reset"]
    assert [(line["step"], line["env"]) for line in resets] == [(0, 0), (0, 1), (100, 0), (100, 1)]
    startup = [line for line in lines if line["when"] == "startup"]
    assert startup == []  # the default preset draws at reset only
    values = randomizer.values()
    assert resets[-1]["values"]["object_mass"]["cube"] == pytest.approx(values["object_mass"][1, 0].item())
    env.close()


def test_the_presets_compose_and_none_changes_nothing():
    assert _preset("none").terms == {}
    for name in ("default", "wide"):
        cfg = _preset(name)
        cfg.validate()
        assert {"object_mass", "object_friction", "actuator_gain", "joint_frictionloss"} <= set(cfg.terms)
    wide, default = _preset("wide"), _preset("default")
    assert wide.terms["object_mass"].high > default.terms["object_mass"].high
    env = _env("panda_reach", 2)
    assert add_randomization(env, _preset("none"), seed=0) is None
    env.close()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"low": 1.3, "high": 0.7}, r"randomization.terms.bad: the range \[low, high\] = \[1.3, 0.7\] is empty"),
        ({"low": -0.5}, r"randomization.terms.bad.low would make body_mass <= 0"),
        ({"high": math.inf}, r"randomization.terms.bad.high must be finite"),
        ({"low": math.nan}, r"randomization.terms.bad.low must be finite"),
        ({"distribution": "log_uniform", "low": 0.0}, r"randomization.terms.bad.low of a log_uniform range"),
        ({"distribution": "gaussian"}, r"randomization.terms.bad.std of a gaussian"),
        ({"when": "interval"}, r"randomization.terms.bad.every must be >= 1 with when=interval"),
        ({"target": "world"}, r"randomization.terms.bad.target of body_mass must be one of robot, object"),
        ({"param": "inertia"}, r"randomization.terms.bad.param must be one of"),
        ({"param": "body_com"}, r"randomization.terms.bad.operation of body_com must be add or set"),
    ],
)
def test_bad_ranges_are_refused_naming_the_key(change, message):
    cfg = RandomizationConfig(terms={"bad": RandomizationTerm(**{"low": 0.7, "high": 1.3, **change})})
    with pytest.raises(ValueError, match=message):
        cfg.validate()


def test_an_add_range_that_would_cross_zero_is_refused_at_start_up():
    env = _env("panda_reach", 1)
    term = RandomizationTerm(param="joint_damping", operation="add", low=-5.0, high=0.0)
    with pytest.raises(ValueError, match=r"randomization.terms.damp.low=-5.0 would make joint_damping .* negative"):
        add_randomization(env, RandomizationConfig(terms={"damp": term}), seed=0)
    env.close()


def test_the_backend_refuses_values_a_simulator_cannot_hold():
    backend = MujocoBackend(ASSETS / "panda_pick_cube.xml", 1)
    with pytest.raises(ValueError, match=r"body_mass of \['cube'\] must be > 0"):
        backend.set_physics("body_mass", torch.tensor([0]), ["cube"], torch.tensor([[0.0]]))
    with pytest.raises(ValueError, match=r"friction of \['cube'\] must be finite"):
        backend.set_physics("friction", torch.tensor([0]), ["cube"], torch.tensor([[math.nan]]))
    with pytest.raises(ValueError, match=r"unknown physics parameter 'mass'"):
        backend.physics("mass", ["cube"])
    backend.close()


def test_train_with_a_preset_logs_its_draws_eval_takes_a_corner_and_a_typo_is_named(tmp_path):
    run = tmp_path / "run"
    common = ["task=panda_pick_cube", "total_steps=240", "learning_starts=200", "num_envs=2", "video=false"]
    common += ["eval_interval=1000", "eval_episodes=1", "checkpoint_interval=1000", "progress=false"]
    common += [f"hydra.run.dir={run}"]
    run_module("robotrl.train", *common, "randomization=default")
    lines = (run / "randomization.jsonl").read_text().splitlines()
    assert len(lines) == 4  # two envs, each reset at the start and after its 100-step episode
    # the run evaluated at one corner: the cube 30% heavier, commands 20 ms late
    corner = [
        "randomization=fixed",
        "randomization.terms.object_mass.low=1.3",
        "randomization.terms.object_mass.high=1.3",
    ]
    latency = ["actuation.latency_min=10", "actuation.latency_max=10"]
    out = tmp_path / "eval"
    args = [f"run={run}", "episodes=1", "video=false", *corner, *latency, f"hydra.run.dir={out}"]
    result = run_module("robotrl.eval", *args)
    assert json.loads(result.stdout.strip().splitlines()[-1])["randomization"] == "fixed"
    drawn = json.loads((out / "randomization.jsonl").read_text().splitlines()[0])["values"]
    assert drawn["object_mass"] == {"cube": pytest.approx(0.065)}
    assert drawn["actuator_gain"]["act1"] == pytest.approx(2000.0)  # the other terms at their nominal values
    bad = "randomization.terms.object_mass.low=-1"
    result = run_module("robotrl.train", *common, "randomization=default", bad, check=False)
    assert result.returncode != 0
    assert "randomization.terms.object_mass.low" in result.stderr


def _pixel_env(num_envs=3):
    cfg = TASK_CONFIGS["panda_pick_cube"](name="panda_pick_cube", obs="pixels", image_size=64)
    return TaskVecEnv(make_task(cfg, num_envs))


def test_camera_randomization_changes_every_envs_frame_and_repeats_with_the_seed():
    """The same states seen through the default preset's cameras, lights and colours: every env's frame differs
    from the nominal scene's, and the same seed draws the same frames."""
    nominal, first, again = _pixel_env(), _pixel_env(), _pixel_env()
    randomizers = [add_randomization(env, _preset("default"), seed=7) for env in (first, again)]
    assert {"camera_pos", "camera_tilt", "camera_fovy", "light_diffuse", "table_colour"} <= set(randomizers[0].values())
    frames = [env.reset(seed=0)["pixels_front"] for env in (nominal, first, again)]
    # the reset draws the same layouts: only what the camera sees differs
    assert torch.equal(
        nominal.task.backend.joint_pos(nominal.task.robot.joints),
        first.task.backend.joint_pos(nominal.task.robot.joints),
    )
    for env in range(3):
        assert (frames[1][env].float() - frames[0][env].float()).abs().mean() > 2.0, env
    assert torch.equal(frames[1], frames[2])
    for env in (nominal, first, again):
        env.close()


def test_a_camera_moved_in_one_env_moves_that_envs_frame_only():
    env = _pixel_env(2)
    env.reset(seed=0)
    backend = env.task.backend
    before = backend.render("front", 64, 64)
    shifted = backend.physics("camera_pos", ["front"])[1:] + torch.tensor([0.0, 0.0, 0.02])
    backend.set_physics("camera_pos", torch.tensor([1]), ["front"], shifted)
    after = backend.render("front", 64, 64)
    assert torch.equal(after[0], before[0]) and not torch.equal(after[1], before[1])
    backend.set_physics("camera_fovy", torch.tensor([0]), ["front"], torch.tensor([[60.0]]))
    assert not torch.equal(backend.render("front", 64, 64)[0], before[0])
    with pytest.raises(ValueError, match=r"camera_fovy of \['front'\] must be below 180 degrees"):
        backend.set_physics("camera_fovy", torch.tensor([0]), ["front"], torch.tensor([[180.0]]))
    env.close()


def test_visual_terms_change_nothing_where_a_task_observes_state():
    env = _env("panda_pick_cube", 2)
    randomizer = add_randomization(env, _preset("default"), seed=0)
    assert not {"camera_pos", "light_diffuse", "robot_colour"} & set(randomizer.values())
    env.close()
