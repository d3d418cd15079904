"""USB cameras through OpenCV and the per-camera crop: a synthetic capture source (isOpened/read/release, as
cv2.VideoCapture) feeds OpenCVCamera, whose newest frame is RGB and ages from when it was read; failed reads are
counted and the camera comes back (after a reopen too); close joins its thread; a source that does not open is
refused by name. `crop_and_resize` cuts the right region and refuses bad crops; the robot env's config refuses a
source or crop for an unknown camera and malformed ones; the assembler crops either source's frame; the simulated
render with a crop equals the crop of a larger render of the same camera; robotrl-deploy warns when the robot's
crop is not the policy's; and a real OpenCV source (an image sequence) feeds a robot env's pixels_<name> over
DDS against the twin (domain 229)."""

import logging
import math
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch
from helpers import wait_until
from robotrl.hardware.cameras import OpenCVCamera, parse_source, to_rgb
from robotrl.hardware.robot_env_config import RobotEnvConfig
from robotrl.hardware.ros2 import Received
from robotrl.tasks import deploy_spec_for, make_env
from robotrl.tasks.configs import ArmTaskConfig

from robotrl.core.camera_crop import check_crop, crop_and_resize, render_size

RED, GREEN, BLUE, WHITE = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255)


def quadrants(height: int = 40, width: int = 60) -> torch.Tensor:
    """A [3, H, W] RGB frame: red top-left, green top-right, blue bottom-left, white bottom-right."""
    frame = torch.zeros(3, height, width, dtype=torch.uint8)
    h, w = height // 2, width // 2
    for (rows, cols), colour in zip(
        [
            (slice(0, h), slice(0, w)),
            (slice(0, h), slice(w, None)),
            (slice(h, None), slice(0, w)),
            (slice(h, None), slice(w, None)),
        ],
        [RED, GREEN, BLUE, WHITE],
        strict=True,
    ):
        frame[:, rows, cols] = torch.tensor(colour, dtype=torch.uint8)[:, None, None]
    return frame


def bgr(frame: torch.Tensor) -> np.ndarray:
    """A [3, H, W] RGB tensor as OpenCV gives it: HxWx3 BGR."""
    return np.ascontiguousarray(frame.permute(1, 2, 0).numpy()[:, :, ::-1])


class SyntheticCapture:
    """What cv2.VideoCapture offers, from a script: each read takes the next item of `script` (a frame, or None
    for a failed read); past its end it repeats `then` (None: fails forever)."""

    def __init__(self, script, then=None, opened: bool = True, period: float = 0.002):
        self.script, self.then, self.opened, self.period = list(script), then, opened, period
        self.reads, self.released, self.last = 0, False, None
        self.lock = threading.Lock()

    def isOpened(self) -> bool:  # OpenCV's name
        return self.opened and not self.released

    def read(self):
        time.sleep(self.period)  # a camera's frame interval
        with self.lock:
            item = self.script[self.reads] if self.reads < len(self.script) else self.then
            self.reads += 1
            if item is None:
                return False, None
            self.last = item
            return True, item

    def release(self) -> None:
        self.released = True


def test_the_newest_frame_is_rgb_stamped_when_read_and_ages():
    frames = [bgr(torch.full((3, 4, 6), i, dtype=torch.uint8)) for i in range(10)]
    frames[-1] = bgr(quadrants(4, 6))
    capture = SyntheticCapture(frames)
    camera = OpenCVCamera("wrist", 0, capture_factory=lambda source: capture, retry_delay=0.01, reopen_after=10_000)
    try:
        assert wait_until(lambda: camera.stats["frames"] == 10, timeout=5.0)
        received = camera.latest()
        assert isinstance(received, Received) and received.source_time is None
        assert received.msg.shape == (4, 6, 3) and received.msg.dtype == np.uint8
        np.testing.assert_array_equal(received.msg, quadrants(4, 6).permute(1, 2, 0).numpy())  # the newest, as RGB
        assert received.received_at <= time.monotonic()
        first_age = received.age()
        time.sleep(0.05)  # no new frame comes: the same one, older
        assert camera.latest() is received and received.age() >= first_age + 0.05
    finally:
        camera.close()


