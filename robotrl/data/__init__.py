"""Replay storage, demo buffers and dataset import/export."""

from robotrl.core.spec import ObsSpec, TensorSpec, check_obs
from robotrl.data.replay import Batch, ReplayBuffer

__all__ = ["Batch", "ObsSpec", "ReplayBuffer", "TensorSpec", "check_obs"]
