"""System identification against a twin whose dynamics are known: does `robotrl-sysid` find them?

    python bench/sysid.py [--quick] [--duration 30] [--twin-rate 500] [--domain 91] [--save] [OVERRIDE ...]

A `robotrl-sim-twin` process plays a Panda changed from the model (TRUTH: every joint's armature x1.5, damping
x2 and 0.5 N m of dry friction, every position actuator's stiffness x0.8, 16 ms of command latency) over DDS on
loopback, driven through configs/hardware/sim_twin.yaml and its shield. robotrl-sysid's excitation
(hardware/sysid_session.py) runs for `--duration` s and is recorded; the twin is then stopped and the bag fitted as
`robotrl-sysid bag=...` fits it (hardware/identify.py): every parameter of `priors=panda`, on the first 75%. The
reference is the unidentified model, in the same run: both simulate the held-out last 25% open loop.

Figures: `gain_rel_err` (the largest relative stiffness error among identified actuators; goal <= 0.05),
`latency_err_ms` (goal <= 2), `in_ci_share` (of the identified parameters whose 95% interval is narrower than 10% of
the value, the share whose interval holds the truth; goal 1.0), `heldout_error_ratio` (the nominal model's held-out
RMS joint error over the fitted one's; goal >= 5), `fit_s` (goal <= 180 on 2 cores). The twin runs in real time
in Python and simulates a period it was late for at once (up to max_catch_up_periods); `twin_missed` (periods beyond
that, which leave its physics behind the wall clock the recording is stamped with) and the shield's corrections are
reported beside the figures. --quick: 6 s of excitation, 10 iterations. `--keep DIR` keeps the recording and the
fit (refit with `robotrl-sysid bag=DIR/excitation`). OVERRIDEs are robotrl-sysid's Hydra overrides (e.g.
amplitude=0.15).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, emit, parse_args, stop_process

LATENCY_S = 0.016
JOINTS = [f"joint{i}" for i in range(1, 8)]
NOMINAL_KP = {f"act{i}": 2000.0 if i <= 4 else 500.0 for i in range(1, 8)}
TRUTH = {
    **{f"{joint}.armature": 0.1 * 1.5 for joint in JOINTS},
    **{f"{joint}.damping": 1.0 * 2 for joint in JOINTS},
    **{f"{joint}.frictionloss": 0.5 for joint in JOINTS},
    **{f"{actuator}.kp": kp * 0.8 for actuator, kp in NOMINAL_KP.items()},
    "command_latency": LATENCY_S,
}


def start_twin(overlay: Path, domain: int, rate_hz: float, seconds: float, log: Path) -> subprocess.Popen:
    """The changed robot: a twin process with the TRUTH overlay; its latency is the overlay's."""
    command = [
        sys.executable,
        "-m",
        "robotrl.hardware.sim_twin",
        f"overlay={overlay}",
        f"domain_id={domain}",
        f"rate_hz={rate_hz}",
        f"duration={seconds}",
        "report_interval=0",
    ]
    env = dict(os.environ, MUJOCO_GL="egl", OMP_NUM_THREADS="1")
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def twin_stats(log: Path) -> dict:
    """The twin's final JSON summary line (missed periods, jitter), or {} if it printed none."""
    for line in reversed(log.read_text().splitlines()):
        if line.startswith('{"sim_twin"'):
            return json.loads(line)["sim_twin"]
    return {}


