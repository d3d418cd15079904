"""`robotrl-export run=<run dir> format=onnx|pt2 [out=<dir>] [checkpoint=<name>]`: a run's policy as a bundle.

Writes a directory (default `<run>/bundles/<checkpoint>_<format>`) holding `policy.onnx` (raw observation entries
to the action in the task's bounds; `policy.pt2` with format=pt2, the same as a torch.export program), the run's
`deploy_spec.json` and `bundle.json` (hashes, inputs, output, source): robotrl/core/policy_bundle.py describes it
and loads it on a robot PC with onnxruntime alone (torch for pt2). The export checks the graph against the torch
policy before the bundle appears. Prints the manifest as one JSON line.

Bad input (a `run=` that is no run directory, an unknown format, an agent that cannot be exported, an `out=` that
exists, a checkpoint that is not there) is refused naming the value, before anything is written.
"""

from __future__ import annotations

import json
import logging
import sys

import hydra
from omegaconf import DictConfig

from robotrl.cli_errors import exits_on_error, reports_errors
from robotrl.config import ExportConfig, register_configs, strict_object
from robotrl.runtime.policy_export import export_bundle
from robotrl.runtime.run_config import run_config_file

log = logging.getLogger(__name__)
register_configs()


def run(cfg: ExportConfig) -> dict:
    cfg.validate()
    out, manifest = export_bundle(cfg.run, cfg.out, cfg.format, cfg.checkpoint)
    return {"bundle": str(out), **manifest}


@hydra.main(version_base="1.3", config_path="pkg://robotrl.configs", config_name="export")
@reports_errors("robotrl-export")
def _hydra_main(cfg: DictConfig) -> None:
    print(json.dumps(run(strict_object(ExportConfig, cfg))))


def _check_run_before_hydra(argv: list[str]) -> None:
    """Hydra's output directory is the run itself: a `run=` that is not a run directory fails here first, or
    Hydra would create the mistyped path; without one (Hydra's own options aside) Hydra would fail resolving it."""
    runs = [arg.partition("=")[2] for arg in argv[1:] if arg.partition("=")[0].lstrip("+") == "run"]
    if not runs and not any(arg.startswith("-") for arg in argv[1:]):  # --help, --cfg job, ... need none
        raise ValueError("give the run directory whose policy to export: run=<run dir>")
    for run in runs:
        run_config_file(run)


def main() -> None:
    with exits_on_error("robotrl-export"):
        _check_run_before_hydra(sys.argv)
    _hydra_main()


if __name__ == "__main__":
    main()
