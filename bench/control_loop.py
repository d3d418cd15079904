"""The simulated twin and a deployed policy in two processes over ROS 2 (Cyclone DDS on loopback), at 100 Hz
and at 500 Hz, against a raw Cyclone DDS ping-pong of the same messages measured in the same run.

Twin side (this process): hardware/sim_twin.py:SimTwin (MuJoCo Panda, one control period per deadline)
publishes /joint_states through our bridge. Policy side (a child process, as `robotrl-deploy` would run):
a bridge subscription whose callback turns each joint state (position and velocity) into a joint-position
command with a 2x256 robotrl.nn.mlp.MLP forward and publishes it on /forward_position_controller/commands.
The command carries the stamp of the state it answers in its layout's dimension label, so the twin's
command hook measures the round trip: state stamped and published -> command received at the twin (ms).
Also reported: the twin's period jitter (std of the intervals between joint states), wake-up lateness,
missed control periods (a deadline passed a whole period before the loop got to it), and the replies per
published state.

Reference (`raw_*`): the same two processes' roles with plain cyclonedds entities (DomainParticipant, Topic,
DataWriter, DataReader read by a WaitSet thread; the same ROS 2 types, QoS and loopback configuration) and no bridge,
no simulation: a pacer publishes the same JointState at the same rate, a responder runs the same MLP and
answers with the same Float64MultiArray. `overhead_ratio_vs_raw_dds` is our p50 round trip at 100 Hz over
the raw one (p99 and 500 Hz ratios too). Goals: p99 <= 2 ms and no missed period at 100 Hz; <= 0.1% missed
at 500 Hz. Each phase runs after a warm-up (discovery, first commands) that is not counted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import stop_process

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = "/forward_position_controller/commands"
HIDDEN = (256, 256)
RATES = (100, 500)


def extra(parser) -> None:
    parser.add_argument("--seconds", type=float, default=None, help="measured seconds per phase (6 quick, 30 full)")
    parser.add_argument("--domain", type=int, default=120, help="first ROS 2 domain id (four are used)")
    parser.add_argument("--note", default="", help="added to the JSON's note (what else ran on the machine)")


# ---- the policy side (child process) -----------------------------------------------------------------------


def _policy(home):
    """The deployed policy: (position, velocity) -> a joint-position command near home."""
    import torch

    from robotrl.nn.mlp import MLP

    torch.manual_seed(0)
    net = MLP(2 * len(home), HIDDEN, len(home)).eval()
    home_t = torch.tensor(home, dtype=torch.float32)

    @torch.inference_mode()
    def act(position, velocity) -> list[float]:
        obs = torch.tensor([*position, *velocity], dtype=torch.float32)
        return (home_t + 0.05 * torch.tanh(net(obs[None])[0])).tolist()

    act([0.0] * len(home), [0.0] * len(home))  # the first forward allocates
    return act


def _label(stamp) -> str:
    return f"{stamp.sec}.{stamp.nanosec:09d}"


def _command(values: list[float], label: str):
    from robotrl.hardware.ros2.msgs import Float64MultiArray, MultiArrayDimension, MultiArrayLayout

    dim = MultiArrayDimension(label=label, size=len(values), stride=len(values))
    return Float64MultiArray(layout=MultiArrayLayout(dim=[dim]), data=values)


def child(role: str, domain_id: int, seconds: float) -> None:
    import torch

    torch.set_num_threads(1)
    from robotrl.core.robot_spec import load_robot_spec

    spec = load_robot_spec("panda")
    act = _policy(spec.home.tolist())
    joints = list(spec.joints)
    if role == "policy":  # through our bridge, as deployment code would
        from robotrl.hardware.ros2 import make_bridge
        from robotrl.hardware.ros2.msgs import Float64MultiArray, JointState

        bridge = make_bridge("dds", domain_id=domain_id)
        publisher = bridge.publisher(COMMANDS, Float64MultiArray)

        def on_state(msg) -> None:
            index = {name: i for i, name in enumerate(msg.name)}
            rows = [index[name] for name in joints]
            command = act([msg.position[i] for i in rows], [msg.velocity[i] for i in rows])
            publisher.publish(_command(command, _label(msg.header.stamp)))

        bridge.subscription("/joint_states", JointState, callback=on_state)
        time.sleep(seconds)
        bridge.close()
    else:  # raw Cyclone DDS: no bridge layer
        entities = _raw_entities(domain_id, reader_topic="rt/joint_states", writer_topic="rt" + COMMANDS, pong=True)

        def on_data(samples) -> None:
            for msg in samples:
                command = act(msg.position[:7], msg.velocity[:7])
                entities["writer"].write(_command(command, _label(msg.header.stamp)))

        entities["listen"](on_data)
        time.sleep(seconds)
        entities["close"]()
    print("child done", flush=True)


def _raw_entities(domain_id: int, reader_topic: str, writer_topic: str, pong: bool) -> dict:
    """Plain cyclonedds entities on a loopback domain; `listen(on_samples)` starts a thread that waits on the
    reader (a WaitSet, cyclonedds' own read loop) and hands each batch of taken samples to `on_samples`."""
    from cyclonedds.core import InstanceState, ReadCondition, SampleState, ViewState, WaitSet
    from cyclonedds.domain import Domain, DomainParticipant
    from cyclonedds.pub import DataWriter
    from cyclonedds.sub import DataReader
    from cyclonedds.topic import Topic
    from cyclonedds.util import duration
    from robotrl.hardware.ros2.dds_backend import LOOPBACK_CONFIG, dds_qos
    from robotrl.hardware.ros2.msgs import Float64MultiArray, JointState
    from robotrl.hardware.ros2.qos import DEFAULT

    domain = Domain(domain_id, LOOPBACK_CONFIG)
    participant = DomainParticipant(domain_id)
    reader_type, writer_type = (JointState, Float64MultiArray) if pong else (Float64MultiArray, JointState)
    writer = DataWriter(participant, Topic(participant, writer_topic, writer_type), qos=dds_qos(DEFAULT))
    reader = DataReader(participant, Topic(participant, reader_topic, reader_type), qos=dds_qos(DEFAULT))
    waitset = WaitSet(participant)
    waitset.attach(ReadCondition(reader, SampleState.Any | ViewState.Any | InstanceState.Any))
    entities = {"domain": domain, "participant": participant, "writer": writer, "reader": reader}

    stopping = threading.Event()

    def listen(on_samples) -> None:
        def loop() -> None:
            while not stopping.is_set():
                waitset.wait(duration(milliseconds=50))
                samples = [m for m in reader.take(N=64) if isinstance(m, reader_type)]
                if samples:
                    on_samples(samples)

        thread = threading.Thread(target=loop, daemon=True, name="raw-dds-reader")
        thread.start()
        entities["thread"] = thread

    def close() -> None:
        stopping.set()
        if "thread" in entities:
            entities["thread"].join(timeout=5.0)
        for entity in (waitset, reader, writer, participant, domain):
            entity.__del__()  # free the DDS entities now (cyclonedds deletes them in __del__, idempotently)

    entities["listen"], entities["close"] = listen, close
    return entities


def _spawn(role: str, domain_id: int, seconds: float) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", MUJOCO_GL="egl")
    command = [sys.executable, str(Path(__file__).resolve()), "--child", role, str(domain_id), str(seconds)]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# ---- the twin side (this process) --------------------------------------------------------------------------


def _stamp_seconds(label: str) -> float:
    sec, nanosec = label.split(".")
    return int(sec) + int(nanosec) * 1e-9


def _percentiles(latencies: list[float]) -> dict:
    import numpy as np

    if not latencies:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    ms = np.asarray(latencies) * 1e3
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 4),
        "p99_ms": round(float(np.percentile(ms, 99)), 4),
        "max_ms": round(float(ms.max()), 4),
    }


