"""The actor-learner transport in-process: payloads, per-stream storage, the write-ahead log, the outbox,
the token, TLS and deadlines (real gRPC on free ports)."""

import importlib.util
import json
import logging
import shutil
import socket
import subprocess
import threading
import time

import grpc
import pytest
import torch
from safetensors.torch import save

from robotrl.core.spec import TensorSpec
from robotrl.data.mixer import RatioSchedule
from robotrl.runtime.transport.client import LearnerClient, request
from robotrl.runtime.transport.config import ConnectConfig, ServeConfig
from robotrl.runtime.transport.ledger import MAX_SEQ_AHEAD, Arrival, Ledger
from robotrl.runtime.transport.protocol import PROTOCOL_VERSION, RpcFailure, method_path, new_session
from robotrl.runtime.transport.sender import Outbox, backoff_delay
from robotrl.runtime.transport.server import serve
from robotrl.runtime.transport.service import LearnerService, LearnerSpec
from robotrl.runtime.transport.storage import ReplayGroup, replay_factory
from robotrl.runtime.transport.wal import WriteAheadLog
from robotrl.runtime.transport.weights import WeightsBoard
from robotrl.runtime.transport.wire import (
    WireError,
    check_transitions,
    check_weights,
    decode,
    encode,
    spec_from_json,
    spec_to_json,
)

SPEC = {"state": TensorSpec((3,)), "pixels": TensorSpec((1, 4, 4), torch.uint8)}
STATE_SPEC = {"state": TensorSpec((3,))}
MB = 1 << 20
S1, S2 = new_session(), new_session()


def transitions(steps=4, envs=2, spec=SPEC, action_dim=2, intervened_every=0):
    batch = {}
    for key, s in spec.items():
        for part in ("obs", "next_obs"):
            if s.dtype == torch.uint8:
                batch[f"{part}.{key}"] = torch.randint(0, 256, (steps, envs, *s.shape), dtype=torch.uint8)
            else:
                batch[f"{part}.{key}"] = torch.randn(steps, envs, *s.shape)
    batch["action"] = torch.rand(steps, envs, action_dim) * 2 - 1
    batch["reward"] = torch.randn(steps, envs)
    batch["terminated"] = torch.zeros(steps, envs, dtype=torch.bool)
    batch["truncated"] = torch.zeros(steps, envs, dtype=torch.bool)
    batch["intervened"] = torch.zeros(steps, envs, dtype=torch.bool)
    if intervened_every:
        batch["intervened"][::intervened_every, 0] = True
    return batch


# ---- wire ------------------------------------------------------------------------------------------------


def test_wire_round_trip_keeps_tensors_and_header():
    batch = transitions(intervened_every=2)
    header, tensors = decode(encode(batch, {"actor_id": "a", "seq": 3}), MB)
    assert header == {"actor_id": "a", "seq": 3}
    assert set(tensors) == set(batch)
    for key, value in batch.items():
        assert tensors[key].dtype == value.dtype and torch.equal(tensors[key], value)
    assert check_transitions(tensors, SPEC, 2, num_envs=2, max_steps=10) == 4
    assert spec_from_json(spec_to_json(SPEC)) == SPEC


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "too short"),
        (b"\xff" * 64, "header"),
        (b"\x10\x00\x00\x00\x00\x00\x00\x00garbage!garbage!", "not JSON"),
        (save({"x": torch.ones(2, dtype=torch.float64)}, metadata={"header": "{}"}), "dtype 'F64'"),
        (save({"x": torch.tensor([1.0, float("nan")])}, metadata={"header": "{}"}), "'x' holds non-finite"),
        (save({"x": torch.tensor([float("inf")])}, metadata={"header": "{}"}), "non-finite"),
        (save({"x": torch.ones(2)}), "lacks its JSON 'header'"),
        (save({"x": torch.ones(2)}, metadata={"header": "[1]"}), "must be a JSON object"),
        (save({"x": torch.ones(300_000)}, metadata={"header": "{}"}), "exceeds the limit"),
    ],
    ids=["empty", "garbage", "not-json", "float64", "nan", "inf", "no-header", "header-not-object", "oversized"],
)
def test_decode_rejects_malformed_payloads_by_name(payload, message):
    with pytest.raises(WireError, match=message):
        decode(payload, MB)


def test_decode_rejects_a_header_json_cannot_parse_as_a_wire_error():
    import json
    import struct

    for text in ("1" * 5000, "[" * 100_000):  # an int past Python's digit limit; nesting past the recursion limit
        blob = json.dumps({"__metadata__": {"header": text}}).encode()
        with pytest.raises(WireError, match="not JSON"):
            decode(struct.pack("<Q", len(blob)) + blob, MB)