def test_failed_reads_are_counted_and_the_camera_comes_back():
    one, two = bgr(torch.full((3, 2, 2), 1, dtype=torch.uint8)), bgr(torch.full((3, 2, 2), 2, dtype=torch.uint8))
    capture = SyntheticCapture([one, *[None] * 5], then=two)
    camera = OpenCVCamera("side", 0, capture_factory=lambda source: capture, retry_delay=0.005, reopen_after=10_000)
    try:
        assert wait_until(lambda: camera.latest() is not None and camera.latest().msg[0, 0, 0] == 2, timeout=5.0)
        assert camera.stats["failed_reads"] == 5 and camera.stats["reopens"] == 0
    finally:
        camera.close()


def test_an_unplugged_camera_is_reopened_and_its_frames_age_meanwhile():
    """A camera that stops reading (unplugged) is released and opened again after reopen_after failures; while the
    source is away (not opened) its last frame only ages; once back, frames are new."""
    old = bgr(torch.full((3, 2, 2), 7, dtype=torch.uint8))
    new = bgr(torch.full((3, 2, 2), 9, dtype=torch.uint8))
    captures = [SyntheticCapture([old]), SyntheticCapture([], opened=False), SyntheticCapture([], then=new)]
    opened = []

    def factory(source):
        capture = captures[min(len(opened), len(captures) - 1)]
        opened.append(capture)
        return capture

    camera = OpenCVCamera("wrist", "/dev/video0", capture_factory=factory, retry_delay=0.005, reopen_after=3)
    try:
        assert wait_until(lambda: camera.latest() is not None, timeout=5.0)
        stale = camera.latest()
        assert stale.msg[0, 0, 0] == 7
        assert wait_until(lambda: camera.latest().msg[0, 0, 0] == 9, timeout=5.0)
        assert camera.stats["reopens"] >= 2 and camera.stats["failed_reads"] >= 6
        assert captures[0].released and captures[1].released  # each dead capture let go of
        assert camera.latest().received_at > stale.received_at
    finally:
        camera.close()


def test_close_joins_the_thread_and_releases_the_capture_once():
    capture = SyntheticCapture([], then=bgr(quadrants(4, 4)))
    camera = OpenCVCamera("wrist", 0, capture_factory=lambda source: capture)
    assert wait_until(lambda: camera.latest() is not None, timeout=5.0)
    camera.close()
    assert not camera.thread.is_alive() and capture.released and camera.closed
    reads = capture.reads
    camera.close()  # again: nothing
    time.sleep(0.02)
    assert capture.reads == reads


def test_a_source_that_does_not_open_is_refused_by_name():
    capture = SyntheticCapture([], opened=False)
    with pytest.raises(ValueError, match=r"camera 'wrist': OpenCV could not open source '/dev/video9'"):
        OpenCVCamera("wrist", "/dev/video9", capture_factory=lambda source: capture)
    assert capture.released
    pytest.importorskip("cv2")
    with pytest.raises(ValueError, match=r"camera 'side'.*'/nonexistent/side\.avi'"):
        OpenCVCamera("side", "/nonexistent/side.avi")  # the real cv2.VideoCapture


def test_frames_from_opencv_become_rgb():
    grey = np.arange(6, dtype=np.uint8).reshape(2, 3)
    np.testing.assert_array_equal(to_rgb(grey), np.repeat(grey[:, :, None], 3, axis=2))
    bgra = np.zeros((2, 3, 4), np.uint8)
    bgra[..., 0], bgra[..., 3] = 200, 50  # blue, alpha
    np.testing.assert_array_equal(to_rgb(bgra)[0, 0], [0, 0, 200])
    with pytest.raises(ValueError, match="8-bit"):
        to_rgb(np.zeros((2, 2, 3), np.uint16))


