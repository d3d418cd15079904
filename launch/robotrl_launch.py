"""Shared by the launch files here: robotrl's entry points are Hydra programs installed by pip (not ament
packages), so a launch file starts them as processes and turns a parameter file into Hydra overrides.

A parameter file is plain YAML whose keys are the entry point's config keys (nested or dotted):

    hardware: sim_twin
    episodes: 5
    shield: {control_hz: 500}

becomes `hardware=sim_twin episodes=5 shield.control_hz=500`. A key written `"+goal"` adds entries to a
mapping the config leaves open (`+goal.target=[...]`), as `+` does on Hydra's command line.
tests/test_launch.py composes every parameter file against its entry point's config, so a key the
program does not accept fails there.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

PARAMS = Path(__file__).resolve().parent / "params"

# Top-level keys that pick a Hydra config group (written `group=option`, not merged as values).
CONFIG_GROUPS = ("agent", "task", "hardware")


def hydra_overrides(params_file: str | os.PathLike) -> list[str]:
    """`key=value` overrides for every leaf of the YAML mapping in `params_file`."""
    path = Path(params_file)
    if not path.is_absolute():
        path = PARAMS / path
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a parameter file holds a mapping of config keys, got {type(data).__name__}")
    return _flatten(data, prefix="")


def _flatten(node: dict, prefix: str) -> list[str]:
    out = []
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and not (prefix == "" and key in CONFIG_GROUPS):
            out += _flatten(value, f"{name}.")
        else:
            out.append(f"{name}={_hydra_value(value)}")
    return out


def _hydra_value(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    return str(value)


def robotrl_process(executable: str, params_file: str, *overrides, name: str | None = None, condition=None):
    """An ExecuteProcess running one robotrl entry point with the parameter file's overrides, then
    `overrides` (strings or launch substitutions, e.g. `["run=", LaunchConfiguration("run")]`)."""
    from launch.actions import ExecuteProcess

    cmd = [executable, *hydra_overrides(params_file)]
    for override in overrides:
        cmd.append(override)
    return ExecuteProcess(cmd=cmd, name=name or executable, output="screen", condition=condition)
