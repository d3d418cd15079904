"""Replay for stacked pixel observations that stores every frame once.

A frame-stacked observation of k frames shares k-1 frames with the previous one, and an observation is
the previous transition's next observation: storing stacks would keep each frame 2k times. Here each env
writes its frames to its own ring in order (an episode's reset frame, then one new frame per step), and a
transition keeps only the absolute index of its newest observation frame and of its episode's first
frame. The next observation's newest frame is always the following one; a stack is rebuilt by reading k
consecutive frames, clamped at the episode's first frame (as `FrameStack` repeats it at reset). A stored
transition costs one frame plus one per episode (its final frame), and a few bytes of indices.

State entries (proprioception next to the pixels) are small and kept per transition as in ReplayBuffer.
Transitions whose frames have been overwritten are never sampled. Rewards, n-step returns, termination
and truncation follow ReplayBuffer exactly; the layout is [time, env] for transitions, [env, slot] for
frames.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from robotrl.core.memory import tensor_bytes
from robotrl.core.spec import ObsSpec, TensorSpec, check_obs, pixel_keys
from robotrl.data.replay import ReplayBuffer

Obs = dict[str, torch.Tensor]


class FrameReplay(ReplayBuffer):
    """ReplayBuffer whose uint8 image entries (stacks of `frame_stack` frames) keep each frame once."""

    def __init__(
        self,
        obs_spec: ObsSpec,
        action_dim: int,
        capacity: int,
        num_envs: int = 1,
        frame_stack: int = 3,
        n_step: int = 1,
        gamma: float = 0.99,
        device: str | torch.device = "cpu",
    ):
        if frame_stack < 1:
            raise ValueError(f"agent.encoder.frame_stack must be >= 1, got {frame_stack}")
        self.pixel_keys = pixel_keys(obs_spec)
        if not self.pixel_keys:
            raise ValueError(f"FrameReplay needs uint8 [C, H, W] image entries; the observation has {sorted(obs_spec)}")
        horizon = math.ceil(capacity / max(num_envs, 1))
        if horizon < frame_stack + n_step + 1:
            raise ValueError(
                f"agent.encoder.frame_stack={frame_stack} with n_step={n_step} does not fit a replay of {horizon} "
                f"steps per env (replay_capacity={capacity}, num_envs={num_envs}); raise replay_capacity"
            )
        self.frame_stack = frame_stack
        self.frame_shape: dict[str, tuple[int, ...]] = {}
        for key in self.pixel_keys:
            channels, height, width = obs_spec[key].shape
            if channels % frame_stack:
                raise ValueError(
                    f"observation {key!r} has {channels} channels: not a stack of "
                    f"agent.encoder.frame_stack={frame_stack} frames"
                )
            self.frame_shape[key] = (channels // frame_stack, height, width)
        state_spec = {k: s for k, s in obs_spec.items() if k not in self.pixel_keys}
        super().__init__(state_spec, action_dim, capacity, num_envs, n_step, gamma, device)
        self.full_obs_spec = dict(obs_spec)
        self.slots = self.horizon  # frame slots per env: one frame per transition, and episode ends share them
        # torch.empty: frame memory is committed only as it is written (a large capacity costs nothing up front)
        self.frames = {
            k: torch.empty(num_envs, self.slots, *shape, dtype=torch.uint8, device=self.device)
            for k, shape in self.frame_shape.items()
        }
        self.frames_written = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self.obs_frame = torch.zeros(self.horizon, num_envs, dtype=torch.long, device=self.device)
        self.first_frame = torch.zeros(self.horizon, num_envs, dtype=torch.long, device=self.device)
        self.episode_first = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self.episode_open = torch.zeros(num_envs, dtype=torch.bool, device=self.device)  # its frames are stored
        self._envs = torch.arange(num_envs, device=self.device)
        self._stack_offsets = torch.arange(frame_stack - 1, -1, -1, device=self.device)  # oldest first: k-1 .. 0

    def committed_bytes(self, stored: int, device: torch.device) -> int:
        """The frames are committed on a CPU only as they are written, one per stored transition; CUDA's caching
        allocator reserves them whole."""
        everything = super().committed_bytes(stored, device)
        if device.type != "cpu":
            return everything
        frames = tensor_bytes(self.frames)
        return everything - frames + int(frames * min(1.0, stored / (self.slots * self.num_envs)))

    def check_step(self, obs: Mapping[str, torch.Tensor], action: torch.Tensor) -> None:
        check_obs(self.full_obs_spec, obs)
        TensorSpec((self.action_dim,)).check("action", action)

    def _write_frames(self, source: Mapping[str, torch.Tensor], env: torch.Tensor, age: int = 0) -> None:
        """Append one frame of `source` (stacked observations of every env) for the envs `env`: the newest,
        or the one `age` frames older."""
        slot = self.frames_written[env] % self.slots
        for key, (channels, _, _) in self.frame_shape.items():
            end = source[key].shape[1] - age * channels
            frame = source[key][:, end - channels : end].to(self.device)
            self.frames[key][env, slot] = frame[env]
        self.frames_written[env] += 1

    def _start_episodes(self, obs: Mapping[str, torch.Tensor], starting: torch.Tensor) -> None:
        """Store the first observation of the episodes `starting` now. A reset's stack repeats one frame
        (FrameStack), so one frame is stored; a stack with history (a segment copied from the middle of an
        episode, e.g. an intervention) stores all its frames, so the rebuilt stacks keep that history."""
        self.episode_first[starting] = self.frames_written[starting]
        repeated = torch.ones(len(starting), dtype=torch.bool, device=self.device)
        for key, (channels, _, _) in self.frame_shape.items():
            stack = obs[key].to(self.device)[starting]
            frames = stack.view(len(starting), self.frame_stack, channels, *stack.shape[2:])
            repeated &= (frames == frames[:, -1:]).flatten(1).all(1)
        with_history = starting[~repeated]
        for age in range(self.frame_stack - 1, 0, -1):  # oldest first
            self._write_frames(obs, with_history, age)
        self._write_frames(obs, starting)

    def add(
        self,
        obs: Mapping[str, torch.Tensor],
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: Mapping[str, torch.Tensor],
        terminated: torch.Tensor,
        truncated: torch.Tensor,
    ) -> None:
        """Store one step of every env. Each env's steps must arrive in order, as the env produced them."""
        starting = (~self.episode_open).nonzero().flatten()
        if len(starting):  # an episode's first observation: its frames have not been stored yet
            self._start_episodes(obs, starting)
        row = self.pos
        self.obs_frame[row] = self.frames_written - 1
        self.first_frame[row] = self.episode_first
        self._write_frames(next_obs, self._envs)
        self.episode_open = ~(terminated | truncated).to(self.device)
        super().add(obs, action, reward, next_obs, terminated, truncated)

    def _valid(self, row: torch.Tensor, env: torch.Tensor) -> torch.Tensor:
        """Whether every frame the transition's stacks read is still in its env's ring."""
        oldest_needed = torch.maximum(self.first_frame[row, env], self.obs_frame[row, env] - (self.frame_stack - 1))
        return oldest_needed >= self.frames_written[env] - self.slots

    def _stacks(self, newest: torch.Tensor, first: torch.Tensor, env: torch.Tensor) -> Obs:
        """[B, k*C, H, W] stacks ending at absolute frames `newest`, clamped at the episodes' `first` frames."""
        frames = torch.maximum(newest.unsqueeze(1) - self._stack_offsets, first.unsqueeze(1))  # [B, k]
        flat = (env.unsqueeze(1) * self.slots + frames % self.slots).flatten()
        out = {}
        for key, shape in self.frame_shape.items():
            store = self.frames[key].view(-1, *shape)
            out[key] = store.index_select(0, flat).view(len(newest), -1, *shape[1:])
        return out

    def _sample_index(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Uniform over the transitions whose frames are all kept (rejection: only the oldest few are not).
        One host sync per draw (the count of valid candidates), however many candidates were invalid."""
        filled = self.rows_filled
        if filled == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        rows, envs, have = [], [], 0
        while have < batch_size:
            row = torch.randint(0, filled, (2 * batch_size,), device=self.device)
            env = torch.randint(0, self.num_envs, (2 * batch_size,), device=self.device)
            keep = self._valid(row, env)
            valid = int(keep.sum())
            # the valid candidates first, in draw order (a stable sort needs no count on the host)
            first_valid = torch.argsort((~keep).to(torch.uint8), stable=True)[:valid]
            rows.append(row[first_valid])
            envs.append(env[first_valid])
            have += valid
        return torch.cat(rows)[:batch_size], torch.cat(envs)[:batch_size]

    def _observations(self, row: torch.Tensor, env: torch.Tensor, last: torch.Tensor) -> tuple[Obs, Obs]:
        obs, next_obs = super()._observations(row, env, last)
        obs.update(self._stacks(self.obs_frame[row, env], self.first_frame[row, env], env))
        next_obs.update(self._stacks(self.obs_frame[last, env] + 1, self.first_frame[last, env], env))
        return obs, next_obs

    def nbytes(self) -> int:
        """Bytes of every tensor this buffer holds (frames at full capacity)."""
        tensors = [*self._storage().values(), *self.frames.values(), self.obs_frame, self.first_frame]
        return sum(t.numel() * t.element_size() for t in tensors)

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = super().state_dict()
        filled = self.rows_filled
        slots = min(int(self.frames_written.max()), self.slots)
        for key in self.frame_shape:
            state[f"frames.{key}"] = self.frames[key][:, :slots]
        state.update(
            obs_frame=self.obs_frame[:filled],
            first_frame=self.first_frame[:filled],
            frames_written=self.frames_written,
            episode_first=self.episode_first,
        )
        return state

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        missing = [
            name for name in ("obs_frame", "first_frame", "frames_written", "episode_first") if name not in state
        ]
        missing += [f"frames.{k}" for k in self.frame_shape if f"frames.{k}" not in state]
        if missing:
            raise KeyError(f"replay state lacks {missing}")
        super().load_state_dict({k: v for k, v in state.items() if not k.startswith("frames.")})
        filled = self.rows_filled
        self.obs_frame[:filled].copy_(state["obs_frame"])
        self.first_frame[:filled].copy_(state["first_frame"])
        self.frames_written.copy_(state["frames_written"])
        self.episode_first.copy_(state["episode_first"])
        for key in self.frame_shape:
            saved = state[f"frames.{key}"]
            self.frames[key][:, : saved.shape[1]].copy_(saved)
        # a resumed run restarts every env from a reset: the next add stores a new episode's first frame
        self.episode_open.zero_()


def replay_buffer_for(
    obs_spec: ObsSpec,
    action_dim: int,
    capacity: int,
    num_envs: int,
    frame_stack: int,
    n_step: int,
    gamma: float,
    device: torch.device | str,
    hindsight=None,
) -> ReplayBuffer:
    """The buffer for `obs_spec`, as the training loop and the learner's streams both build theirs: a
    FrameReplay (each frame stored once) for pixel observations, else a ReplayBuffer; relabelling goals with
    `hindsight` (data/hindsight.py) when given."""
    common = {"n_step": n_step, "gamma": gamma, "device": device}
    if pixel_keys(obs_spec):
        buffer = FrameReplay(obs_spec, action_dim, capacity, num_envs, frame_stack, **common)
    else:
        buffer = ReplayBuffer(obs_spec, action_dim, capacity, num_envs, **common)
    buffer.hindsight = hindsight
    return buffer
