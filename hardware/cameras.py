"""USB cameras (or a video file, an image sequence, a stream URL) read through OpenCV, for the robot env.

    camera = OpenCVCamera("wrist", 0)            # cv2.VideoCapture(0): the first USB camera
    received = camera.latest()                   # Received(frame, received_at, None) or None before the first
    camera.close()

A thread reads frames continuously and keeps only the newest, stamped with time.monotonic() when it was read, as
the ROS 2 bridge stamps a message (`Received`, hardware/ros2/bridge.py): the robot env ages a USB camera's frame
exactly as a joint state or a camera topic's frame (`max_image_age`). The frame is an HxWx3 RGB uint8 numpy
array (OpenCV reads BGR; a grey frame is repeated into three channels). A failed read is counted (`stats`), and
the thread waits `retry_delay` and tries again; after `reopen_after` failures in a row it releases the capture
and opens the source again (an unplugged camera, plugged back, comes back). Meanwhile the last frame simply
ages, so the observation goes stale and the shield holds: an old frame is never passed as a new one.

`hardware.camera_sources` chooses the source per camera: `ros` (the camera topic) or `opencv:<index | path |
URL>` (`parse_source`). OpenCV is imported only to open a real capture (extra `cameras`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from robotrl.hardware.ros2.bridge import Received

log = logging.getLogger(__name__)

SOURCE_KINDS = ("ros", "opencv")


class Capture(Protocol):
    """What OpenCVCamera reads from: cv2.VideoCapture, or a test's synthetic source."""

    def isOpened(self) -> bool: ...  # OpenCV's name

    def read(self) -> tuple[bool, Any]: ...

    def release(self) -> None: ...


def parse_source(value: object, where: str) -> tuple[str, int | str | None]:
    """A camera source setting as (kind, what to open): `ros` -> ("ros", None); `opencv:<n>` -> ("opencv", n) for
    a device index, `opencv:<path or URL>` -> ("opencv", path). ValueError naming `where` otherwise."""
    if not isinstance(value, str):
        raise ValueError(f"{where} must be 'ros' or 'opencv:<index, path or URL>', got {value!r}")
    if value == "ros":
        return "ros", None
    kind, sep, target = value.partition(":")
    if kind != "opencv" or not sep or not target.strip():
        raise ValueError(
            f"{where} must be 'ros' or 'opencv:<index, path or URL>' (e.g. opencv:0, opencv:/dev/video2), got {value!r}"
        )
    return "opencv", int(target) if target.isdigit() else target


def opencv_capture(source: int | str) -> Capture:
    """cv2.VideoCapture(source)."""
    try:
        import cv2  # lazy: the optional extra cameras
    except ImportError as error:
        raise ImportError(
            "USB cameras (hardware.camera_sources opencv:...) need OpenCV: pip install 'robotrl[cameras]'"
        ) from error
    return cv2.VideoCapture(source)


def to_rgb(frame: object) -> np.ndarray:
    """An OpenCV frame (HxWx3 BGR, HxWx4 BGRA or HxW grey, uint8) as a contiguous HxWx3 RGB uint8 array;
    ValueError for anything else."""
    if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8:
        what = f"{frame.dtype} array" if isinstance(frame, np.ndarray) else type(frame).__name__
        raise ValueError(f"an 8-bit frame, got {what}")
    if frame.ndim == 2:
        return np.ascontiguousarray(np.repeat(frame[:, :, None], 3, axis=2))
    if frame.ndim == 3 and frame.shape[2] in (3, 4):
        return np.ascontiguousarray(frame[:, :, 2::-1])
    if frame.ndim == 3 and frame.shape[2] == 1:
        return np.ascontiguousarray(np.repeat(frame, 3, axis=2))
    raise ValueError(f"a HxW, HxWx3 or HxWx4 frame, got shape {frame.shape}")


