"""The MuJoCo backend's snapshot of state between changes, and its threaded stepping."""

import pytest
import torch
from robotrl.tasks import TASK_CONFIGS, make_task
from robotrl.tasks.arm_task import ASSETS, TaskVecEnv
from robotrl.tasks.mujoco_backend import MujocoBackend


def test_queries_follow_every_state_change_and_return_copies():
    backend = MujocoBackend(ASSETS / "panda_pick_cube.xml", num_envs=2)
    joints = ("joint1", "joint2")
    ids = torch.tensor([1])
    before = backend.joint_pos(joints)
    backend.set_joint_state(ids, joints, torch.tensor([[0.3, -0.4]]))
    after = backend.joint_pos(joints)
    assert torch.equal(after[0], before[0]) and torch.allclose(after[1], torch.tensor([0.3, -0.4]))
    pos, _ = backend.body_pose("hand")
    backend.forward(ids)
    moved, _ = backend.body_pose("hand")
    assert torch.equal(moved[0], pos[0]) and not torch.equal(moved[1], pos[1])
    moved.zero_()  # a caller writing into a result must not change what the next query sees
    assert backend.body_pose("hand")[0].abs().sum() > 0
    cube, _ = backend.body_pose("cube")
    backend.step(5)
    assert not torch.equal(backend.body_pose("cube")[0], cube)  # the cube settled onto the floor


def test_threaded_stepping_matches_sequential_stepping():
    def rollout(threads):
        cfg = TASK_CONFIGS["panda_push"](name="panda_push", sim_threads=threads)
        env = TaskVecEnv(make_task(cfg, num_envs=4))
        env.reset(seed=0)
        generator = torch.Generator().manual_seed(0)
        for _ in range(10):
            result = env.step(torch.rand(4, env.action_dim, generator=generator) * 2 - 1)
        env.close()
        return result.next_obs

    sequential, threaded = rollout(1), rollout(3)
    for key in sequential:
        assert torch.equal(sequential[key], threaded[key])
    with pytest.raises(ValueError, match=r"task\.sim_threads must be >= 1, got 0"):
        MujocoBackend(ASSETS / "panda_reach.xml", num_envs=2, threads=0)


def test_a_diverged_env_is_named_when_stepping_on_threads():
    backend = MujocoBackend(ASSETS / "panda_reach.xml", num_envs=3, threads=3)
    backend.set_joint_state(torch.tensor([2]), ("joint1",), torch.tensor([[float("nan")]]))
    with pytest.raises(FloatingPointError, match="env 2 diverged"):
        backend.step(1)
    backend.close()


def test_a_process_without_mujoco_gl_renders_headless_whatever_imports_mujoco_first():
    """MuJoCo picks its GL backend when first imported; the memory estimate imports it before any backend does,
    so the tasks package sets the EGL default itself (a headless `make train` wrote no video otherwise)."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        from robotrl.tasks.arm_task import ASSETS
        from robotrl.tasks.memory import scene_state_bytes
        scene_state_bytes(str(ASSETS / "panda_reach.xml"))  # mujoco imported here first
        from robotrl.tasks import TASK_CONFIGS, make_env
        cfg = TASK_CONFIGS["panda_reach"](name="panda_reach", render_width=64, render_height=48)
        env = make_env(cfg, render=True)
        env.reset(seed=0)
        frame = env.render()
        print(frame.shape, frame.std() > 0)
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM", "DISPLAY")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "(48, 64, 3) True"