def twin_phase(rate_hz: int, domain_id: int, seconds: float) -> dict:
    from robotrl.hardware.sim_twin import SimTwin, SimTwinConfig

    latencies: list[float] = []

    def on_command(kind, msg, received) -> None:
        if msg.layout.dim:
            latencies.append(received - _stamp_seconds(msg.layout.dim[0].label))

    cfg = SimTwinConfig(rate_hz=float(rate_hz), domain_id=domain_id, report_interval=0)
    twin = SimTwin(cfg, on_command=on_command)
    process = _spawn("policy", domain_id, seconds + 60)
    try:
        deadline = time.monotonic() + 40
        while not twin.stats()["accepted"].get("commands"):  # the policy process is up and answering
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"the policy process never answered: {process.communicate()[0][-2000:]}")
            twin.run(0.25)
        twin.run(1.0)  # warm-up, not counted
        twin.reset_stats()
        latencies.clear()
        stats = twin.run(seconds)
        time.sleep(0.05)  # the replies to the last states
        answered = list(latencies)
    finally:
        stop_process(process, timeout=10)
        twin.close()
    return {
        **_percentiles(answered),
        "replies_per_state": round(len(answered) / max(stats["periods"], 1), 4),
        "periods": stats["periods"],
        "missed": stats["missed"],
        "missed_frac": stats["missed_frac"],
        "jitter_ms": stats["period_jitter_ms"],
        "period_max_ms": stats["period_max_ms"],
        "lateness_p99_ms": stats["lateness_p99_ms"],
    }