def test_crop_and_resize_cuts_the_named_region():
    frame = quadrants()
    for crop, colour in [
        ((0.0, 0.5, 0.0, 0.5), RED),
        ((0.0, 0.5, 0.5, 1.0), GREEN),
        ((0.5, 1.0, 0.0, 0.5), BLUE),
        ((0.5, 1.0, 0.5, 1.0), WHITE),
    ]:
        out = crop_and_resize(frame, crop, 8)
        assert out.shape == (3, 8, 8) and out.dtype == torch.uint8
        assert (out == torch.tensor(colour, dtype=torch.uint8)[:, None, None]).all(), crop
    # no crop: the whole frame, area-resized; a batch crops each frame alike
    whole = crop_and_resize(frame, None, 10)
    expect = torch.nn.functional.interpolate(frame[None].float(), size=(10, 10), mode="area")[0]
    torch.testing.assert_close(whole, expect.round().to(torch.uint8))
    batch = crop_and_resize(torch.stack([frame, frame.flip(2)]), [0.0, 0.5, 0.5, 1.0], 4)
    assert (batch[0] == torch.tensor(GREEN, dtype=torch.uint8)[:, None, None]).all()
    assert (batch[1] == torch.tensor(RED, dtype=torch.uint8)[:, None, None]).all()
    # the region of a larger render of the same view, at the size that only downsamples
    assert render_size((0.25, 0.75, 0.0, 1.0), 64, 480) == 128 and render_size(None, 64, 480) == 64
    assert render_size((0.0, 0.1, 0.0, 1.0), 128, 480) == 480  # capped


@pytest.mark.parametrize(
    ("crop", "message"),
    [
        ([0.5, 0.2, 0.0, 1.0], r"top < bottom and left < right, got \[0.5, 0.2, 0.0, 1.0\]"),
        ([0.0, 1.0, 0.7, 0.7], r"top < bottom and left < right"),
        ([0.0, 1.2, 0.0, 1.0], r"each in \[0, 1\]; got \[0.0, 1.2, 0.0, 1.0\]"),
        ([0.0, 1.0, 0.0], r"\[top, bottom, left, right\].*got \[0.0, 1.0, 0.0\]"),
        ([0.0, math.nan, 0.0, 1.0], r"four finite numbers"),
        ("0,1,0,1", r"\[top, bottom, left, right\]"),
    ],
)
def test_bad_crops_are_refused_naming_them(crop, message):
    with pytest.raises(ValueError, match=message):
        check_crop(crop, "hardware.camera_crops.wrist")
    with pytest.raises(ValueError, match=r"hardware\.camera_crops\.wrist"):
        RobotEnvConfig(cameras=["wrist"], camera_crops={"wrist": crop}).validate()
    with pytest.raises(ValueError, match=r"crop"):
        crop_and_resize(quadrants(), crop, 8)


def test_the_config_refuses_sources_and_crops_of_unknown_cameras_and_malformed_sources():
    assert parse_source("ros", "x") == ("ros", None)
    assert parse_source("opencv:0", "x") == ("opencv", 0)
    assert parse_source("opencv:/dev/video2", "x") == ("opencv", "/dev/video2")
    assert parse_source("opencv:rtsp://10.0.0.5/stream", "x") == ("opencv", "rtsp://10.0.0.5/stream")
    with pytest.raises(ValueError, match=r"hardware\.camera_sources names cameras \['side'\].*\['wrist'\]"):
        RobotEnvConfig(cameras=["wrist"], camera_sources={"side": "opencv:0"}).validate()
    with pytest.raises(ValueError, match=r"hardware\.camera_crops names cameras \['side'\]"):
        RobotEnvConfig(cameras=["wrist"], camera_crops={"side": [0, 1, 0, 1]}).validate()
    for bad in ("usb:0", "opencv:", "opencv", "", 0):
        with pytest.raises(ValueError, match=r"hardware\.camera_sources\.wrist must be 'ros' or 'opencv:"):
            RobotEnvConfig(cameras=["wrist"], camera_sources={"wrist": bad}).validate()
    # a USB camera has no topic: its name need not make one
    cfg = RobotEnvConfig(cameras=["wrist"], camera_sources={"wrist": "opencv:0"}, camera_topic="/bad topic/{name}")
    cfg.validate()
    assert cfg.camera_source("wrist") == ("opencv", 0) and cfg.camera_crop("wrist") is None
    with pytest.raises(ValueError, match=r"hardware\.camera_topic"):
        RobotEnvConfig(cameras=["wrist"], camera_topic="/bad topic/{name}").validate()


