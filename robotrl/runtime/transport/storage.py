"""The learner's storage: one replay buffer per actor stream behind one add/sample/state_dict object.

Replay is laid out [time, env] per stream (replay.py), so each actor (stream id) writes its own buffer,
in the order its envs produced the steps. `sample` draws from the streams in proportion to the
transitions each holds and returns one concatenated batch. A transition batch is a dict of
`obs.<key>` / `next_obs.<key>` [N, E, ...], `action` [N, E, A], `reward`, `terminated`, `truncated` and
`intervened` [N, E] (N steps of E envs). The intervention flags are kept per stored row and handed to the
stream's buffer when its `add` takes them.

Human in the loop (HIL-SERL: the operator sits at the actor, the demonstrations at the learner): given
`make_offline`, the group also keeps ONE offline buffer shared by every stream (one env column, as
robotrl/data/mixer.py's MixedReplay), made at once when demonstrations are loaded into it, else when the
first intervened step arrives. Each stream's intervened steps are copied there as contiguous runs (an
`InterventionSegments` per stream), each closed by a truncation flag; a cut stream (gap, new session) or an
actor that went silent closes its open runs, so a run never spans a break. Open runs are part of the
state, so a checkpoint taken mid-run resumes it. `sample` takes `schedule.at(transitions received)` of each
batch from the offline buffer, marked in `Batch.demo`, and the rest from the streams.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from robotrl.core.spec import ObsSpec, check_obs
from robotrl.data import mixer
from robotrl.data.frame_replay import FrameReplay, replay_buffer_for
from robotrl.data.hindsight import Hindsight
from robotrl.data.mixer import InterventionSegments, RatioSchedule
from robotrl.data.replay import Batch, ReplayBuffer

Tensors = dict[str, torch.Tensor]
STREAM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
FLAGS = ("terminated", "truncated", "intervened")


def replay_factory(
    obs_spec: ObsSpec,
    action_dim: int,
    capacity: int,
    frame_stack: int,
    n_step: int,
    gamma: float,
    device: torch.device,
    hindsight: Hindsight | None = None,
) -> Callable[[int], ReplayBuffer]:
    """A builder of one stream's buffer for its number of envs, as the training loop builds its replay:
    FrameReplay (each frame stored once) for pixel observations, else ReplayBuffer; each relabelling goals
    with `hindsight` when given."""

    def make(num_envs: int) -> ReplayBuffer:
        return replay_buffer_for(
            obs_spec, action_dim, capacity, num_envs, frame_stack, n_step, gamma, device, hindsight
        )

    return make


def end_open_episodes(buffer: ReplayBuffer) -> None:
    """Cut every env's episode after the newest stored step: what comes next in this buffer does not follow it
    (an actor that restarted, or batches it dropped). Like a time limit: the step still bootstraps, but no
    n-step sum or action sequence runs past it. Buffers other than ReplayBuffer provide their own."""
    if hasattr(buffer, "end_open_episodes"):
        buffer.end_open_episodes()
        return
    if buffer.rows_filled:
        newest = (buffer.pos - 1) % buffer.horizon
        buffer.truncated[newest] |= ~buffer.terminated[newest]
    if isinstance(buffer, FrameReplay):
        buffer.episode_open.zero_()  # the next step's observation starts a stored episode (its whole stack)


@dataclass
class Stream:
    buffer: ReplayBuffer
    num_envs: int
    intervened: torch.Tensor  # [horizon, E] bool, row-aligned with the buffer's ring
    rows: int = 0  # steps added (each E transitions), ever
    interventions: int = 0  # intervened transitions added, ever
    takes_intervened: bool = False  # whether buffer.add accepts `intervened`
    runs: InterventionSegments | None = None  # open intervention runs, on their way to the offline buffer
    episodes: int = 0  # episodes that ended (terminated or truncated), ever
    episode_interventions: int = 0  # intervened steps of those episodes
    running: torch.Tensor | None = None  # [E] intervened steps of each env's current episode (CPU)

    def __post_init__(self) -> None:
        if self.running is None:
            self.running = torch.zeros(self.num_envs, dtype=torch.long)

    @property
    def transitions(self) -> int:
        return self.rows * self.num_envs

    def count_episodes(self, intervened: torch.Tensor, done: torch.Tensor) -> None:
        """Account N steps' flags ([N, E] bool, CPU): intervened steps per finished episode."""
        if not done.any():
            self.running += intervened.sum(0)
            return
        for t in range(len(done)):
            self.running += intervened[t]
            if done[t].any():
                self.episodes += int(done[t].sum())
                self.episode_interventions += int(self.running[done[t]].sum())
                self.running[done[t]] = 0