def figures_of(summary: dict) -> dict:
    values, half = summary["values"], summary["half_width_95"]
    identified = [name for name in values if name not in summary["not_identified"]]
    gains = [abs(values[n] / TRUTH[n] - 1) for n in identified if n.endswith(".kp")]
    narrow = [n for n in identified if n != "command_latency" and half[n] < 0.1 * abs(values[n])]
    held = [n for n in narrow if abs(values[n] - TRUTH[n]) <= half[n]]
    latency = values.get("command_latency")
    return {
        "gain_rel_err": round(max(gains), 4) if gains else None,
        "latency_err_ms": round(abs(latency - LATENCY_S) * 1000, 2) if latency is not None else None,
        "in_ci_share": round(len(held) / len(narrow), 3) if narrow else None,
        "heldout_error_ratio": summary.get("heldout_error_ratio"),
        "fit_s": summary["fit_s"],
        "identified": len(identified),
        "fitted": len(values),
        "outside_ci": sorted(set(narrow) - set(held)),
        # every fitted parameter's error against the truth and its interval's half width, both relative to the truth
        "rel_err": {n: round(values[n] / TRUTH[n] - 1, 4) for n in values if TRUTH.get(n)},
        "rel_half_width": {n: round(half[n] / abs(TRUTH[n]), 4) for n in values if TRUTH.get(n)},
        "heldout_rms_fitted": summary.get("heldout_rms_fitted"),
        "heldout_rms_nominal": summary.get("heldout_rms_nominal"),
    }


def main() -> None:
    def extra(p):
        p.add_argument("--duration", type=float, default=30.0, help="seconds of excitation")
        p.add_argument("--twin-rate", type=float, default=500.0, help="the twin's control rate (Hz)")
        p.add_argument("--domain", type=int, default=91, help="the DDS domain the twin and robotrl-sysid share")
        p.add_argument(
            "--keep",
            default=None,
            help="a new directory to keep the recording and the fit in (refit "
            "with robotrl-sysid bag=<keep>/excitation)",
        )

    args = parse_args(__doc__, extra, overrides=True)
    duration, iterations = (6.0, 10) if args.quick else (args.duration, 30)
    import mujoco
    from omegaconf import OmegaConf
    from robotrl.hardware.identify import SysidConfig, robot_model_file, run
    from robotrl.hardware.robot_env_config import RobotEnvConfig
    from robotrl.hardware.sysid_session import record_excitation

    from robotrl.config import strict_object

    # the twin's hardware config as a user gets it (its shield settings included), on the bench's domain
    hardware = strict_object(RobotEnvConfig, OmegaConf.load(REPO / "configs" / "hardware" / "sim_twin.yaml"))
    hardware.domain_id = args.domain
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(args.keep or scratch)
        if args.keep:
            tmp.mkdir(parents=True, exist_ok=False)
        cfg = SysidConfig(hardware=hardware, out=str(tmp / "sysid"), duration=duration, max_iters=iterations)
        cfg = _with_overrides(cfg, args.overrides)
        truth = tmp / "truth.yaml"
        truth.write_text(yaml.safe_dump({"robot": "panda", "parameters": TRUTH}))
        twin_log = tmp / "twin.log"
        # the twin runs only while the robot is recorded: the fit then has both cores, as fit_s's goal assumes
        twin = start_twin(truth, args.domain, args.twin_rate, duration + 120.0, twin_log)
        try:
            model = mujoco.MjModel.from_xml_path(str(robot_model_file(hardware)))
            bag = tmp / "excitation"
            excitation = record_excitation(cfg.hardware, model, bag, cfg.duration, cfg.amplitude, cfg.seed)
        finally:
            stop_process(twin, timeout=30)
        stats = twin_stats(twin_log)
        began = time.perf_counter()
        summary = run(dataclasses.replace(cfg, bag=str(bag)))
        seconds = time.perf_counter() - began
    figures = {
        **figures_of(summary),
        "duration_s": duration,
        "max_iters": iterations,
        "fit_and_check_s": round(seconds, 1),
        "twin_rate_hz": args.twin_rate,
        "twin_missed": stats.get("missed"),
        "link_missed": excitation["missed_periods"],
        "shield": excitation["shield"],
        "overrides": args.overrides,
    }
    emit("sysid", figures, args.save)


def _with_overrides(cfg, overrides: list[str]):
    """`cfg` with robotrl-sysid's Hydra overrides applied, checked against its schema."""
    if not overrides:
        return cfg
    from omegaconf import OmegaConf

    from robotrl.config import strict_object

    merged = OmegaConf.merge(OmegaConf.structured(cfg), OmegaConf.from_dotlist(overrides))
    return strict_object(type(cfg), merged)


if __name__ == "__main__":
    main()