def test_decode_rejects_a_truncated_payload():
    data = encode(transitions(), {})
    with pytest.raises(WireError, match="malformed safetensors"):
        decode(data[:-10], MB)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b.pop("next_obs.state"), r"lacks \['next_obs.state'\]"),
        (lambda b: b.update(extra=torch.ones(4, 2)), r"unexpected entries \['extra'\]"),
        (lambda b: b.update(reward=b["reward"].double()), "'reward' must have dtype torch.float32"),
        (lambda b: b.update(intervened=b["intervened"].float()), "'intervened' must have dtype torch.bool"),
        (lambda b: b.update({"obs.state": torch.randn(4, 2, 5)}), r"'obs.state' must have shape \[4, 2, 3\]"),
        (lambda b: b.update({"obs.pixels": torch.zeros(4, 2, 1, 4, 4)}), "'obs.pixels' must have dtype torch.uint8"),
        (lambda b: b.update(action=torch.full((4, 2, 2), 1.5)), r"outside \[-1, 1\]"),
        (lambda b: b.update(reward=torch.zeros(4, 3)), r"'reward' must have shape \[steps, 2\]"),
        # finite, but a TD loss squares it past float32's range: the learner would stop, after restarts too
        (lambda b: b["reward"].__setitem__((0, 0), 1e20), r"'reward' has values beyond \+-1e\+06"),
        (lambda b: b["next_obs.state"].__setitem__((1, 1, 2), -3e7), r"'next_obs.state' has values beyond"),
    ],
    ids=[
        "missing",
        "unexpected",
        "reward-dtype",
        "flag-dtype",
        "obs-shape",
        "pixel-dtype",
        "action-range",
        "envs",
        "huge-reward",
        "huge-obs",
    ],
)
def test_transitions_must_fit_the_learner_spec(change, message):
    batch = transitions()
    change(batch)
    with pytest.raises(WireError, match=message):
        check_transitions(batch, SPEC, 2, num_envs=2, max_steps=10)
    with pytest.raises(WireError, match="between 1 and 3"):
        check_transitions(transitions(), SPEC, 2, num_envs=2, max_steps=3)


def test_weights_must_fit_the_receivers_tensors():
    own = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
    check_weights({"w": torch.ones(2, 3), "b": torch.ones(3)}, own)
    with pytest.raises(WireError, match=r"missing \['b'\]"):
        check_weights({"w": torch.ones(2, 3)}, own)
    with pytest.raises(WireError, match=r"'w' must have shape \[2, 3\]"):
        check_weights({"w": torch.ones(3, 2), "b": torch.ones(3)}, own)


# ---- storage, ledger, log, outbox -------------------------------------------------------------------------


def group(capacity=64, n_step=1, spec=STATE_SPEC):
    make = replay_factory(spec, 2, capacity, frame_stack=1, n_step=n_step, gamma=0.9, device=torch.device("cpu"))
    return ReplayGroup(spec, 2, capacity, make)


def test_replay_group_keeps_streams_apart_samples_by_size_and_keeps_flags():
    storage = group()
    storage.add("a", transitions(steps=6, envs=2, spec=STATE_SPEC, intervened_every=2))
    storage.add("b", transitions(steps=2, envs=1, spec=STATE_SPEC))
    counts = {k: {n: v[n] for n in ("transitions", "stored", "interventions")} for k, v in storage.stats().items()}
    assert counts == {
        "a": {"transitions": 12, "stored": 12, "interventions": 3},
        "b": {"transitions": 2, "stored": 2, "interventions": 0},
    }
    assert storage.offline is None  # no make_offline: intervened steps are only flagged
    assert storage.streams["a"].intervened[:6, 0].tolist() == [True, False] * 3
    torch.manual_seed(0)
    rewards_b = set(storage.streams["b"].buffer.reward[:2, 0].tolist())
    from_b = sum(r in rewards_b for r in storage.sample(7000).reward.flatten().tolist())
    assert abs(from_b / 7000 - 2 / 14) < 0.02  # in proportion to the transitions each stream holds
    with pytest.raises(ValueError, match="holds 2 envs per step, got 3"):
        storage.add("a", transitions(steps=1, envs=3, spec=STATE_SPEC))
    with pytest.raises(ValueError, match="stream id must be"):
        storage.add("a.b", transitions(steps=1, envs=2, spec=STATE_SPEC))
    with pytest.raises(ValueError, match=r"missing \['intervened'\]"):
        storage.add("a", {k: v for k, v in transitions(spec=STATE_SPEC).items() if k != "intervened"})

    restored = group()
    restored.load_state_dict(storage.state_dict())
    assert restored.stats() == storage.stats()
    assert torch.equal(restored.streams["a"].intervened, storage.streams["a"].intervened)
    assert torch.equal(restored.streams["a"].buffer.reward, storage.streams["a"].buffer.reward)