def test_the_hardware_configs_take_sources_and_crops_as_overrides():
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from robotrl.hardware.deploy import register_config

    register_config()
    overrides = [  # a mapping's new keys are added with +, as robotrl-deploy's +goal.<key>=...
        "run=/tmp/x",
        "hardware=panda",
        "hardware.cameras=[wrist]",
        "+hardware.camera_sources.wrist=opencv:0",
        "+hardware.camera_crops.wrist=[0.1,0.9,0.2,0.8]",
    ]
    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        cfg = compose(config_name="deploy", overrides=overrides)
    hardware = OmegaConf.to_object(cfg).hardware
    hardware.validate()
    assert hardware.camera_source("wrist") == ("opencv", 0)
    assert hardware.camera_crop("wrist") == (0.1, 0.9, 0.2, 0.8)


def test_the_assembler_crops_frames_of_either_source():
    pytest.importorskip("cyclonedds", reason='ROS images need the ros extra: pip install "robotrl[ros]"')
    from robotrl.hardware.robot_kinematics import ASSETS, Kinematics
    from robotrl.hardware.robot_observation import JointReading, ObservationAssembler
    from robotrl.hardware.ros2.tensors import image_msg

    from robotrl.core.robot_spec import load_robot_spec

    spec = load_robot_spec("panda")
    cfg = RobotEnvConfig(
        cameras=["wrist", "front"],
        camera_sources={"wrist": "opencv:0"},
        camera_crops={"wrist": [0.0, 0.5, 0.5, 1.0], "front": [0.5, 1.0, 0.0, 0.5]},
        image_size=8,
    )
    cfg.validate()
    assembler = ObservationAssembler(cfg, spec, Kinematics(ASSETS / "panda.xml", spec), Counter(), {}, {}, {}, {})
    capture = SyntheticCapture([], then=bgr(quadrants()))
    camera = OpenCVCamera("wrist", 0, capture_factory=lambda source: capture)
    try:
        assert wait_until(lambda: camera.latest() is not None, timeout=5.0)
        ros_frame = Received(image_msg(quadrants().flip(0).contiguous(), "bgr8"), time.monotonic(), None)
        state = JointReading(spec.home.double(), None, None, time.monotonic())
        obs, info = assembler.assemble(
            state, None, time.monotonic(), {}, {"wrist": camera.latest(), "front": ros_frame}
        )
        assert info["stale_observation"] == 0
        assert (torch.from_numpy(obs["pixels_wrist"]) == torch.tensor(GREEN, dtype=torch.uint8)[:, None, None]).all()
        assert (torch.from_numpy(obs["pixels_front"]) == torch.tensor(BLUE, dtype=torch.uint8)[:, None, None]).all()
    finally:
        camera.close()


def test_an_unknown_or_bad_task_crop_is_refused():
    with pytest.raises(ValueError, match=r"task\.camera_crops names cameras \['side'\]"):
        make_env(ArmTaskConfig(name="panda_reach", obs="pixels", camera_crops={"side": [0, 1, 0, 1]}))
    with pytest.raises(ValueError, match=r"task\.camera_crops\.front must have top < bottom"):
        make_env(ArmTaskConfig(name="panda_reach", obs="pixels", camera_crops={"front": [0.6, 0.4, 0, 1]}))


