"""The scene between robot episodes, without a robot: tracked objects' poses come from a function, so the wait
for objects back in their start regions and still, its refusals (by name), its cancellation, the request to
put objects back, and the goal sampler's checks and seeded draws are tested on their own."""

import threading
import time

import numpy as np
import pytest
import torch
from robotrl.hardware.robot_env_config import RobotEnvConfig
from robotrl.hardware.scene_reset import SceneReset, SceneResetError

from robotrl.core.env import EnvCancelled

REGION = {"puck": [[0.4, -0.1], [0.6, 0.1]]}


def config(**overrides) -> RobotEnvConfig:
    values = {"scene_timeout": 0.5, "scene_settle": 0.1, "policy_rate_hz": 100.0, "reset_timeout": 0.3}
    return RobotEnvConfig(**{**values, **overrides})


def around_puck(positions, generator):
    """push's goal: 10-20 cm from the puck in x, as a task's draw_goals would (from the generator)."""
    offset = 0.1 + 0.1 * torch.rand(1, generator=generator).item()
    return {"goal": positions["puck"][:2] + np.array([offset, 0.0], np.float32)}


class Poses:
    """Where each object is seen, and what keeps its pose from being used (None: fresh)."""

    def __init__(self, **positions):
        self.positions = {name: (np.asarray(p, np.float32), None) for name, p in positions.items()}
        self.calls = 0

    def __call__(self, name):
        self.calls += 1
        return self.positions.get(name, (np.zeros(3, np.float32), "has sent no pose"))


def test_the_wait_ends_once_each_object_is_in_its_start_region_and_still():
    poses = Poses(puck=[0.5, 0.0, 0.02])
    scene = SceneReset(config(), ["puck"], {}, poses, REGION)
    start = time.monotonic()
    positions = scene.wait()
    assert time.monotonic() - start >= 0.1  # still for scene_settle
    np.testing.assert_allclose(positions["puck"], [0.5, 0.0, 0.02])
    assert scene.start_regions["puck"][0].tolist() == pytest.approx([0.4, -0.1])


def test_an_object_out_of_its_region_is_refused_by_name_and_asked_for_once():
    requests = []
    poses = Poses(puck=[0.9, 0.0, 0.02])
    scene = SceneReset(config(scene_timeout=0.2), ["puck"], {}, poses, REGION, request=lambda: requests.append(1))
    with pytest.raises(SceneResetError, match=r"within hardware.scene_timeout 0.2 s: puck at \[0.9, 0.0\], not in its"):
        scene.wait()
    assert requests == [1] and poses.calls > 5  # asked once, looked every policy period
    # a pose that is not fresh is named as the pose reader says
    poses.positions = {}
    with pytest.raises(SceneResetError, match="puck has sent no pose"):
        scene.wait()


def test_an_object_that_keeps_moving_never_settles():
    poses = Poses(puck=[0.45, 0.0, 0.02])

    def moving(name):
        position, _ = poses(name)
        position = position + np.array([0.01, 0.0, 0.0], np.float32) * (poses.calls % 2)  # 1 cm back and forth
        return position, None

    scene = SceneReset(config(scene_timeout=0.3), ["puck"], {}, moving, REGION)
    with pytest.raises(SceneResetError, match=r"puck placed but not yet still for 0.1 s"):
        scene.wait()


def test_a_cancel_ends_the_wait():
    cancel = threading.Event()
    scene = SceneReset(config(scene_timeout=30.0), ["puck"], {}, Poses(), REGION)
    threading.Timer(0.1, cancel.set).start()
    start = time.monotonic()
    with pytest.raises(EnvCancelled, match="reset cancelled while waiting for the scene: puck has sent no pose"):
        scene.wait(cancel)
    assert time.monotonic() - start < 5.0


def test_goals_are_checked_once_then_drawn_around_the_objects_repeatably():
    goal = {"goal": np.zeros(2, np.float32)}
    scene = SceneReset(config(), ["puck"], goal, Poses(puck=[0.5, 0.0, 0.02]), REGION, around_puck)
    assert scene.drawn_goals == ["goal"]
    assert 0.6 <= goal["goal"][0] <= 0.7 and goal["goal"][1] == pytest.approx(0.0)  # around the region's centre
    draws = []
    for _ in range(2):
        scene.seed(3)
        scene.draw_goals({"puck": np.array([0.45, 0.05, 0.02], np.float32)})
        draws.append(goal["goal"].copy())  # written into the env's own goal dict
    np.testing.assert_array_equal(draws[0], draws[1])
    assert 0.55 <= draws[0][0] <= 0.65 and draws[0][1] == pytest.approx(0.05)

    with pytest.raises(ValueError, match="draws around object 'puck', which has no start region"):
        SceneReset(config(), [], {"goal": np.zeros(2, np.float32)}, Poses(), {}, around_puck)
    with pytest.raises(ValueError, match=r"draws 'goal' of shape \(2,\); the env has \(3,\)"):
        SceneReset(config(), ["puck"], {"goal": np.zeros(3, np.float32)}, Poses(), REGION, around_puck)
    with pytest.raises(ValueError, match=r"draws 'goal' of shape .*; the env has no such goal"):
        SceneReset(config(), ["puck"], {}, Poses(), REGION, around_puck)
    with pytest.raises(ValueError, match="drew a non-finite 'goal'"):
        scene.draw_goals({"puck": np.array([np.nan, 0.0, 0.0], np.float32)})
    with pytest.raises(ValueError, match=r"start_regions.puck must be \[\[low...\], \[high...\]\]"):
        SceneReset(config(), ["puck"], {}, Poses(), {"puck": [[0.6], [0.4]]})


def test_with_the_scene_unchecked_drawn_goals_still_need_a_fresh_pose_within_reset_timeout():
    goal = {"goal": np.zeros(2, np.float32)}
    scene = SceneReset(config(scene_timeout=0.0), ["puck"], goal, Poses(), REGION, around_puck)
    with pytest.raises(SceneResetError, match=r"within hardware.reset_timeout 0.3 s: puck has sent no pose$"):
        scene.wait()
    anywhere = Poses(puck=[0.9, 0.5, 0.02])  # out of its box: not checked, only a fresh pose is needed
    scene = SceneReset(config(scene_timeout=0.0), ["puck"], goal, anywhere, REGION, around_puck)
    np.testing.assert_allclose(scene.wait()["puck"], [0.9, 0.5, 0.02])
    # nothing tracked, nothing drawn: nothing to wait for
    assert SceneReset(config(), [], {}, Poses(), REGION).wait() == {}
