"""Replay storage, demo buffers and dataset import/export."""

from robotrl.data.replay import Batch, ReplayBuffer
from robotrl.data.spec import ObsSpec, TensorSpec, check_obs

__all__ = ["Batch", "ObsSpec", "ReplayBuffer", "TensorSpec", "check_obs"]
