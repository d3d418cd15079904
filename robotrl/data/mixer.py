"""Online and offline replay sampled together (RLPD, HIL-SERL).

The offline buffer holds demonstrations and the operator's corrections; the online buffer holds every
transition the actor produced, corrections included (HIL-SERL stores intervened steps in both). Each
batch takes `offline_ratio` of its rows from the offline buffer (0.5 by default, as RLPD), optionally on
a linear schedule over env steps, and marks them in `Batch.demo` so an agent can add a behaviour-cloning
term on them.

The offline buffer is a ReplayBuffer (or FrameReplay for pixels) with one env column: demonstrations
and intervention segments are written there as contiguous runs, each closed by a truncation flag, so
n-step sums and action sequences never run from one run into the next while still bootstrapping from
the run's last observation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import torch

from robotrl.data.replay import Batch, ReplayBuffer

Obs = dict[str, torch.Tensor]


def concat_batches(first: Batch, second: Batch) -> Batch:
    """The rows of `first` then `second` (same Batch class), with `demo` marking `second`'s rows."""
    if type(first) is not type(second):
        raise TypeError(f"cannot concatenate a {type(first).__name__} with a {type(second).__name__}")
    out = {}
    for f in dataclasses.fields(first):
        a, b = getattr(first, f.name), getattr(second, f.name)
        if f.name == "demo":
            continue
        if isinstance(a, Mapping):
            out[f.name] = {k: torch.cat([a[k], b[k]]) for k in a}
        else:
            out[f.name] = torch.cat([a, b])
    rows_first, rows_second = first.action.shape[0], second.action.shape[0]
    device = first.action.device
    demo = torch.zeros(rows_first + rows_second, dtype=torch.bool, device=device)
    demo[rows_first:] = True
    out["demo"] = demo
    return type(first)(**out)


@dataclasses.dataclass
class RatioSchedule:
    """The offline share of each batch: `start`, moving linearly to `end` over `steps` env steps."""

    start: float = 0.5
    end: float | None = None  # None: constant
    steps: int = 0

    def __post_init__(self) -> None:
        for name, value in (("offline_ratio", self.start), ("offline_ratio_final", self.end)):
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"hil.{name} must be within [0, 1], got {value}")
        if self.steps < 0:
            raise ValueError(f"hil.offline_ratio_steps must be >= 0, got {self.steps}")

    def at(self, env_step: int) -> float:
        if self.end is None or self.steps == 0:
            return self.start if self.end is None else self.end
        progress = min(env_step / self.steps, 1.0)
        return self.start + progress * (self.end - self.start)


