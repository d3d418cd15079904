"""A deployment's rosbag2 bag (MCAP storage, ROS 2 CDR): `BagRecorder` writes topics as they are heard or sent
(joint states, commands, e-stop, tracked poses), `PolicyStepRecorder` what the policy saw and did at each step on
the topics hardware/bag_dataset.py names, which `robotrl-bag-to-dataset` turns into an episode dataset.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from robotrl.hardware.bag_dataset import ACTION_TOPIC, EPISODE_TOPIC, PNG_FORMAT, SPEC_TOPIC, observation_topic
from robotrl.hardware.estop import subscribe_estop

from robotrl.core.deploy_spec import DeploySpec

log = logging.getLogger(__name__)

__all__ = ["BagRecorder", "PolicyStepRecorder"]


class BagRecorder:
    """Writes every message of some bridge topics to a rosbag2 bag with MCAP storage, as ROS 2 CDR (the bytes
    our messages put on the wire). Messages are written from the bridge's receive thread, under a lock.
    `estop_topic` is heard as the robot env hears it (`subscribe_estop`: latched and default-QoS publishers)."""

    def __init__(self, bridge, path: str | Path, topics: dict[str, tuple[type, str]], estop_topic: str | None = None):
        # lazy: the optional extra ros (Cyclone DDS messages, rosbags' writer)
        from robotrl.hardware.ros2.msgs import Bool, ros_type_name
        from rosbags.rosbag2 import StoragePlugin, Writer
        from rosbags.typesys import Stores, get_typestore

        self.path = Path(path)
        self._writer = Writer(self.path, version=9, storage_plugin=StoragePlugin.MCAP)
        self._writer.open()
        typestore = get_typestore(Stores.ROS2_HUMBLE)
        self._lock = threading.Lock()
        self._closed = False
        self.counts: dict[str, int] = {}
        self._subscriptions = []
        for topic, (msg_type, qos) in topics.items():
            connection = self._writer.add_connection(topic, ros_type_name(msg_type), typestore=typestore)
            self.counts[topic] = 0
            self._subscriptions.append(bridge.subscription(topic, msg_type, qos, self._writer_for(topic, connection)))
        if estop_topic:
            connection = self._writer.add_connection(estop_topic, ros_type_name(Bool), typestore=typestore)
            self.counts[estop_topic] = 0
            write = self._writer_for(estop_topic, connection)
            self._subscriptions += subscribe_estop(bridge, estop_topic, lambda received: write(received.msg))

    def sent_writer(self, topic: str, msg_type: type):
        """A writer of messages this process sends on `topic`, each logged at the send time it is given (ns, wall
        clock) rather than when a subscription would have received it."""
        # lazy: the optional extra ros (Cyclone DDS messages, rosbags' writer)
        from robotrl.hardware.ros2.msgs import ros_type_name
        from rosbags.typesys import Stores, get_typestore

        with self._lock:
            connection = self._writer.add_connection(
                topic, ros_type_name(msg_type), typestore=get_typestore(Stores.ROS2_HUMBLE)
            )
            self.counts[topic] = 0

        def write(msg, sent_ns: int) -> None:
            data = msg.serialize()
            with self._lock:
                if self._closed:
                    return
                self._writer.write(connection, sent_ns, data)
                self.counts[topic] += 1

        return write

    def _writer_for(self, topic: str, connection):
        def write(msg) -> None:
            data = msg.serialize()
            with self._lock:
                if self._closed:
                    return
                self._writer.write(connection, time.time_ns(), data)
                self.counts[topic] += 1

        return write

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._writer.close()


class PolicyStepRecorder:
    """What the policy saw and did, step by step, into `recorder`'s bag on the topics hardware/bag_dataset.py names:
    the deploy spec once, each episode's start and end, every observation entry (a camera entry's newest frame,
    rgb8, and with `compressed` also PNG), every action the robot env was given, and the steps whose observation was
    stale or whose action came late. Each observation's messages are logged at its stamp (wall clock, ns, strictly
    increasing), taken when the robot env handed it over; an action at the stamp of the observation it came from.

    The policy loop only queues copies of the arrays (0.1 ms a step at 64 px); a thread of its own builds, encodes and
    writes the messages, so encoding never stalls the loop. Should that thread fall `queue_size` steps behind, a step
    is dropped and counted (`dropped`) rather than the loop kept waiting: its episode then lacks a message, and
    robotrl-bag-to-dataset drops it by name. `timing()` gives the loop's and the thread's time per step."""

    def __init__(
        self,
        recorder: BagRecorder,
        spec: DeploySpec,
        checkpoint: str = "",
        compressed: bool = False,
        queue_size: int = 256,
    ):
        # lazy: the optional extra ros (Cyclone DDS messages)
        from robotrl.hardware.ros2.msgs import CompressedImage, Float64MultiArray, Image, String

        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        # OpenCV missing: refused here, before anything moves
        self._png, self._interleave = _png_encoder() if compressed else (None, _interleave)
        self.checkpoint = checkpoint
        self._cameras = {key: entry.of for key, entry in spec.entries("camera").items()}
        self._shapes = {key: entry.shape for key, entry in spec.observations.items() if key not in self._cameras}
        writer = recorder.sent_writer
        self._spec_writer, self._event_writer = writer(SPEC_TOPIC, String), writer(EPISODE_TOPIC, String)
        self._action_writer = writer(ACTION_TOPIC, Float64MultiArray)
        self._obs_writers = {key: writer(observation_topic(key), Float64MultiArray) for key in self._shapes}
        self._image_writers = {key: writer(observation_topic(key), Image) for key in self._cameras}
        if compressed:
            self._png_writers = {
                key: writer(observation_topic(key) + "/compressed", CompressedImage) for key in self._cameras
            }
        self._layouts = {key: _layout(key, shape) for key, shape in self._shapes.items()}
        self._action_layout = _layout("action", (spec.action_dim,))
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.dropped = self.failed = 0
        # loop: wall time in the policy loop (waits for the GIL held by other threads included), its CPU time;
        # writer: wall time per recorded observation; each [total, max, count]
        self._loop_s, self._loop_cpu_s, self._write_s = [0.0, 0.0, 0], [0.0, 0.0, 0], [0.0, 0.0, 0]
        self._last_stamp = 0
        self._episode = self._steps = 0
        self._obs_stamp = 0
        self._thread = threading.Thread(target=self._run, name="policy-step-recorder", daemon=True)
        self._thread.start()
        self._put([("spec", self._stamp(), json.dumps(spec.to_json()))])

    # -- the policy loop's side: copies queued --------------------------------------------------------------
    def start(self, episode: int, obs: dict[str, np.ndarray]) -> None:
        """Episode `episode` starts with `obs`, the reset's observation."""
        began = time.perf_counter(), time.thread_time()
        stamp = self._stamp()
        self._episode, self._steps, self._obs_stamp = episode, 0, stamp
        event = {"event": "start", "episode": episode, "checkpoint": self.checkpoint}
        self._put([("event", stamp, event), ("obs", stamp, self._copies(obs))], began)

    def step(self, action: np.ndarray, obs: dict[str, np.ndarray], info: dict[str, Any]) -> None:
        """The robot env was given `action` and returned `obs` with `info`."""
        began = time.perf_counter(), time.thread_time()
        stamp = self._stamp()
        items = [("action", self._obs_stamp, np.array(action, np.float64)), ("obs", stamp, self._copies(obs))]
        if info.get("stale_observation") or info.get("late_action"):
            reason = info.get("late_reason") or info.get("stale_reason") or ""
            items.append(
                ("event", stamp, {"event": "stale", "episode": self._episode, "step": self._steps, "reason": reason})
            )
        self._steps += 1
        self._obs_stamp = stamp
        self._put(items, began)

    def end(self, terminated: bool, truncated: bool) -> None:
        """The robot env ended the episode (a session stopped mid-episode records no end)."""
        event = {
            "event": "end",
            "episode": self._episode,
            "steps": self._steps,
            "terminated": bool(terminated),
            "truncated": bool(truncated),
        }
        self._put([("event", self._obs_stamp, event)])

    def _stamp(self) -> int:
        self._last_stamp = max(self._last_stamp + 1, time.time_ns())
        return self._last_stamp

    def _copies(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # a camera entry holds frame_stack frames, oldest first: its newest is its last three channels
        return {key: np.array(value[-3:] if key in self._cameras else value) for key, value in obs.items()}

    def _put(self, items: list, began: tuple[float, float] | None = None) -> None:
        try:
            self._queue.put_nowait(items)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("record: the bag writer fell behind; dropping recorded steps (their episodes are lost)")
        if began is not None:
            _accumulate(self._loop_s, time.perf_counter() - began[0])
            _accumulate(self._loop_cpu_s, time.thread_time() - began[1])

    # -- the writer thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        while (items := self._queue.get()) is not None:
            began = time.perf_counter()
            for kind, stamp, payload in items:
                try:
                    self._write(kind, stamp, payload)
                except Exception:
                    self.failed += 1
                    if self.failed == 1:
                        log.exception("record: a %s message could not be written", kind)
            if any(kind == "obs" for kind, _, _ in items):
                _accumulate(self._write_s, time.perf_counter() - began)

    def _write(self, kind: str, stamp: int, payload: Any) -> None:
        # lazy: the optional extra ros (Cyclone DDS messages)
        from robotrl.hardware.ros2.msgs import CompressedImage, Float64MultiArray, Header, Image, String, Time

        if kind == "spec":
            self._spec_writer(String(data=payload), stamp)
        elif kind == "event":
            self._event_writer(String(data=json.dumps(payload)), stamp)
        elif kind == "action":
            self._action_writer(Float64MultiArray(layout=self._action_layout, data=payload.tolist()), stamp)
        else:
            for key, value in payload.items():
                if key not in self._cameras:
                    data = value.astype(np.float64).reshape(-1).tolist()
                    self._obs_writers[key](Float64MultiArray(layout=self._layouts[key], data=data), stamp)
                    continue
                header = Header(stamp=Time(sec=stamp // 10**9, nanosec=stamp % 10**9), frame_id=self._cameras[key])
                _, height, width = value.shape
                rgb = self._interleave(value)  # [3, H, W] -> rows of RGB pixels
                image = Image(header=header, height=height, width=width, encoding="rgb8", step=3 * width, data=rgb.data)
                self._image_writers[key](image, stamp)
                if self._png is not None:
                    png = CompressedImage(header=header, format=PNG_FORMAT, data=self._png(value))
                    self._png_writers[key](png, stamp)

    def timing(self) -> dict[str, Any]:
        """Time per recorded step, ms: what the policy loop spent queueing (wall time, which includes waiting for
        the GIL while other threads of the process hold it, and its own CPU time), what the writer thread spent
        building, encoding and writing an observation's messages."""
        figures = (("loop_ms", self._loop_s), ("loop_cpu_ms", self._loop_cpu_s), ("writer_ms", self._write_s))
        return {
            name: {
                "mean": _ms(total / count) if count else None,
                "max": _ms(peak),
                "steps": count,
            }
            for name, (total, peak, count) in figures
        }

    def close(self, timeout: float = 60.0) -> None:
        """Write what is queued, then stop the thread (the bag itself is the recorder's to close)."""
        if not self._thread.is_alive():
            return
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("record: the bag writer did not finish within %g s; the last steps are not in the bag", timeout)


def _layout(label: str, shape: tuple[int, ...]):
    """A std_msgs/MultiArrayLayout for a row-major array of `shape`, its first dimension labelled `label`."""
    # lazy: the optional extra ros (Cyclone DDS messages)
    from robotrl.hardware.ros2.msgs import MultiArrayDimension, MultiArrayLayout

    strides = [math.prod(shape[i:]) for i in range(len(shape))]
    labels = [label] + [f"{label}.{axis}" for axis in range(1, len(shape))]
    return MultiArrayLayout(
        dim=[MultiArrayDimension(label=n, size=s, stride=t) for n, s, t in zip(labels, shape, strides, strict=True)]
    )


def _interleave(frame: np.ndarray) -> np.ndarray:
    """[3, H, W] planes -> [H, W, 3] contiguous pixels."""
    return np.ascontiguousarray(frame.transpose(1, 2, 0))


def _png_encoder():
    """A PNG encoder of [3, H, W] RGB frames (OpenCV's default settings: fast, lossless), and an interleaver
    through OpenCV (a 640x640 frame: 0.1 ms, numpy's transpose 2-4 ms)."""
    try:
        import cv2  # lazy: the optional extra cameras
    except ImportError as error:
        raise ImportError(
            "record_compressed=true encodes frames as PNG with OpenCV: pip install 'robotrl[cameras]'"
        ) from error

    def encode(frame: np.ndarray) -> bytes:
        ok, png = cv2.imencode(".png", cv2.merge([frame[2], frame[1], frame[0]]))  # OpenCV writes BGR order
        if not ok:
            raise ValueError(f"OpenCV could not encode a {list(frame.shape)} frame as PNG")
        return png.tobytes()

    def interleave(frame: np.ndarray) -> np.ndarray:
        return cv2.merge([frame[0], frame[1], frame[2]])

    return encode, interleave


def _accumulate(figures: list, seconds: float) -> None:
    figures[0] += seconds
    figures[1] = max(figures[1], seconds)
    figures[2] += 1


def _ms(seconds: float) -> float:
    return round(1e3 * float(seconds), 3)