def hil_group(capacity=256, offline_capacity=256, ratio=0.25, n_step=1):
    make = replay_factory(STATE_SPEC, 2, capacity, frame_stack=1, n_step=n_step, gamma=0.9, device=torch.device("cpu"))
    offline = replay_factory(STATE_SPEC, 2, offline_capacity, 1, n_step, 0.9, torch.device("cpu"))
    return ReplayGroup(STATE_SPEC, 2, capacity, make, make_offline=lambda: offline(1), schedule=RatioSchedule(ratio))


def flagged(steps, envs, rows, start=0.0):
    """A batch whose (step, env) pairs in `rows` are intervened; rewards number the transitions from `start`."""
    batch = transitions(steps=steps, envs=envs, spec=STATE_SPEC)
    batch["reward"] = start + torch.arange(steps * envs, dtype=torch.float32).view(steps, envs)
    for t, e in rows:
        batch["intervened"][t, e] = True
    return batch


def offline_rows(storage):
    offline = storage.offline
    n = len(offline)
    return offline.reward[:n, 0].tolist(), (offline.truncated[:n, 0] | offline.terminated[:n, 0]).tolist()


def test_intervened_steps_are_copied_to_one_shared_offline_buffer_as_runs_that_never_span_a_break():
    storage = hil_group()
    storage.add("a", flagged(4, 2, [(1, 0), (2, 0), (3, 0), (3, 1)], start=0))  # rewards 0..7: [t, e] = 2t + e
    assert storage.offline_stats() == {"stored": 0, "demos": 0, "interventions": 0, "open_run_steps": 4}
    storage.add("a", flagged(2, 2, [(0, 0)], start=100))  # env 0's run goes on across the batches, then ends
    assert offline_rows(storage) == ([7.0, 2.0, 4.0, 6.0, 100.0], [True, False, False, False, True])
    storage.add("b", flagged(2, 1, [(0, 0)], start=200))  # another actor's run, into the same buffer
    storage.add("a", flagged(1, 2, [(0, 0)], start=300))
    assert storage.open_run_steps("a") == 1
    storage.cut("a")  # a gap or a new session: the open run ends at the cut, truncated
    assert offline_rows(storage) == (
        [7.0, 2.0, 4.0, 6.0, 100.0, 200.0, 300.0],
        [True, False, False, False] + [True] * 3,
    )
    assert storage.offline_stats() == {"stored": 7, "demos": 0, "interventions": 7, "open_run_steps": 0}
    assert storage.stats()["a"]["interventions"] == 6  # the stream keeps every step, flagged, as before
    assert len(storage) == 8 + 4 + 2 + 2  # online: every transition, corrections included
    assert storage.end_open_runs("a") == 0  # nothing open: a second cut writes nothing


def test_batches_take_the_offline_share_marked_as_demo():
    storage = hil_group(ratio=0.25)
    storage.add("a", flagged(20, 2, []))
    assert storage.sample(64).demo is None  # nothing offline yet: every row online
    storage.load_demos(demos(5))
    batch = storage.sample(64)
    assert int(batch.demo.sum()) == 16 and (batch.reward[batch.demo] >= 1000).all()
    assert (batch.reward[~batch.demo] < 1000).all()
    assert storage.offline_stats()["demos"] == 5
    storage.schedule = RatioSchedule(0.5, 0.0, 80)  # a schedule on the transitions received (40 so far)
    assert storage.offline_ratio == pytest.approx(0.25) and int(storage.sample(64).demo.sum()) == 16
    only_offline = hil_group(ratio=0.25)
    only_offline.load_demos(demos(3))
    assert only_offline.sample(8).demo.all()  # demonstrations, no actor yet


def demos(n):
    """A `load` for ReplayGroup.load_demos: n single-env rows with rewards 1000, 1001, ... as one run."""

    def load(offline):
        for i in range(n):
            obs = {"state": torch.randn(1, 3)}
            done = torch.tensor([i == n - 1])
            offline.add(obs, torch.zeros(1, 2), torch.tensor([1000.0 + i]), obs, torch.tensor([False]), done)
        return n

    return load


def test_replay_group_state_keeps_the_offline_buffer_and_open_runs_mid_intervention():
    batches = [flagged(3, 2, [(1, 0), (2, 0), (2, 1)], start=0), flagged(3, 2, [(0, 0), (0, 1), (1, 1)], start=10)]
    straight = hil_group()
    straight.load_demos(demos(2))
    for batch in batches:
        straight.add("a", batch)

    resumed = hil_group()
    resumed.load_demos(demos(2))
    resumed.add("a", batches[0])
    saved = resumed.state_dict()
    assert saved["streams.a.runs.count"].tolist() == [2, 1]  # runs open at the checkpoint are in it
    resumed = hil_group()
    resumed.load_state_dict(saved)
    resumed.add("a", batches[1])
    assert resumed.offline_stats() == straight.offline_stats()
    assert offline_rows(resumed)[0][2:] == offline_rows(straight)[0][2:] == [2.0, 4.0, 10.0, 5.0, 11.0, 13.0]
    assert offline_rows(resumed)[1] == offline_rows(straight)[1]
    assert torch.equal(resumed.offline.obs["state"][2:8], straight.offline.obs["state"][2:8])
    assert resumed.stats() == straight.stats()
    with pytest.raises(ValueError, match="keeps none"):
        group().load_state_dict(saved)


