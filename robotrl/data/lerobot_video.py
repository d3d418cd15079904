"""MP4 video files of a LeRobot dataset's camera features: encoding and decoding with PyAV (extra `lerobot-format`).

A LeRobot v3 video file holds the frames of consecutive episodes of one camera at the dataset's fps: frame
k of the file has the presentation time k / fps, and each episode names where its frames start
(`from_timestamp`). Frames are [H, W, C] uint8 RGB arrays here, as LeRobot features describe them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

LEROBOT_EXTRA = "lerobot-format"


def require_av():
    try:
        import av  # an optional extra: only LeRobot datasets with cameras need it
    except ImportError as err:
        raise ImportError(f"LeRobot dataset videos need PyAV: pip install robotrl[{LEROBOT_EXTRA}] ({err})") from err
    return av


@dataclass(frozen=True)
class VideoSettings:
    """How camera frames are encoded; `exact` settings give back every pixel unchanged."""

    codec: str  # the PyAV/FFmpeg encoder
    pix_fmt: str
    options: dict[str, str]
    exact: bool
    even_size: bool  # chroma subsampled: width and height must be even


VIDEO_SETTINGS = {
    # H.264 in RGB at crf 0: lossless, so an export imports back pixel for pixel. Decoded by FFmpeg-based
    # readers (PyAV, torchcodec: what LeRobot uses), not by most browsers or hardware decoders.
    "lossless": VideoSettings("libx264rgb", "rgb24", {"crf": "0", "g": "2", "preset": "fast"}, True, False),
    # LeRobot's own default: AV1 in YUV 4:2:0 at crf 30, a keyframe every 2 frames. Small files, lossy.
    "av1": VideoSettings("libsvtav1", "yuv420p", {"crf": "30", "g": "2", "preset": "10"}, False, True),
    # H.264 in YUV 4:2:0 at crf 18: lossy but near-transparent, and plays everywhere.
    "h264": VideoSettings("libx264", "yuv420p", {"crf": "18", "g": "2", "preset": "fast"}, False, True),
}


@contextmanager
def _scheduling_kept() -> Iterator[None]:
    """Put the calling thread's scheduling back after a call into an encoder. SVT-AV1 (the `av1` settings, LeRobot's
    default codec) moves the thread that feeds it to SCHED_FIFO at priority 99 wherever the OS allows it (as
    root): the exporting thread then preempts every normal thread on its core until it exits (measured with
    SVT-AV1 4.1.0, 2026-11-28). The encoder's own threads keep what it gives them, and end with the file."""
    if not hasattr(os, "sched_getscheduler"):  # not Linux
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        yield
    finally:
        if os.sched_getscheduler(0) != policy or os.sched_getparam(0) != param:
            os.sched_setscheduler(0, policy, param)


class VideoWriter:
    """One video file, frames appended episode after episode; `frames_written` gives the next start."""

    def __init__(self, path: Path, fps: int, height: int, width: int, settings: VideoSettings):
        av = require_av()
        self.path = path
        self.fps = fps
        self.frames_written = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._container = av.open(str(path), "w")
        self._stream = self._container.add_stream(settings.codec, rate=fps, options=dict(settings.options))
        self._stream.width, self._stream.height = width, height
        self._stream.pix_fmt = settings.pix_fmt
        self._stream.time_base = Fraction(1, fps)
        self._frame_type = av.VideoFrame

    def add(self, frames: Iterable[np.ndarray]) -> None:
        with _scheduling_kept():
            self._encode(frames)

    def _encode(self, frames: Iterable[np.ndarray]) -> None:
        for image in frames:
            frame = self._frame_type.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = self.frames_written  # in 1/fps: frame k shows at k / fps
            frame.time_base = Fraction(1, self.fps)
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
            self.frames_written += 1

    def size_bytes(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def close(self) -> None:
        with _scheduling_kept():
            for packet in self._stream.encode():
                self._container.mux(packet)
            self._container.close()


def video_info(path: Path) -> dict:
    """The `info` entry LeRobot keeps for a video feature in meta/info.json, read from the file."""
    av = require_av()
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return {
            "video.height": stream.height,
            "video.width": stream.width,
            "video.codec": stream.codec_context.codec.canonical_name,
            "video.pix_fmt": stream.pix_fmt,
            "video.is_depth_map": False,
            "video.fps": int(stream.base_rate),
            "video.channels": len(av.VideoFormat(stream.pix_fmt).components),
            "has_audio": False,
        }


def decode_video(path: Path, fps: int) -> np.ndarray:
    """Every frame of the file as [N, H, W, 3] uint8, frame k being the one shown at k / fps.

    Raises ValueError naming the file if a frame's time is not on the 1/fps grid or a frame is missing.
    """
    av = require_av()
    frames: dict[int, np.ndarray] = {}
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            for frame in container.decode(stream):
                position = float(frame.pts * stream.time_base) * fps
                index = round(position)
                if abs(position - index) > 1e-3:
                    raise ValueError(f"{path}: a frame at {position / fps:.6f} s is off the 1/{fps} s grid")
                frames[index] = frame.to_ndarray(format="rgb24")
    except av.error.FFmpegError as err:
        raise ValueError(f"{path}: not a readable video: {err}") from None
    if sorted(frames) != list(range(len(frames))):
        missing = sorted(set(range(max(frames, default=-1) + 1)) - set(frames))
        raise ValueError(f"{path}: frames missing at positions {missing[:5]}")
    if not frames:
        return np.zeros((0, 0, 0, 3), np.uint8)
    return np.stack([frames[i] for i in range(len(frames))])