def raw_phase(rate_hz: int, domain_id: int, seconds: float) -> dict:
    from robotrl.hardware.ros2.msgs import JointState

    from robotrl.core.robot_spec import load_robot_spec

    spec = load_robot_spec("panda")
    names = [*spec.joints, *spec.gripper.joints]
    position = [*spec.home.tolist(), 0.04, 0.04]
    entities = _raw_entities(domain_id, reader_topic="rt" + COMMANDS, writer_topic="rt/joint_states", pong=False)
    latencies: list[float] = []
    lock = threading.Lock()

    def on_data(samples) -> None:
        received = time.time()
        for msg in samples:
            if msg.layout.dim:
                with lock:
                    latencies.append(received - _stamp_seconds(msg.layout.dim[0].label))

    entities["listen"](on_data)
    writer = entities["writer"]
    process = _spawn("raw", domain_id, seconds + 60)

    def publish() -> None:
        now = time.time()
        ns = int(now * 1e9)
        msg = JointState(name=names, position=position, velocity=[0.0] * 9, effort=[0.0] * 9)
        msg.header.stamp.sec, msg.header.stamp.nanosec = ns // 1_000_000_000, ns % 1_000_000_000
        writer.write(msg)

    def paced(duration: float) -> int:
        period, start, tick = 1.0 / rate_hz, time.monotonic(), 0
        while start + tick * period < start + duration:
            delay = start + tick * period - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            publish()
            tick += 1
        return tick

    try:
        deadline = time.monotonic() + 40
        while not latencies:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"the raw responder never answered: {process.communicate()[0][-2000:]}")
            paced(0.25)
        paced(1.0)
        with lock:
            latencies.clear()
        sent = paced(seconds)
        time.sleep(0.05)
        with lock:
            answered = list(latencies)
    finally:
        stop_process(process, timeout=10)
        entities["close"]()
    return {**_percentiles(answered), "replies_per_state": round(len(answered) / max(sent, 1), 4)}


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def run(args) -> dict:
    seconds = args.seconds or (6.0 if args.quick else 30.0)
    load_before = _load()
    figures: dict = {"seconds_per_phase": seconds}
    for i, rate in enumerate(RATES):
        ours = twin_phase(rate, args.domain + 2 * i, seconds)
        raw = raw_phase(rate, args.domain + 2 * i + 1, seconds)
        suffix = f"_{rate}hz"
        figures.update(
            {
                f"p50_ms{suffix}": ours["p50_ms"],
                f"p99_ms{suffix}": ours["p99_ms"],
                f"max_ms{suffix}": ours["max_ms"],
                f"missed{suffix}": ours["missed"],
                f"missed_frac{suffix}": round(ours["missed_frac"], 6),
                f"periods{suffix}": ours["periods"],
                f"jitter_ms{suffix}": ours["jitter_ms"],
                f"period_max_ms{suffix}": ours["period_max_ms"],
                f"lateness_p99_ms{suffix}": ours["lateness_p99_ms"],
                f"replies_per_state{suffix}": ours["replies_per_state"],
                f"raw_p50_ms{suffix}": raw["p50_ms"],
                f"raw_p99_ms{suffix}": raw["p99_ms"],
                f"raw_replies_per_state{suffix}": raw["replies_per_state"],
                f"overhead_ratio_vs_raw_dds{suffix}": _ratio(ours["p50_ms"], raw["p50_ms"]),
                f"overhead_ratio_p99_vs_raw_dds{suffix}": _ratio(ours["p99_ms"], raw["p99_ms"]),
            }
        )
    figures["overhead_ratio_vs_raw_dds"] = figures["overhead_ratio_vs_raw_dds_100hz"]
    figures["goals_met"] = {
        "p99_ms_100hz<=2": figures["p99_ms_100hz"] is not None and figures["p99_ms_100hz"] <= 2.0,
        "missed_100hz==0": figures["missed_100hz"] == 0,
        "missed_frac_500hz<=0.001": figures["missed_frac_500hz"] <= 0.001,
    }
    load_after = _load()
    figures["load_avg_1m"] = [load_before, load_after]
    figures["cpus"] = os.cpu_count()
    shared = max(load_before, load_after) > 0.5 * (os.cpu_count() or 1)
    figures["note"] = (
        f"{os.cpu_count()} CPUs, 1-minute load average {load_before:.2f} before and {load_after:.2f} after "
        "(this bench's own processes included): "
        + (
            "other work shared the machine, so the timings include its preemption; numbers not tuned"
            if shared
            else "little other work ran (other processes share this machine; their short jobs may have overlapped)"
        )
        + (f"; {args.note}" if args.note else "")
    )
    figures["quick"] = bool(args.quick)
    return figures


def _ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        parser = argparse.ArgumentParser(prog="control_loop.py --child")
        parser.add_argument("role", choices=("policy", "raw"))
        parser.add_argument("domain", type=int)
        parser.add_argument("seconds", type=float)
        child_args = parser.parse_args(sys.argv[2:])
        child(child_args.role, child_args.domain, child_args.seconds)
        return
    from common import emit, parse_args

    args = parse_args(__doc__, extra)
    emit("control_loop", run(args), args.save)


if __name__ == "__main__":
    main()