def test_closing_a_silent_actors_runs_is_logged_so_a_replayed_log_rebuilds_the_offline_buffer(tmp_path):
    def service():
        spec = LearnerSpec("t", {}, STATE_SPEC, 2, 0, 4, 100, MB, 1.0)
        return LearnerService(spec, hil_group(), WriteAheadLog(tmp_path / "wal.log"), WeightsBoard("x"))

    live = service()
    live.register(request({"actor_id": "arm", "session": S1, "num_envs": 2, "task": "t"}))
    header = {"actor_id": "arm", "session": S1, "env_step": 0}
    live.push(request({**header, "seq": 0}, flagged(3, 2, [(1, 0), (2, 0), (2, 1)])))
    assert live.end_open_runs("arm") == 3 and live.end_open_runs("arm") == 0  # the actor went silent
    live.push(request({**header, "seq": 1}, flagged(2, 2, [(1, 1)], start=10)))  # it was only slow
    live.wal.close()

    replayed = service()  # a restart with no checkpoint: the whole log, the decision included
    assert replayed.replay_log() == 2
    assert offline_rows(replayed.storage) == offline_rows(live.storage) == ([2.0, 4.0, 5.0], [False, True, True])
    assert replayed.storage.open_run_steps("arm") == live.storage.open_run_steps("arm") == 1


def test_a_log_its_checkpoint_already_holds_is_not_replayed_after_a_crash(tmp_path):
    def service():
        spec = LearnerSpec("t", {}, STATE_SPEC, 2, 0, 4, 100, MB, 0.01)
        return LearnerService(spec, group(), WriteAheadLog(tmp_path / "wal.log"), WeightsBoard("x"))

    def push(svc, session, seq):
        header = {"actor_id": "arm", "session": session, "env_step": 0, "seq": seq}
        svc.push(request(header, transitions(steps=3, envs=2, spec=STATE_SPEC)))

    live = service()
    assert live.replay_log() == 0  # a fresh start: the log is marked as following generation 0
    live.register(request({"actor_id": "arm", "session": S1, "num_envs": 2, "task": "t"}))
    push(live, S1, 0)
    time.sleep(0.05)  # the actor restarts: a new session
    live.register(request({"actor_id": "arm", "session": S2, "num_envs": 2, "task": "t"}))
    push(live, S2, 0)
    assert len(live.storage) == 12
    # checkpoint generation 1 holds all of it; the learner dies before the log is emptied
    storage, ledger = live.storage.state_dict(), live.ledger.state()
    live.wal.close()

    restarted = service()
    restarted.storage.load_state_dict(storage)
    restarted.ledger.load_state(ledger)
    restarted.wal_generation = 1
    assert restarted.replay_log() == 0  # replaying it would store session s1's batch a second time
    assert len(restarted.storage) == 12
    push(restarted, S2, 1)  # the log goes on in the new generation
    restarted.wal.close()

    again = service()  # a crash before the next checkpoint: generation 1's log is replayed onto its checkpoint
    again.storage.load_state_dict(storage)
    again.ledger.load_state(ledger)
    again.wal_generation = 1
    assert again.replay_log() == 1 and len(again.storage) == 18


def test_pixel_streams_store_each_frame_once_and_sample_stacks():
    spec = {"pixels": TensorSpec((2, 4, 4), torch.uint8), "state": TensorSpec((3,))}  # 2 stacked 1-channel frames
    make = replay_factory(spec, 2, 64, frame_stack=2, n_step=1, gamma=0.9, device=torch.device("cpu"))
    storage = ReplayGroup(spec, 2, 64, make)
    storage.add("cam", transitions(steps=5, envs=2, spec=spec))
    storage.cut("cam")
    storage.add("cam", transitions(steps=3, envs=2, spec=spec))
    assert type(storage.streams["cam"].buffer).__name__ == "FrameReplay"
    batch = storage.sample(16)
    assert batch.obs["pixels"].shape == (16, 2, 4, 4) and batch.obs["pixels"].dtype == torch.uint8
    assert storage.stats()["cam"]["transitions"] == 16


def test_a_cut_stream_sums_no_n_step_return_across_the_cut():
    storage = group(n_step=3)
    first = transitions(steps=2, envs=1, spec=STATE_SPEC)
    first["reward"].fill_(1.0)
    storage.add("a", first)
    storage.cut("a")
    storage.add("a", {**transitions(steps=2, envs=1, spec=STATE_SPEC), "reward": torch.full((2, 1), 100.0)})
    buffer = storage.streams["a"].buffer
    batch = buffer.sequences_at(torch.tensor([0]), torch.tensor([0]), 3)
    assert batch.reward.item() == pytest.approx(1.0 + 0.9)  # stops at the cut, does not reach the 100s
    assert buffer.truncated[1, 0] and not buffer.terminated[1, 0]


