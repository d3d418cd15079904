"""How smooth a stream of actions is: how far they jump between steps, and how much of their power lies
at high frequencies.

Actions come as [T, E, A] (time, env, action dim) with a [T, E] bool mask `episode_start` that marks the
first action of each episode; no figure ever spans an episode boundary.

- `mean_squared_difference`: the mean over consecutive steps of one episode of mean_a (a_t - a_{t-1})^2.
- `high_frequency_share`: Welch-style: segments of `segment` steps that lie inside one episode (hop
  segment // 4), each with its mean removed and a Hann window applied, then |rfft|^2 over time. The share
  of the non-DC power at frequencies above `cutoff`, in cycles per control step: the control rate is 1
  and its Nyquist frequency 0.5, so the default 0.25 is half the Nyquist frequency (6.25 Hz at
  panda_reach's 25 Hz control, 5 Hz at HalfCheetah's 20 Hz). White noise scores about 0.5, a smooth
  motion close to 0.

Both return NaN when the stream is too short to say anything (no consecutive pair, no whole segment).
"""

from __future__ import annotations

import math

import torch

DEFAULT_CUTOFF = 0.25  # cycles per control step (half the Nyquist frequency)
DEFAULT_SEGMENT = 32  # control steps per spectral segment


def _check(actions: torch.Tensor, episode_start: torch.Tensor) -> None:
    if not isinstance(actions, torch.Tensor) or actions.dim() != 3:
        shape = list(actions.shape) if isinstance(actions, torch.Tensor) else type(actions).__name__
        raise ValueError(f"actions must be a [T, E, A] tensor, got {shape}")
    if episode_start.dtype != torch.bool or episode_start.shape != actions.shape[:2]:
        raise ValueError(
            f"episode_start must be a bool tensor of shape {list(actions.shape[:2])}, "
            f"got {episode_start.dtype} {list(episode_start.shape)}"
        )


def mean_squared_difference(actions: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
    """Mean squared change of the action between consecutive steps of the same episode (0-dim)."""
    _check(actions, episode_start)
    diff2 = (actions[1:] - actions[:-1]).float().pow(2).mean(-1)  # [T-1, E]
    same_episode = ~episode_start[1:]
    if not same_episode.any():
        return torch.tensor(math.nan)
    return diff2[same_episode].mean()


def high_frequency_share(
    actions: torch.Tensor,
    episode_start: torch.Tensor,
    cutoff: float = DEFAULT_CUTOFF,
    segment: int = DEFAULT_SEGMENT,
) -> torch.Tensor:
    """Share of the action power above `cutoff` cycles per step, in segments inside episodes (0-dim)."""
    _check(actions, episode_start)
    if not 0.0 < cutoff < 0.5:
        raise ValueError(f"cutoff must be in (0, 0.5) cycles per step (0.5 is the Nyquist frequency), got {cutoff}")
    if segment < 4:
        raise ValueError(f"segment must be >= 4 steps, got {segment}")
    if actions.shape[0] < segment:
        return torch.tensor(math.nan)
    hop = segment // 4
    segments = actions.float().unfold(0, segment, hop)  # [S, E, A, L]
    inside_one_episode = ~episode_start.unfold(0, segment, hop)[..., 1:].any(-1)  # [S, E]
    x = segments[inside_one_episode]  # [N, A, L]
    if not x.shape[0]:
        return torch.tensor(math.nan)
    x = (x - x.mean(-1, keepdim=True)) * torch.hann_window(segment, periodic=False, device=x.device)
    power = torch.fft.rfft(x, dim=-1).abs().pow(2)
    freqs = torch.fft.rfftfreq(segment, device=x.device)
    total = power[..., freqs > 0].sum()
    high = power[..., freqs > cutoff].sum()
    return high / total if total > 0 else torch.zeros(())


class ActionSmoothness:
    """Collects the actions sent to the envs, one step at a time, and reports their smoothness on `flush`."""

    def __init__(self, cutoff: float = DEFAULT_CUTOFF, segment: int = DEFAULT_SEGMENT):
        if not 0.0 < cutoff < 0.5:
            raise ValueError(f"cutoff must be in (0, 0.5) cycles per step, got {cutoff}")
        if segment < 4:
            raise ValueError(f"segment must be >= 4 steps, got {segment}")
        self.cutoff, self.segment = cutoff, segment
        self._actions: list[torch.Tensor] = []
        self._starts: list[torch.Tensor] = []

    def add(self, action: torch.Tensor, episode_start: torch.Tensor) -> None:
        """One step: actions [E, A] and the [E] mask of envs for which this is an episode's first action."""
        if action.dim() != 2 or episode_start.shape != action.shape[:1] or episode_start.dtype != torch.bool:
            raise ValueError(
                f"expected action [E, A] and a bool episode_start [E], got {list(action.shape)} and "
                f"{episode_start.dtype} {list(episode_start.shape)}"
            )
        self._actions.append(action.detach())
        self._starts.append(episode_start.detach())

    def flush(self) -> dict[str, float]:
        """`action_sq_diff` and `action_high_freq_share` since the last flush (those that can be computed)."""
        if not self._actions:
            return {}
        actions, starts = torch.stack(self._actions), torch.stack(self._starts)
        self._actions.clear()
        self._starts.clear()
        figures = {
            "action_sq_diff": float(mean_squared_difference(actions, starts)),
            "action_high_freq_share": float(high_frequency_share(actions, starts, self.cutoff, self.segment)),
        }
        return {key: value for key, value in figures.items() if math.isfinite(value)}