class ReplayGroup:
    """Per-stream replay buffers with proportional sampling; one object for the learner to add to and sample."""

    def __init__(
        self,
        obs_spec: ObsSpec,
        action_dim: int,
        capacity: int,
        make_buffer: Callable[[int], ReplayBuffer],
        device: str | torch.device = "cpu",
        make_offline: Callable[[], ReplayBuffer] | None = None,
        schedule: RatioSchedule | None = None,
        admit: Callable[[ReplayGroup, str, int], None] | None = None,
    ):
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        self.obs_spec = dict(obs_spec)
        self.action_dim = action_dim
        self.capacity = capacity  # per stream
        self.make_buffer = make_buffer
        self.streams: dict[str, Stream] = {}
        self.device = torch.device(device)
        # human in the loop (see the module doc); without make_offline, intervened steps are only flagged
        self.make_offline = make_offline
        self.schedule = schedule or RatioSchedule()
        self.offline: ReplayBuffer | None = None
        self.offline_demos = 0  # demonstration transitions written offline (load_demos), ever
        self.offline_interventions = 0  # intervened transitions copied offline, ever
        # called as admit(self, stream id, num_envs) before a new stream's buffer is made; raises to refuse it
        # (the learner's memory check: each actor's stream is allocated when it first registers)
        self.admit = admit

    def ensure_offline(self) -> ReplayBuffer:
        """The shared offline buffer, made on first use."""
        if self.offline is None:
            if self.make_offline is None:
                raise RuntimeError("this replay group keeps no offline buffer (no make_offline)")
            offline = self.make_offline()
            if offline.num_envs != 1:
                raise ValueError(f"the offline buffer must have one env column, it has {offline.num_envs}")
            self.offline = offline
        return self.offline

    # ---- writing --------------------------------------------------------------------------------------

    def open_stream(self, stream_id: str, num_envs: int) -> Stream:
        """The stream's state, created empty the first time; its number of envs is fixed from then on."""
        if not isinstance(stream_id, str) or not STREAM_ID.fullmatch(stream_id):
            raise ValueError(f"stream id must be 1-64 letters, digits, '_' or '-', got {stream_id!r}")
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be an integer >= 1, got {num_envs!r}")
        stream = self.streams.get(stream_id)
        if stream is None:
            if self.admit is not None:
                self.admit(self, stream_id, num_envs)
            buffer = self.make_buffer(num_envs)
            horizon = math.ceil(self.capacity / num_envs)
            stream = Stream(
                buffer,
                num_envs,
                torch.zeros(horizon, num_envs, dtype=torch.bool, device=self.device),
                takes_intervened="intervened" in inspect.signature(buffer.add).parameters,
            )
            self.streams[stream_id] = stream
        elif stream.num_envs != num_envs:
            raise ValueError(
                f"stream {stream_id!r} holds {stream.num_envs} envs per step, got {num_envs}: use a new stream id"
            )
        return stream

    def add(self, stream_id: str, batch: Mapping[str, torch.Tensor]) -> None:
        """Append N consecutive steps of the stream's E envs (entries [N, E, ...], see the module doc)."""
        steps, num_envs = self._check(batch)
        stream = self.open_stream(stream_id, num_envs)
        obs = {k.removeprefix("obs."): v for k, v in batch.items() if k.startswith("obs.")}
        next_obs = {k.removeprefix("next_obs."): v for k, v in batch.items() if k.startswith("next_obs.")}
        flags = batch["intervened"].cpu()
        intervened = flags.to(self.device)
        done = (batch["terminated"] | batch["truncated"]).cpu()
        horizon = stream.intervened.shape[0]
        copies = self.make_offline is not None and (bool(flags.any()) or self._open_steps(stream) > 0)
        if copies and stream.runs is None:
            stream.runs = InterventionSegments(num_envs)
        for t in range(steps):
            row = {k: v[t] for k, v in obs.items()}, {k: v[t] for k, v in next_obs.items()}
            args = (
                row[0],
                batch["action"][t],
                batch["reward"][t],
                row[1],
                batch["terminated"][t],
                batch["truncated"][t],
            )
            if stream.takes_intervened:
                stream.buffer.add(*args, intervened=intervened[t])
            else:
                stream.buffer.add(*args)
            stream.intervened[(stream.rows + t) % horizon] = intervened[t]
            if copies and (flags[t].any() or stream.runs.open_steps):  # corrections also go offline, as runs
                self.offline_interventions += stream.runs.add(self.ensure_offline(), *args, flags[t])
        stream.count_episodes(flags, done)
        stream.rows += steps
        stream.interventions += int(flags.sum())

    def cut(self, stream_id: str) -> None:
        """The stream's next added step does not continue its newest one (see `end_open_episodes`); its open
        intervention runs end here too."""
        if stream_id in self.streams:
            stream = self.streams[stream_id]
            end_open_episodes(stream.buffer)
            self.end_open_runs(stream_id)
            stream.running.zero_()  # the cut episodes are not counted as finished

    def end_open_runs(self, stream_id: str) -> int:
        """Write the stream's open intervention runs to the offline buffer now, each ending in a truncation
        (its actor went silent, or the stream was cut); returns the transitions written."""
        stream = self.streams.get(stream_id)
        if stream is None or not self._open_steps(stream):
            return 0
        written = stream.runs.end_open_runs(self.ensure_offline())
        self.offline_interventions += written
        return written

    def open_run_steps(self, stream_id: str) -> int:
        """Intervened steps of the stream still in open runs (not yet offline)."""
        stream = self.streams.get(stream_id)
        return 0 if stream is None else self._open_steps(stream)

    @staticmethod
    def _open_steps(stream: Stream) -> int:
        return 0 if stream.runs is None else stream.runs.open_steps

    def load_demos(self, load: Callable[[ReplayBuffer], int]) -> int:
        """Write demonstrations with `load(offline_buffer) -> transitions` (robotrl.hil.setup.load_demos)."""
        written = load(self.ensure_offline())
        self.offline_demos += written
        return written

    def _check(self, batch: Mapping[str, torch.Tensor]) -> tuple[int, int]:
        expected = {f"{p}.{k}" for k in self.obs_spec for p in ("obs", "next_obs")} | {"action", "reward", *FLAGS}
        missing, unexpected = sorted(expected - set(batch)), sorted(set(batch) - expected)
        if missing or unexpected:
            raise ValueError(f"transition batch keys: missing {missing}, unexpected {unexpected}")
        reward = batch["reward"]
        if reward.dim() != 2 or reward.shape[0] < 1:
            raise ValueError(f"'reward' must have shape [steps >= 1, envs], got {list(reward.shape)}")
        lead = tuple(reward.shape)
        for name in ("action", *FLAGS):
            if tuple(batch[name].shape[:2]) != lead:
                raise ValueError(f"{name!r} must lead with [steps, envs] = {list(lead)}, got {list(batch[name].shape)}")
        for name in FLAGS:
            if batch[name].dtype != torch.bool:
                raise ValueError(f"{name!r} must be bool, got {batch[name].dtype}")
        if tuple(batch["action"].shape) != (*lead, self.action_dim):
            raise ValueError(f"'action' must have shape {[*lead, self.action_dim]}, got {list(batch['action'].shape)}")
        for part in ("obs", "next_obs"):
            check_obs(self.obs_spec, {k: batch[f"{part}.{k}"] for k in self.obs_spec}, batch_dims=2)
        return lead

    # ---- reading --------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Transitions held online (every stream); the offline buffer's are `len(group.offline)`."""
        return sum(len(s.buffer) for s in self.streams.values())

    @property
    def transitions(self) -> int:
        """Transitions received, all streams, ever: the clock of the offline share's schedule."""
        return sum(s.transitions for s in self.streams.values())

    @property
    def offline_ratio(self) -> float:
        return self.schedule.at(self.transitions)

    def sample(self, batch_size: int) -> Batch:
        """`batch_size` transitions: with an offline buffer that holds any, `offline_ratio` of them from it
        (marked in `Batch.demo`); the rest from each stream in proportion to the transitions it holds."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if self.offline is not None and len(self.offline):
            return mixer.sample_mixed(self._sample_online, len(self), self.offline, self.offline_ratio, batch_size)
        return self._sample_online(batch_size)

    def _sample_online(self, batch_size: int) -> Batch:
        streams = [s for s in self.streams.values() if len(s.buffer)]
        if not streams:
            raise RuntimeError("cannot sample: no stream holds any transition yet")
        if len(streams) == 1:
            return streams[0].buffer.sample(batch_size)
        sizes = torch.tensor([float(len(s.buffer)) for s in streams])
        counts = torch.bincount(torch.multinomial(sizes, batch_size, replacement=True), minlength=len(streams))
        return concat_batches([s.buffer.sample(int(n)) for s, n in zip(streams, counts.tolist(), strict=True) if n])

    def stats(self) -> dict[str, dict[str, int]]:
        return {
            sid: {
                "transitions": s.transitions,
                "stored": len(s.buffer),
                "interventions": s.interventions,
                "episodes": s.episodes,
                "episode_interventions": s.episode_interventions,
                "open_run_steps": self._open_steps(s),
            }
            for sid, s in self.streams.items()
        }

    def offline_stats(self) -> dict[str, int] | None:
        """The offline buffer's figures, or None while there is none."""
        if self.offline is None:
            return None
        return {
            "stored": len(self.offline),
            "demos": self.offline_demos,
            "interventions": self.offline_interventions,
            "open_run_steps": sum(self._open_steps(s) for s in self.streams.values()),
        }

    # ---- checkpoints ----------------------------------------------------------------------------------

    def state_dict(self) -> Tensors:
        """Every stream's buffer state under `streams.<id>.`, with its env count, counters, flags and open
        intervention runs; the offline buffer's under `offline.` and its counters under `offline_group.`."""
        state: Tensors = {}
        for sid, s in self.streams.items():
            prefix = f"streams.{sid}."
            state.update({prefix + k: v for k, v in s.buffer.state_dict().items()})
            filled = min(s.rows, s.intervened.shape[0])
            state[prefix + "group.intervened"] = s.intervened[:filled]
            state[prefix + "group.num_envs"] = torch.tensor(s.num_envs)
            state[prefix + "group.rows"] = torch.tensor(s.rows)
            state[prefix + "group.interventions"] = torch.tensor(s.interventions)
            state[prefix + "group.episodes"] = torch.tensor(s.episodes)
            state[prefix + "group.episode_interventions"] = torch.tensor(s.episode_interventions)
            state[prefix + "group.running"] = s.running.clone()
            if s.runs is not None:
                state.update({prefix + "runs." + k: v for k, v in s.runs.state_dict().items()})
        if self.offline is not None:
            state.update({f"offline.{k}": v for k, v in self.offline.state_dict().items()})
            state["offline_group.demos"] = torch.tensor(self.offline_demos)
            state["offline_group.interventions"] = torch.tensor(self.offline_interventions)
        return state

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        per_stream: dict[str, Tensors] = {}
        offline: Tensors = {}
        for name, value in state.items():
            if name.startswith("streams."):
                sid, _, rest = name.removeprefix("streams.").partition(".")
                per_stream.setdefault(sid, {})[rest] = value
            elif name.startswith("offline."):
                offline[name.removeprefix("offline.")] = value
            elif not name.startswith("offline_group."):
                raise KeyError(f"replay group state has an entry outside 'streams.<id>.' and 'offline.': {name!r}")
        if offline and self.make_offline is None:
            raise ValueError(
                "the saved replay holds an offline buffer (demonstrations, interventions); this one keeps none"
            )
        self.streams.clear()
        self.offline, self.offline_demos, self.offline_interventions = None, 0, 0
        for sid, entries in per_stream.items():
            if "group.num_envs" not in entries:
                raise KeyError(f"replay group state of stream {sid!r} lacks its 'group.num_envs'")
            stream = self.open_stream(sid, int(entries["group.num_envs"]))
            stream.buffer.load_state_dict({k: v for k, v in entries.items() if not k.startswith(("group.", "runs."))})
            flags = entries["group.intervened"]
            stream.intervened[: flags.shape[0]].copy_(flags)
            stream.rows = int(entries["group.rows"])
            stream.interventions = int(entries["group.interventions"])
            stream.episodes = int(entries.get("group.episodes", torch.tensor(0)))
            stream.episode_interventions = int(entries.get("group.episode_interventions", torch.tensor(0)))
            if "group.running" in entries:
                stream.running.copy_(entries["group.running"].cpu())
            runs = {k.removeprefix("runs."): v for k, v in entries.items() if k.startswith("runs.")}
            if runs:
                stream.runs = InterventionSegments(stream.num_envs)
                stream.runs.load_state_dict(runs)
        if offline:
            self.ensure_offline().load_state_dict(offline)
            self.offline_demos = int(state.get("offline_group.demos", torch.tensor(0)))
            self.offline_interventions = int(state.get("offline_group.interventions", torch.tensor(0)))


def concat_batches(batches: list[Batch]) -> Batch:
    """The rows of every batch in order, as one batch of their (common) class."""
    first = batches[0]
    if len(batches) == 1:
        return first
    kinds = {type(b) for b in batches}
    if len(kinds) > 1:
        raise TypeError(f"cannot concatenate batches of different kinds: {sorted(k.__name__ for k in kinds)}")
    fields = {}
    for f in dataclasses.fields(first):
        values = [getattr(b, f.name) for b in batches]
        if f.name == "demo":
            fields[f.name] = _concat_demo(values, batches)
        elif isinstance(values[0], Mapping):
            fields[f.name] = {k: torch.cat([v[k] for v in values]) for k in values[0]}
        else:
            fields[f.name] = torch.cat(values)
    return type(first)(**fields)


def _concat_demo(values: list[torch.Tensor | None], batches: list[Batch]) -> torch.Tensor | None:
    if all(v is None for v in values):
        return None
    return torch.cat(
        [
            torch.zeros(len(b.action), dtype=torch.bool, device=b.action.device) if v is None else v
            for v, b in zip(values, batches, strict=True)
        ]
    )