def test_time_the_learner_could_not_listen_is_not_an_actors_silence():
    ledger = Ledger()
    ledger.register("a", "s1", 1, now=10.0, live_s=5.0)
    ledger.register("b", "s1", 1, now=1.0, live_s=5.0)
    ledger.excuse_silence(8.0)  # a checkpoint held the service for 8 s
    assert ledger.alive(now=20.0, timeout_s=5.0) == ["a"]  # heard at 10, deaf 8 s of the 10 since
    assert ledger.alive(now=13.0, timeout_s=5.0) == ["a", "b"]  # b: heard at 1, excused to 9


def test_ledger_stores_each_batch_once_and_sees_gaps_and_new_sessions():
    ledger = Ledger()
    delivery, new = ledger.register("a", "s1", 2, now=1.0, live_s=5.0)
    assert new and delivery.acked_seq == -1
    assert ledger.arrival(delivery, 0) is Arrival.NEXT
    delivery.acked_seq = 0
    assert ledger.arrival(delivery, 0) is Arrival.DUPLICATE
    assert ledger.arrival(delivery, 3) is Arrival.GAP
    with pytest.raises(RpcFailure, match="in use by a live actor"):
        ledger.register("a", "s2", 2, now=2.0, live_s=5.0)
    _, new = ledger.register("a", "s2", 2, now=10.0, live_s=5.0)  # the old one went quiet: a restart
    assert new
    with pytest.raises(RpcFailure, match="register first"):
        ledger.session("a", "s1")
    restored = Ledger()
    restored.load_state(ledger.state())
    assert restored.session("a", "s2").acked_seq == -1


