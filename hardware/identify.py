"""`robotrl-sysid`: identify a robot's joint dynamics and command latency, and write the overlay that the tasks,
the twin and the randomization centre on (docs/sim2real.md).

    robotrl-sim-twin robot=panda &                         # or a real robot's driver, its e-stop in reach
    robotrl-sysid hardware=sim_twin out=sysid/panda_1      # excite through the shield, record, fit
    robotrl-sysid bag=sysid/panda_1/excitation out=sysid/panda_1_refit   # fit a bag recorded before

With no `bag`, the arm goes home through the shield, then every joint follows a multi-sine around home for
`duration` s (`amplitude` bounds it; hardware/sysid_session.py) while joint states and the commands sent are
recorded to `<out>/excitation` (rosbag2, MCAP). With `bag`, that bag (a robotrl-sysid recording, or a
`robotrl-deploy record=` session) is read instead. The first `1 - holdout` of the recording is fitted on
mujoco.sysid (sim2real/sysid.py) within the bounds of `priors` (configs/sysid_priors/<name>.yaml:
every joint's armature, damping and dry friction, every position actuator's stiffness, the command latency); the
held-out rest is simulated open loop from rest by the nominal and the fitted model to compare their tracking
errors. Written: `<out>/overlay.yaml` (every value the data constrains; those it does not pin down alone are
listed, and those it cannot show at all stay at nominal) and `<out>/sysid.json` (values, 95% intervals, verdicts,
errors); the summary is printed as one JSON line.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
import mujoco
import numpy as np
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig
from robotrl.hardware.robot_env_config import RobotEnvConfig
from robotrl.hardware.sysid_session import read_recording, record_excitation, robot_actuators
from robotrl.sim2real.sysid import Recording, check_targets, fit, import_sysid, load_priors, overlay_of, simulate

from robotrl.cli_errors import reports_errors
from robotrl.config import strict_object
from robotrl.core.robot_spec import load_robot_spec

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parent.parent / "tasks" / "assets"
MAX_AMPLITUDE = 0.5  # rad: the sines' amplitudes added up; the excitation swings up to twice this around home


@dataclass
class SysidConfig:
    hardware: RobotEnvConfig = field(default_factory=RobotEnvConfig)
    out: str = "sysid"  # the directory to write (created; refused if it holds an overlay already)
    bag: str | None = None  # fit this rosbag2 bag instead of exciting the robot
    duration: float = 30.0  # s of excitation
    amplitude: float = 0.2  # rad per joint, the sines' amplitudes added up (the motion swings up to twice this)
    seed: int = 0  # the excitation's frequencies and phases
    priors: str = "panda"  # configs/sysid_priors/<name>.yaml or a path: the parameters fitted and bounds
    # the last share of the recording kept out of the fit, on which the fitted model's tracking error is measured
    holdout: float = 0.25
    max_iters: int = 30  # Gauss-Newton iterations at most

    def validate(self) -> None:
        if not (math.isfinite(self.duration) and self.duration >= 2.0):
            raise ValueError(f"duration must be at least 2 s of excitation, got {self.duration!r}")
        if not (math.isfinite(self.amplitude) and 0 < self.amplitude <= MAX_AMPLITUDE):
            raise ValueError(f"amplitude must be in (0, {MAX_AMPLITUDE}] rad, got {self.amplitude!r}")
        if not (math.isfinite(self.holdout) and 0 <= self.holdout <= 0.5):
            raise ValueError(f"holdout must be a share in [0, 0.5], got {self.holdout!r}")
        if self.max_iters < 1:
            raise ValueError(f"max_iters must be >= 1, got {self.max_iters}")
        if (Path(self.out) / "overlay.yaml").exists():
            raise FileExistsError(f"out={self.out!r} holds an overlay already; give a new directory")


def robot_model_file(hw: RobotEnvConfig) -> Path:
    return Path(hw.model) if hw.model else ASSETS / f"{hw.robot}.xml"


def tracking_error(spec: mujoco.MjSpec, recording: Recording, latency: float, since: int) -> float:
    """RMS joint-position error (rad) from step `since` on of `spec`'s model run open loop on the recording's
    commands, `latency` s late."""
    model = spec.compile()
    steps = round(latency / model.opt.timestep)
    simulated = simulate(model, recording.times, recording.commands, recording.initial_qpos, recording.joints, steps)
    return float(np.sqrt(np.mean((simulated.qpos[since:] - recording.qpos[since:]) ** 2)))


def run(cfg: SysidConfig) -> dict[str, Any]:
    cfg.validate()
    if cfg.bag is not None and not Path(cfg.bag).exists():
        raise FileNotFoundError(f"bag={cfg.bag!r} does not exist")
    robot, unknowns = load_priors(cfg.priors)
    if robot and robot != cfg.hardware.robot:
        raise ValueError(f"priors={cfg.priors!r} bound a {robot}; the hardware is a {cfg.hardware.robot}")
    model_file = robot_model_file(cfg.hardware)
    model = mujoco.MjModel.from_xml_path(str(model_file))
    joints = list(load_robot_spec(cfg.hardware.robot).joints)
    # everything the fit needs is checked before anything moves: the extra, every joint driven, every bound
    # parameter's joint or actuator in the model, a new place for the recording
    import_sysid()
    robot_actuators(model, joints)
    check_targets(model, unknowns)
    out = Path(cfg.out)
    if cfg.bag is None and (out / "excitation").exists():
        raise FileExistsError(f"out={cfg.out!r} holds a recording already ({out / 'excitation'}); give a new directory")
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"out": str(out), "model": str(model_file)}
    bag = Path(cfg.bag) if cfg.bag else out / "excitation"
    if cfg.bag is None:
        summary["excitation"] = record_excitation(cfg.hardware, model, bag, cfg.duration, cfg.amplitude, cfg.seed)
        commands_topic = summary["excitation"]["commands_topic"]
    else:
        commands_topic = f"/{cfg.hardware.controller}/commands"
    recording = read_recording(bag, model, joints, cfg.hardware.joint_states_topic, commands_topic)
    cut = round(len(recording.times) * (1 - cfg.holdout))
    fitted_part = Recording(
        recording.times[:cut], recording.commands[:cut], recording.qpos[:cut], recording.joints, recording.initial_qpos
    )
    result = fit(mujoco.MjSpec.from_file(str(model_file)), fitted_part, unknowns, cfg.max_iters)
    overlay = overlay_of(result, cfg.hardware.robot)
    overlay.save(out / "overlay.yaml")
    summary.update(
        values=result.values,
        nominal=result.nominal,
        half_width_95=result.half_width,
        not_identified=overlay.not_identified,
        rms_residual=result.rms_residual,
        fit_s=round(result.seconds, 1),
        recording_s=round(float(recording.times[-1]), 2),
    )
    if cfg.holdout > 0:
        fitted_spec = mujoco.MjSpec.from_file(str(model_file))
        overlay.apply_to_spec(fitted_spec)
        nominal = tracking_error(mujoco.MjSpec.from_file(str(model_file)), recording, 0.0, cut)
        identified = tracking_error(fitted_spec, recording, overlay.command_latency, cut)
        summary.update(
            heldout_rms_nominal=nominal,
            heldout_rms_fitted=identified,
            heldout_error_ratio=round(nominal / max(identified, 1e-12), 2),
        )
    (out / "sysid.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def register_config() -> None:
    ConfigStore.instance().store(name="sysid_schema", node=SysidConfig)


def main() -> None:
    register_config()

    @hydra.main(version_base="1.3", config_path="pkg://robotrl.configs", config_name="sysid")
    @reports_errors("robotrl-sysid")
    def _hydra_main(cfg: DictConfig) -> None:
        began = time.perf_counter()
        summary = run(strict_object(SysidConfig, cfg))
        summary["seconds"] = round(time.perf_counter() - began, 1)
        print(json.dumps({"sysid": summary}), flush=True)

    _hydra_main()


if __name__ == "__main__":
    sys.exit(main())