@pytest.mark.parametrize("obs", ["pixels", "state+pixels"])
def test_a_cropped_simulated_camera_is_the_crop_of_a_larger_render(obs):
    crop = [0.2, 0.7, 0.3, 0.9]  # a region of interest: 0.5 high, 0.6 wide -> rendered at ceil(64 / 0.5) = 128
    cfg = ArmTaskConfig(name="panda_reach", obs=obs, cameras=["front"], image_size=64, camera_crops={"front": crop})
    env = make_env(cfg, num_envs=2)
    try:
        pixels = env.reset(seed=0)["pixels_front"]
        assert pixels.shape == (2, 3, 64, 64) and pixels.dtype == torch.uint8
        larger = env.task.backend.render("front", 128, 128).permute(0, 3, 1, 2)
        torch.testing.assert_close(pixels, crop_and_resize(larger, crop, 64), rtol=0, atol=0)
        whole = env.task.backend.render("front", 64, 64).permute(0, 3, 1, 2)
        assert (pixels.float() - whole.float()).abs().mean() > 5  # another picture than the uncropped view
        step = env.step(torch.zeros(2, env.action_dim))
        larger = env.task.backend.render("front", 128, 128).permute(0, 3, 1, 2)
        torch.testing.assert_close(step.next_obs["pixels_front"], crop_and_resize(larger, crop, 64), rtol=0, atol=0)
    finally:
        env.close()


def test_deploy_warns_when_the_robots_crop_is_not_the_policys(caplog):
    from robotrl.hardware.deploy import warn_on_crops

    trained = [0.1, 0.9, 0.0, 1.0]
    spec = deploy_spec_for(ArmTaskConfig(name="panda_reach", obs="pixels", camera_crops={"front": trained}))
    assert spec.task_config["camera_crops"] == {"front": trained}
    with caplog.at_level(logging.WARNING, logger="robotrl.hardware.deploy"):
        warn_on_crops(spec, RobotEnvConfig(cameras=["front"], camera_crops={"front": list(trained)}))
        assert not caplog.records
        warn_on_crops(spec, RobotEnvConfig(cameras=["front"]))
        warn_on_crops(spec, RobotEnvConfig(cameras=["front"], camera_crops={"front": [0.0, 0.9, 0.0, 1.0]}))
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2 and all("camera front" in m and "[0.1, 0.9, 0.0, 1.0]" in m for m in messages)
    assert "none (the whole frame)" in messages[0] and "[0.0, 0.9, 0.0, 1.0]" in messages[1]


@pytest.mark.dds
def test_a_usb_camera_feeds_the_robot_envs_pixel_observation(tmp_path):
    """A real OpenCV source (an image sequence, read by cv2.VideoCapture as a camera is) through the robot env
    over DDS against the twin: the pixels_<name> entry is its frame, RGB, cropped as configured."""
    pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')
    cv2 = pytest.importorskip("cv2")
    from robotrl.hardware.robot_env import RobotEnv
    from robotrl.hardware.sim_twin import SimTwin, SimTwinConfig

    for i in range(3):
        assert cv2.imwrite(str(tmp_path / f"frame_{i:02d}.png"), bgr(quadrants()))
    rate = 250.0
    twin = SimTwin(SimTwinConfig(rate_hz=rate, domain_id=229, report_interval=0))
    thread = threading.Thread(target=twin.run, daemon=True)
    thread.start()
    cfg = RobotEnvConfig(
        domain_id=229,
        control_rate_hz=rate,
        connect_timeout=5.0,
        reset_timeout=10.0,
        cameras=["wrist"],
        camera_sources={"wrist": f"opencv:{tmp_path / 'frame_%02d.png'}"},
        camera_crops={"wrist": [0.0, 0.5, 0.5, 1.0]},
        image_size=16,
        max_image_age=5.0,  # the sequence ends and is opened again: its last frame may wait a while
        shield={"workspace_min": [0.1, -0.6, 0.05], "workspace_max": [0.8, 0.6, 0.9], "hold_after": 5 / rate},
    )
    env = RobotEnv(cfg, control="joint_delta")
    try:
        assert env.observation_space["pixels_wrist"].shape == (3, 16, 16)
        camera = env.link.images["wrist"]
        assert isinstance(camera, OpenCVCamera)
        env.reset()
        assert wait_until(lambda: env._observe()[1]["stale_observation"] == 0, timeout=10.0)
        obs, _ = env._observe()
        assert (torch.from_numpy(obs["pixels_wrist"]) == torch.tensor(GREEN, dtype=torch.uint8)[:, None, None]).all()
    finally:
        env.close()
        twin.stop()
        thread.join(timeout=5)
        twin.close()
    assert camera.closed and not camera.thread.is_alive()