def test_write_ahead_log_survives_a_torn_tail_and_truncates(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal.log")
    wal.append(b"one")
    wal.append(b"two" * 100)
    wal.close()
    with (tmp_path / "wal.log").open("ab") as f:
        f.write(b"RWAL\x99\x00\x00")  # a record cut short by a crash
    wal = WriteAheadLog(tmp_path / "wal.log")
    assert wal.read() == [b"one", b"two" * 100]
    wal.append(b"three")
    assert wal.read() == [b"one", b"two" * 100, b"three"]
    wal.truncate()
    assert wal.read() == [] and wal.size_bytes == 0


def test_a_failed_append_leaves_the_log_as_it_was(tmp_path, monkeypatch):
    import robotrl.runtime.transport.wal as wal_module

    wal = WriteAheadLog(tmp_path / "wal.log")
    wal.append(b"one")
    size = wal.size_bytes
    real_fsync = wal_module.os.fsync

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wal_module.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        wal.append(b"two" * 10_000)  # larger than the file object's buffer: part of it reached the file
    monkeypatch.setattr(wal_module.os, "fsync", real_fsync)
    assert wal.size_bytes == size
    wal.append(b"three")  # acknowledged after the failure: must not sit behind a torn record
    assert WriteAheadLog(tmp_path / "wal.log").read() == [b"one", b"three"]


def test_reconnect_backoff_doubles_up_to_its_cap_however_long_the_learner_is_away():
    cfg = ConnectConfig(backoff_min_s=0.1, backoff_max_s=2.0)
    assert 0.08 <= backoff_delay(1, cfg) <= 0.12 and 0.16 <= backoff_delay(2, cfg) <= 0.24
    assert 1.6 <= backoff_delay(10_000, cfg) <= 2.4


def test_outbox_never_blocks_and_drops_the_oldest_when_full():
    outbox = Outbox(capacity=2)
    for i in range(3):
        assert outbox.put({"x": torch.zeros(1)}, env_steps=5, env_step=5 * (i + 1)) == i
    assert len(outbox) == 2 and outbox.oldest().seq == 1
    assert outbox.dropped_batches == 1 and outbox.dropped_env_steps == 5
    assert outbox.acknowledge(1) == 5 and outbox.oldest().seq == 2


def test_batches_dropped_before_they_were_sent_leave_one_number_out():
    outbox = Outbox(capacity=2)
    for i in range(6):  # the learner is away: 0..3 are dropped unsent
        outbox.put({"x": torch.zeros(1)}, env_steps=1, env_step=i + 1)
    outbox.close_gap(acked_seq=-1)
    assert [outbox.oldest().seq, outbox.next_seq] == [1, 3]  # 0 left out: the learner cuts the stream there
    outbox.close_gap(acked_seq=-1)
    assert outbox.oldest().seq == 1  # numbered once

    contiguous = Outbox(capacity=4)
    for i in range(3):
        contiguous.put({"x": torch.zeros(1)}, env_steps=1, env_step=i + 1)
    contiguous.sent(contiguous.oldest())
    contiguous.acknowledge(0)
    contiguous.close_gap(acked_seq=0)
    assert contiguous.oldest().seq == 1  # nothing was dropped: nothing left out

    refused = Outbox(capacity=4)
    for i in range(12):
        refused.put({"x": torch.zeros(1)}, env_steps=1, env_step=i + 1)
    refused.acknowledge(9)
    refused.oldest().payload = b"sent"
    refused.sent(refused.oldest())
    refused.close_gap(acked_seq=3)
    assert refused.oldest().seq == 10  # a batch sent under its number keeps it
    refused.forget_numbers()  # the learner refused that number: it stored nothing after 3
    refused.close_gap(acked_seq=3)
    assert [refused.oldest().seq, refused.next_seq] == [5, 7] and refused.oldest().payload is None


# ---- the channel: token, TLS, deadlines -------------------------------------------------------------------


def echo_server(**serve_kwargs):
    token = serve_kwargs.pop("token", None)
    cfg = ServeConfig(port=0, **serve_kwargs)
    handlers = {"Status": lambda req: encode({}, {"echo": decode(req, MB)[0]})}
    return serve(handlers, cfg, token)


def test_token_is_required_and_compared():
    server, port = echo_server(token="s3cret")
    try:
        address = f"127.0.0.1:{port}"
        echo = LearnerClient(ConnectConfig(address=address), token="s3cret").status()["echo"]
        assert echo["protocol"] == PROTOCOL_VERSION
        for token in (None, "wrong"):
            with pytest.raises(grpc.RpcError) as err:
                LearnerClient(ConnectConfig(address=address), token=token).status()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop(None)


def test_a_call_without_the_token_is_refused_from_its_metadata_before_its_request_is_read():
    seen = []
    handlers = {"Push": lambda req: seen.append(len(req)) or encode({}, {"ok": True})}
    server, port = serve(handlers, ServeConfig(port=0, max_message_mb=64), token="s3cret")
    address = f"127.0.0.1:{port}"
    try:
        stranger = LearnerClient(ConnectConfig(address=address, deadline_s=30))
        with pytest.raises(grpc.RpcError) as err:
            stranger.call("Push", b"\0" * (60 * MB))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and seen == []

        # a request that never comes: only a refusal made on the metadata alone can answer before the deadline
        never_sent = threading.Event()

        def withheld():
            never_sent.wait(10)
            yield b""

        call = stranger.channel.stream_unary(method_path("Push"), _registered_method=False)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            call(withheld(), timeout=5)
        never_sent.set()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and time.monotonic() - started < 2
        assert seen == []
        assert LearnerClient(ConnectConfig(address=address), token="s3cret").push(b"x") == {"ok": True}
        assert seen == [1]
    finally:
        server.stop(None)


def test_calls_beyond_the_cap_are_refused_at_once_and_calls_within_it_are_served():
    entered, release = threading.Event(), threading.Event()

    def slow(req):
        entered.set()
        release.wait(10)
        return encode({}, {"ok": True})

    server, port = serve({"Status": slow}, ServeConfig(port=0, max_concurrent_calls=1), None)
    try:
        client = LearnerClient(ConnectConfig(address=f"127.0.0.1:{port}", deadline_s=10))
        first = client._calls["Status"].future(request({}), timeout=10)
        assert entered.wait(5)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            client.status()
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() - started < 2
        release.set()
        assert decode(first.result(), MB)[0] == {"ok": True}
        assert client.status() == {"ok": True}  # the cap counts calls in flight, not calls made
    finally:
        release.set()
        server.stop(None)
    with pytest.raises(ValueError, match=r"server\.max_concurrent_calls must be >= 1, got 0"):
        ServeConfig(max_concurrent_calls=0).validate()


def test_small_methods_refuse_a_large_request_before_their_handler_sees_it(tmp_path):
    service = LearnerService(
        LearnerSpec("t", {}, STATE_SPEC, 2, 0, 4, 100, 4 * MB, 1.0),
        group(),
        WriteAheadLog(tmp_path / "wal.log"),
        WeightsBoard("x"),
    )
    limits = service.request_limits()
    assert set(limits) == {"Register", "Weights", "Heartbeat", "Status"} and max(limits.values()) <= 64 * 1024
    seen = []
    handlers = {name: (lambda req, name=name: seen.append(name) or encode({}, {})) for name in [*limits, "Push"]}
    server, port = serve(handlers, ServeConfig(port=0), None, limits)
    try:
        client = LearnerClient(ConnectConfig(address=f"127.0.0.1:{port}"))
        for name in limits:
            with pytest.raises(grpc.RpcError) as err:
                client.call(name, b"\0" * (MB // 2))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"a request of {MB // 2} bytes exceeds {name}'s limit of {limits[name]} bytes" in err.value.details()
        assert seen == []
        client.call("Push", b"\0" * (MB // 2))  # transition batches keep the server-wide limit
        assert seen == ["Push"]
    finally:
        server.stop(None)
        service.wal.close()


def learner_service(tmp_path, heartbeat_timeout_s=1.0):
    spec = LearnerSpec("t", {}, STATE_SPEC, 2, 0, 4, 100, MB, heartbeat_timeout_s)
    service = LearnerService(spec, group(), WriteAheadLog(tmp_path / "wal.log"), WeightsBoard("x"))
    server, port = serve(service.handlers(), ServeConfig(port=0), "tok", service.request_limits())
    client = LearnerClient(ConnectConfig(address=f"127.0.0.1:{port}"), token="tok")

    def push(session, seq):
        header = {"actor_id": "arm", "session": session, "seq": seq, "env_step": 0}
        return client.push(request(header, transitions(steps=3, envs=2, spec=STATE_SPEC)))

    def stop():
        client.close()
        server.stop(None)
        service.wal.close()

    return client, push, stop


def refused(call, *args):
    with pytest.raises(grpc.RpcError) as err:
        call(*args)
    return err.value.code()


ARM = {"actor_id": "arm", "num_envs": 2, "task": "t"}


def test_sessions_are_never_shown_and_only_their_registered_actor_stores_under_them(tmp_path):
    client, push, stop = learner_service(tmp_path, heartbeat_timeout_s=0.5)
    try:
        real = new_session()
        client.register({**ARM, "session": real})
        push(real, 0)
        shown = json.dumps(client.status())
        assert real not in shown and "session" not in shown

        assert refused(push, new_session(), 1) == grpc.StatusCode.FAILED_PRECONDITION  # a guess
        assert refused(push, "0123", 1) == grpc.StatusCode.INVALID_ARGUMENT  # not a session at all
        assert refused(client.register, {**ARM, "session": "s"}) == grpc.StatusCode.INVALID_ARGUMENT
        assert refused(client.register, {**ARM, "session": new_session()}) == grpc.StatusCode.ALREADY_EXISTS
        assert client.register({**ARM, "session": real})["acked_seq"] == 0  # the actor reconnecting: goes on
        assert push(real, 1)["acked_seq"] == 1

        time.sleep(0.6)  # the actor went silent: a restarted actor takes its id with a new session
        client.register({**ARM, "session": new_session()})
        assert refused(push, real, 2) == grpc.StatusCode.FAILED_PRECONDITION  # the old session is spent
        assert client.status()["streams"]["arm"]["transitions"] == 12
    finally:
        stop()


def test_a_batch_numbered_far_ahead_is_refused_and_the_actors_next_batches_are_stored(tmp_path):
    client, push, stop = learner_service(tmp_path)
    try:
        real = new_session()
        client.register({**ARM, "session": real})
        push(real, 0)
        for seq in (10**15, MAX_SEQ_AHEAD + 1, -1):
            with pytest.raises(grpc.RpcError) as err:
                push(real, seq)
            assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE and f"batch number {seq} " in err.value.details()
        assert push(real, 1)["acked_seq"] == 1 and push(real, 3)["acked_seq"] == 3  # a gap the window allows
        assert client.status()["streams"]["arm"]["transitions"] == 18
    finally:
        stop()


class _Refused(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return "refused"


def test_an_actor_retries_a_batch_refused_for_the_call_cap_and_drops_one_over_the_size_limit():
    from robotrl.runtime.transport.sender import Sender

    class Learner:
        cfg = ConnectConfig()

        def push(self, payload):
            raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED)

        def close(self):
            pass

    first_reply = {"agent": {}, "acked_seq": -1, "max_message_bytes": 4096}
    outbox = Outbox(capacity=4)
    sender = Sender(lambda: Learner(), Learner(), {"actor_id": "a", "session": S1}, first_reply, outbox, {})
    outbox.put({"x": torch.zeros(4)}, env_steps=1, env_step=1)
    with pytest.raises(grpc.RpcError):
        sender._push(outbox.oldest())  # the cap on concurrent calls: kept, resent after a backoff
    assert len(outbox) == 1 and sender.refused_batches == 0
    outbox.acknowledge(0)
    outbox.put({"x": torch.zeros(4096)}, env_steps=1, env_step=2)
    sender._push(outbox.oldest())  # over the learner's limit: it will never take these bytes
    assert len(outbox) == 0 and sender.refused_batches == 1


def test_an_open_learner_and_a_token_sent_in_plaintext_are_warned_about(caplog):
    with caplog.at_level(logging.WARNING):
        server, _ = echo_server()
        server.stop(None)
    assert "with no token: every user of this machine can push transitions" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        server, _ = echo_server(token="t")
        server.stop(None)
        LearnerClient(ConnectConfig(address="127.0.0.1:1"), token="t").close()
        LearnerClient(ConnectConfig(address="10.0.0.7:50051")).close()  # no token to leak
    assert caplog.text == ""
    with caplog.at_level(logging.WARNING):
        LearnerClient(ConnectConfig(address="10.0.0.7:50051"), token="t").close()
    assert "connecting to 10.0.0.7:50051 without TLS: the token" in caplog.text


def test_serving_beyond_loopback_needs_a_token():
    with pytest.raises(ValueError, match="no token is set"):
        serve({}, ServeConfig(host="0.0.0.0", port=0), token=None)


def _self_signed_cert(directory):
    """A certificate for localhost / 127.0.0.1 and its key, made with `cryptography` or else the openssl CLI."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    if importlib.util.find_spec("cryptography") is not None:
        _cert_with_cryptography(cert, key)
    elif shutil.which("openssl") is not None:
        names = "subjectAltName=DNS:localhost,IP:127.0.0.1"
        command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"]
        subprocess.run([*command, "-addext", names, "-keyout", str(key), "-out", str(cert)], check=True, timeout=30)
    else:
        pytest.skip("neither the cryptography package nor the openssl CLI is available to make a test certificate")
    return cert, key


def _cert_with_cryptography(cert_path, key_path):
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    alt = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(alt, critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def test_tls_handshake_and_plaintext_refused(tmp_path):
    cert, key = _self_signed_cert(tmp_path)
    server, port = echo_server(tls_cert=str(cert), tls_key=str(key), token="t")
    try:
        tls = ConnectConfig(address=f"127.0.0.1:{port}", tls_ca=str(cert), deadline_s=5)
        assert LearnerClient(tls, token="t").status()["echo"] == {"protocol": PROTOCOL_VERSION}
        started = time.monotonic()
        with pytest.raises(grpc.RpcError):
            LearnerClient(ConnectConfig(address=f"127.0.0.1:{port}", deadline_s=2), token="t").status()
        assert time.monotonic() - started < 3
    finally:
        server.stop(None)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_calls_to_a_dead_or_silent_peer_end_by_their_deadline():
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        LearnerClient(ConnectConfig(address=f"127.0.0.1:{_free_port()}", deadline_s=2)).status()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() - started < 2.5

    silent = socket.socket()  # accepts connections, never speaks HTTP/2
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    try:
        client = LearnerClient(ConnectConfig(address=f"127.0.0.1:{silent.getsockname()[1]}", deadline_s=0.5))
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            client.call("Status", request({}))
        assert err.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
        assert time.monotonic() - started < 2.0
    finally:
        silent.close()

    release = threading.Event()  # a learner that takes the call and hangs
    server, port = serve({"Status": lambda req: release.wait(10) and b""}, ServeConfig(port=0), None)
    try:
        client = LearnerClient(ConnectConfig(address=f"127.0.0.1:{port}", deadline_s=0.5))
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            client.status()
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - started < 2.0
    finally:
        release.set()
        server.stop(None)


def test_server_keeps_serving_after_a_handler_fails():
    def broken(req):
        raise RuntimeError("boom")

    def slow(req):
        threading.Event().wait(0.01)
        return encode({}, {"ok": True})

    server, port = serve(
        {"Push": broken, "Status": slow, "Register": lambda r: decode(r, 10)}, ServeConfig(port=0), None
    )
    try:
        client = LearnerClient(ConnectConfig(address=f"127.0.0.1:{port}"))
        with pytest.raises(grpc.RpcError) as err:
            client.push(request({}))
        assert err.value.code() == grpc.StatusCode.INTERNAL and "boom" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            client.register({})
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "exceeds the limit" in err.value.details()
        assert client.status() == {"ok": True}
    finally:
        server.stop(None)


@pytest.mark.parametrize(
    ("demo_rewards", "learned_reward", "refused", "her_ratio"),
    [
        ("recorded", True, "give the learner the same hil.reward_classifier", 0.0),
        ("classifier", False, "give the actor the same hil.reward_classifier", 0.0),
        ("classifier", True, None, 0.0),
        (None, True, None, 0.0),  # no demonstrations: nothing to disagree with
        (None, True, r"relabels goals \(her_ratio=0.8\) with the task's reward", 0.8),  # nor demos to relabel
        (None, False, None, 0.8),
    ],
)
def test_an_actor_must_score_steps_as_the_learners_demonstrations_are(
    tmp_path, demo_rewards, learned_reward, refused, her_ratio
):
    spec = LearnerSpec("t", {}, STATE_SPEC, 2, 0, 4, 100, MB, 1.0, demo_rewards=demo_rewards, her_ratio=her_ratio)
    service = LearnerService(spec, hil_group(), WriteAheadLog(tmp_path / "wal.log"), WeightsBoard("x"))
    header = {"actor_id": "arm", "session": S1, "num_envs": 2, "task": "t", "learned_reward": learned_reward}
    if refused is None:
        service.register(request(header))
    else:
        with pytest.raises(RpcFailure, match=refused) as failure:
            service.register(request(header))
        assert failure.value.code == grpc.StatusCode.FAILED_PRECONDITION
    service.wal.close()