class OpenCVCamera:
    """See the module docstring. `capture_factory(source)` opens the capture (default `cv2.VideoCapture`); a
    source that does not open raises ValueError naming the camera and the source. `stats`: `frames`,
    `failed_reads`, `bad_frames` (not an 8-bit picture), `reopens`."""

    def __init__(
        self,
        name: str,
        source: int | str,
        capture_factory: Callable[[int | str], Capture] | None = None,
        retry_delay: float = 0.05,
        reopen_after: int = 20,
    ):
        if not (isinstance(retry_delay, (int, float)) and retry_delay > 0):
            raise ValueError(f"camera {name!r}: retry_delay must be > 0 seconds, got {retry_delay!r}")
        if isinstance(reopen_after, bool) or not isinstance(reopen_after, int) or reopen_after < 1:
            raise ValueError(f"camera {name!r}: reopen_after must be an integer >= 1, got {reopen_after!r}")
        self.name, self.source = name, source
        self.retry_delay, self.reopen_after = float(retry_delay), reopen_after
        self._open = capture_factory or opencv_capture
        self.stats: Counter[str] = Counter()
        self._latest: Received[np.ndarray] | None = None
        self._stop = threading.Event()
        self._closed = False
        self._capture: Capture | None = self._open_capture()
        if self._capture is None:
            raise ValueError(f"camera {name!r}: OpenCV could not open source {source!r} (hardware.camera_sources)")
        self.thread = threading.Thread(target=self._read_loop, name=f"robotrl-camera-{name}", daemon=True)
        self.thread.start()

    def latest(self) -> Received[np.ndarray] | None:
        """The newest frame read (HxWx3 RGB uint8) with time.monotonic() when it was read, or None before the first."""
        return self._latest

    def _open_capture(self) -> Capture | None:
        capture = self._open(self.source)
        if capture.isOpened():
            return capture
        capture.release()
        return None

    def _read_loop(self) -> None:
        failures = 0
        try:
            while not self._stop.is_set():
                frame = self._read()
                if frame is not None:
                    self._latest = Received(frame, time.monotonic(), None)
                    self.stats["frames"] += 1
                    if failures >= self.reopen_after:
                        log.info("camera %s: frames again from %r", self.name, self.source)
                    failures = 0
                    continue
                failures += 1
                if failures == self.reopen_after:
                    log.warning(
                        "camera %s: %d failed reads from %r; its frames age until it is back (reopening)",
                        self.name,
                        failures,
                        self.source,
                    )
                if failures % self.reopen_after == 0:
                    self._reopen()
                self._stop.wait(self.retry_delay)
        finally:
            if self._capture is not None:
                self._capture.release()
                self._capture = None

    def _read(self) -> np.ndarray | None:
        """The next frame as RGB, or None (counted) when there is none to be had."""
        if self._capture is None:
            self.stats["failed_reads"] += 1
            return None
        try:
            ok, frame = self._capture.read()
        except Exception as error:  # a driver error is a failed read: the frames age, the shield holds
            log.debug("camera %s: read raised %r", self.name, error)
            ok, frame = False, None
        if not ok or frame is None:
            self.stats["failed_reads"] += 1
            return None
        try:
            return to_rgb(frame)
        except ValueError as error:
            if not self.stats["bad_frames"]:
                log.warning("camera %s: frame refused: needs %s", self.name, error)
            self.stats["bad_frames"] += 1
            return None

    def _reopen(self) -> None:
        if self._capture is not None:
            self._capture.release()
            self._capture = None
        try:
            self._capture = self._open_capture()
        except Exception as error:  # a source gone for now (unplugged): try again after the next failures
            log.debug("camera %s: reopening %r raised %r", self.name, self.source, error)
        self.stats["reopens"] += 1

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: float = 2.0) -> None:
        """Stop the reading thread, join it and release the capture; again: nothing."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self.thread.join(timeout)
        if self.thread.is_alive():  # a read blocked in the driver: the thread releases the capture when it returns
            log.warning("camera %s: a read is still blocked after %.1f s; released when it returns", self.name, timeout)