class InterventionSegments:
    """Collects each env's consecutive intervened steps and writes them to the offline buffer as one
    contiguous run when the intervention (or the episode) ends, or when it reaches `max_run_steps` (then a
    new run starts: a stream that never ends its takeover, a stuck device or a hostile actor, cannot hold
    ever more steps in memory)."""

    def __init__(self, num_envs: int, max_run_steps: int = 1000):
        if max_run_steps < 1:
            raise ValueError(f"max_run_steps must be >= 1, got {max_run_steps}")
        self.open: list[list[tuple[Obs, torch.Tensor, float, Obs, bool, bool]]] = [[] for _ in range(num_envs)]
        self.max_run_steps = max_run_steps

    def add(
        self,
        offline: ReplayBuffer,
        obs: Mapping[str, torch.Tensor],
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: Mapping[str, torch.Tensor],
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        intervened: torch.Tensor,
    ) -> int:
        """Account one batched step; returns how many transitions were written to `offline`."""
        written = 0
        done = terminated | truncated
        for env in range(len(self.open)):
            if intervened[env]:
                self.open[env].append(  # copies: a view would keep the whole received batch alive
                    (
                        {k: v[env].clone() for k, v in obs.items()},
                        action[env].clone(),
                        float(reward[env]),
                        {k: v[env].clone() for k, v in next_obs.items()},
                        bool(terminated[env]),
                        bool(truncated[env]),
                    )
                )
            full = len(self.open[env]) >= self.max_run_steps
            if self.open[env] and (not intervened[env] or done[env] or full):
                written += self._flush(offline, env)
        return written

    def _flush(self, offline: ReplayBuffer, env: int) -> int:
        segment, self.open[env] = self.open[env], []
        for i, (obs, action, reward, next_obs, terminated, truncated) in enumerate(segment):
            last = i == len(segment) - 1
            add_row(offline, obs, action, reward, next_obs, terminated, truncated or (last and not terminated))
        return len(segment)

    @property
    def open_steps(self) -> int:
        """Intervened steps held in runs not yet written to the offline buffer."""
        return sum(len(run) for run in self.open)

    def end_open_runs(self, offline: ReplayBuffer) -> int:
        """Write every env's open run to `offline` now, its last step truncated: what comes next does not
        continue it (the stream was cut). Returns how many transitions were written."""
        return sum(self._flush(offline, env) for env in range(len(self.open)) if self.open[env])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The open runs as tensors (env after env, `count` steps each), so a checkpoint taken mid-run
        resumes it: `count` [E], and when any step is open `obs.<key>`, `next_obs.<key>`, `action`, `reward`,
        `terminated`, `truncated` with a leading [sum(count)] dimension."""
        steps = [step for run in self.open for step in run]
        state = {"count": torch.tensor([len(run) for run in self.open], dtype=torch.long)}
        if steps:
            obs, action, reward, next_obs, terminated, truncated = zip(*steps, strict=True)
            state.update({f"obs.{k}": torch.stack([o[k] for o in obs]) for k in obs[0]})
            state.update({f"next_obs.{k}": torch.stack([o[k] for o in next_obs]) for k in next_obs[0]})
            state["action"] = torch.stack(action)
            state["reward"] = torch.tensor(reward, dtype=torch.float32)
            state["terminated"] = torch.tensor(terminated, dtype=torch.bool)
            state["truncated"] = torch.tensor(truncated, dtype=torch.bool)
        return state

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        count = state["count"].tolist()
        if len(count) != len(self.open):
            raise ValueError(
                f"open intervention runs were saved for {len(count)} envs, this stream has {len(self.open)}"
            )
        obs_keys = [k.removeprefix("obs.") for k in state if k.startswith("obs.")]
        self.open = [[] for _ in count]
        i = 0
        for env, steps in enumerate(count):
            for _ in range(steps):
                self.open[env].append(
                    (
                        {k: state[f"obs.{k}"][i] for k in obs_keys},
                        state["action"][i],
                        float(state["reward"][i]),
                        {k: state[f"next_obs.{k}"][i] for k in obs_keys},
                        bool(state["terminated"][i]),
                        bool(state["truncated"][i]),
                    )
                )
                i += 1


def add_row(
    buffer: ReplayBuffer,
    obs: Mapping[str, torch.Tensor],
    action: torch.Tensor,
    reward: float,
    next_obs: Mapping[str, torch.Tensor],
    terminated: bool,
    truncated: bool,
) -> None:
    """One unbatched transition into a one-env buffer."""
    buffer.add(
        {k: v.unsqueeze(0) for k, v in obs.items()},
        action.unsqueeze(0),
        torch.tensor([reward], dtype=torch.float32),
        {k: v.unsqueeze(0) for k, v in next_obs.items()},
        torch.tensor([terminated]),
        torch.tensor([truncated]),
    )


def stack_frames(frames: torch.Tensor, k: int) -> torch.Tensor:
    """[T, k*C, H, W] stacks of the last k frames of [T, C, H, W], repeating frame 0 before it (as
    FrameStack does at a reset)."""
    index = (torch.arange(len(frames)).unsqueeze(1) + torch.arange(-k + 1, 1)).clamp(min=0)  # [T, k]
    return frames[index].flatten(1, 2)


def add_episode(
    offline: ReplayBuffer,
    episode,
    pixel_keys: Sequence[str] = (),
    frame_stack: int = 1,
    relabel: Callable[[Obs], tuple[torch.Tensor, torch.Tensor]] | None = None,
    end_at_success: bool = False,
) -> int:
    """Write a recorded episode (robotrl.data.dataset.Episode) into a one-env buffer as one contiguous run;
    returns the steps written.

    Image entries are recorded one frame per step; they are stacked here as the training env stacks them.
    `relabel` (e.g. robotrl.hil.classifier_reward.demo_relabeller) gives its own rewards and success verdicts
    ([T] each) for the episode's next observations [T, ...], stacked as the env stacks them, in place of the
    recorded ones. With `end_at_success` (the run's `task.terminate_on_success`) the episode ends at its first
    success, as a terminal step, as online episodes do: a success is then never followed by steps the online
    episodes cannot have, and what the demonstrator did after it (a push carried on past the goal) is not
    cloned.
    """
    if offline.num_envs != 1:
        raise ValueError(f"the offline buffer must have one env column, it has {offline.num_envs}")
    stored = getattr(offline, "full_obs_spec", offline.obs_spec)  # a FrameReplay keeps images apart
    obs = {k: episode.obs[k] for k in stored}
    for key in pixel_keys:
        if frame_stack > 1:
            obs[key] = stack_frames(obs[key], frame_stack)
    if relabel is None:
        reward, success = episode.reward, episode.success
    else:
        reward, success = relabel({k: v[1:] for k, v in obs.items()})
    steps = len(episode)
    if end_at_success and bool(success.any()):
        steps = int(success.nonzero()[0, 0]) + 1
    for t in range(steps):
        last = t == steps - 1
        terminated = bool(episode.terminated[t]) or (end_at_success and last and bool(success[t]))
        truncated = bool(episode.truncated[t]) or (last and not terminated)  # a run never continues past its end
        add_row(
            offline,
            {k: v[t] for k, v in obs.items()},
            episode.action[t],
            float(reward[t]),
            {k: v[t + 1] for k, v in obs.items()},
            terminated,
            truncated,
        )
    return steps


def offline_rows(ratio: float, batch_size: int) -> int:
    """How many of `batch_size` rows come from the offline buffer: `ratio * batch_size`, its fraction rounded
    up with that probability, so the share is exact on average for any batch size (plain rounding gives a
    batch of one no offline row at ratio 0.5, and 3 a share of 2/3)."""
    expected = ratio * batch_size
    whole = int(expected)
    fraction = expected - whole
    return whole + int(fraction > 0 and float(torch.rand(())) < fraction)


def sample_offline(offline: ReplayBuffer, batch_size: int) -> Batch:
    """`batch_size` rows of `offline` alone, every one marked in `Batch.demo` (an agent's BC term fits them)."""
    batch = offline.sample(batch_size)
    return dataclasses.replace(batch, demo=torch.ones(batch_size, dtype=torch.bool, device=batch.action.device))


def sample_mixed(
    sample_online: Callable[[int], Batch], online_size: int, offline: ReplayBuffer, ratio: float, batch_size: int
) -> Batch:
    """`batch_size` rows, `offline_rows(ratio, batch_size)` of them from `offline` (none while it is empty; all
    of them while nothing is held online, `online_size` == 0) and the rest from `sample_online`; the offline
    rows are marked in `Batch.demo`. MixedReplay's rule, also for storage that keeps its online rows elsewhere."""
    offline_rows_wanted = offline_rows(ratio, batch_size) if len(offline) else 0
    if offline_rows_wanted == 0:
        return sample_online(batch_size)
    if offline_rows_wanted == batch_size or online_size == 0:
        return sample_offline(offline, batch_size)
    return concat_batches(sample_online(batch_size - offline_rows_wanted), offline.sample(offline_rows_wanted))


class MixedReplay:
    """An online buffer and an offline (demonstrations + interventions) buffer behind one replay API.

    `add` stores every transition online and copies intervened ones offline; `sample` draws
    `offline_rows(ratio, batch_size)` rows offline (none while it is empty) and the rest online.
    """

    def __init__(self, online: ReplayBuffer, offline: ReplayBuffer, schedule: RatioSchedule | None = None):
        if offline.num_envs != 1:
            raise ValueError(f"the offline buffer must have one env column, it has {offline.num_envs}")
        self.online, self.offline = online, offline
        self.schedule = schedule or RatioSchedule()
        self.segments = InterventionSegments(online.num_envs)
        self.env_step = 0
        self.interventions_stored = 0
        self.device = online.device

    def __len__(self) -> int:
        return len(self.online)

    @property
    def offline_ratio(self) -> float:
        return self.schedule.at(self.env_step)

    def check_step(self, obs: Mapping[str, torch.Tensor], action: torch.Tensor) -> None:
        self.online.check_step(obs, action)

    def add(
        self,
        obs: Mapping[str, torch.Tensor],
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: Mapping[str, torch.Tensor],
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        intervened: torch.Tensor | None = None,
    ) -> None:
        self.online.add(obs, action, reward, next_obs, terminated, truncated)
        self.env_step += self.online.num_envs
        if intervened is not None and (intervened.any() or any(self.segments.open)):
            self.interventions_stored += self.segments.add(
                self.offline, obs, action, reward, next_obs, terminated, truncated, intervened
            )

    def sample(self, batch_size: int) -> Batch:
        return sample_mixed(self.online.sample, len(self.online), self.offline, self.offline_ratio, batch_size)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The online buffer's state under its own names (checkpoints of plain runs stay loadable), the
        offline buffer's under `offline.` and the open intervention runs under `segments.`."""
        state = dict(self.online.state_dict())
        state.update({f"offline.{k}": v for k, v in self.offline.state_dict().items()})
        state.update({f"segments.{k}": v for k, v in self.segments.state_dict().items()})
        state["mixer_env_step"] = torch.tensor(self.env_step)
        return state

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        offline = {k.removeprefix("offline."): v for k, v in state.items() if k.startswith("offline.")}
        if not offline:
            raise KeyError("replay state lacks the offline buffer ('offline.*'): saved by a run without hil?")
        own = ("offline.", "segments.", "mixer_")
        self.online.load_state_dict({k: v for k, v in state.items() if not k.startswith(own)})
        self.offline.load_state_dict(offline)
        self.env_step = int(state.get("mixer_env_step", torch.tensor(0)))
        segments = {k.removeprefix("segments."): v for k, v in state.items() if k.startswith("segments.")}
        if segments:
            # a checkpoint taken mid-intervention keeps that correction; the resumed loop resets every env,
            # so the run ends where the checkpoint cut it
            self.segments.load_state_dict(segments)
            self.interventions_stored += self.segments.end_open_runs(self.offline)
