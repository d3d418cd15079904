"""bench/chunk_vs_sac.py --workdir: a kept run is read again only where it is a finished run of the same
overrides and the same code; anything else is run anew."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def chunk_vs_sac():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("chunk_vs_sac")
    finally:
        sys.path.remove(str(BENCH))


def kept_run(stamp_name: str, run_dir: Path, overrides: list[str], code: str | None, finished=True) -> Path:
    """A run directory as a bench run leaves it: Hydra's overrides, the code stamp, summary.json once finished."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if code is not None:
        (run_dir / stamp_name).write_text(code + "\n")
    if finished:
        (run_dir / "summary.json").write_text('{"eval/wall_s": 1.0}')
    return run_dir


OVERRIDES = ["task=panda_push", "agent=chunk", "log_interval=${eval_interval}", "seed=1", "total_steps=30000"]


def test_a_finished_run_of_the_same_overrides_and_code_is_read_again(chunk_vs_sac, tmp_path):
    code = chunk_vs_sac.source_digest()
    assert chunk_vs_sac.finished_run(
        kept_run(chunk_vs_sac.CODE_STAMP, tmp_path / "run", OVERRIDES, code), OVERRIDES, code
    )


@pytest.mark.parametrize(
    "why", ["other code", "no code stamp (kept before stamps)", "unfinished", "other overrides", "overrides reordered"]
)
def test_any_other_kept_run_is_run_anew(chunk_vs_sac, tmp_path, why):
    code = chunk_vs_sac.source_digest()
    recorded, stamp, finished = OVERRIDES, code, True
    if why == "other code":
        stamp = "0" * 64
    elif why.startswith("no code stamp"):
        stamp = None
    elif why == "unfinished":
        finished = False
    elif why == "other overrides":
        recorded = [*OVERRIDES[:-1], "total_steps=20000"]
    else:
        recorded = OVERRIDES[::-1]
    run_dir = kept_run(chunk_vs_sac.CODE_STAMP, tmp_path / "run", recorded, stamp, finished)
    assert not chunk_vs_sac.finished_run(run_dir, OVERRIDES, code)


def test_the_code_digest_follows_the_contents_of_what_a_run_executes(chunk_vs_sac, tmp_path, monkeypatch):
    import common

    for top in common.RUN_SOURCES:
        (tmp_path / top).mkdir()
        (tmp_path / top / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(common, "REPO", tmp_path)
    before = common.source_digest()
    (tmp_path / "tasks" / "__pycache__").mkdir()
    (tmp_path / "tasks" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "README.md").write_text("not run\n")
    assert common.source_digest() == before  # caches and files outside the run's sources do not count
    (tmp_path / "configs" / "a.py").write_text("x = 2\n")
    assert common.source_digest() != before
    (tmp_path / "configs" / "a.py").write_text("x = 1\n")
    assert common.source_digest() == before
    (tmp_path / "robotrl" / "a.py").rename(tmp_path / "robotrl" / "b.py")
    assert common.source_digest() != before  # a moved file is other code


def test_kept_demonstrations_are_recorded_again_when_the_code_changed(chunk_vs_sac, tmp_path):
    """Demonstrations come from the task's scripted expert: ones a changed expert recorded are not reused."""
    path = chunk_vs_sac.demos_dir(tmp_path, "panda_reach", 1)
    chunk_vs_sac.ensure_demos(tmp_path, "panda_reach", 1, 2)
    stamp = path / chunk_vs_sac.CODE_STAMP
    assert stamp.read_text().strip() == chunk_vs_sac.source_digest()
    marker = path / "marker"
    marker.write_text("kept\n")
    chunk_vs_sac.ensure_demos(tmp_path, "panda_reach", 1, 2)
    assert marker.exists()  # the same code: read again
    stamp.write_text("0" * 64 + "\n")
    chunk_vs_sac.ensure_demos(tmp_path, "panda_reach", 1, 2)
    assert not marker.exists()  # other code: recorded anew
    assert stamp.read_text().strip() == chunk_vs_sac.source_digest()
    stamp.unlink()  # kept before demonstrations were stamped
    marker.write_text("kept\n")
    chunk_vs_sac.ensure_demos(tmp_path, "panda_reach", 1, 2)
    assert not marker.exists() and stamp.exists()


def test_sustained_success_needs_the_threshold_held_over_five_evaluations(chunk_vs_sac):
    noisy = {1000: 0.0, 2000: 0.85, 3000: 0.6, 4000: 0.7, 5000: 0.8, 6000: 0.9, 7000: 0.85, 8000: 0.8, 9000: 0.9}
    assert chunk_vs_sac.steps_to_success([noisy], 0.8) == 2000  # a single lucky evaluation
    assert chunk_vs_sac.steps_to_sustained_success([noisy], 0.8) == 8000  # 4k-8k average 0.81: the first five to
    # the mean over seeds is what is averaged: one seed at 1.0 and one at 0.6 hold 0.8 together
    steady = [{s: 1.0 for s in range(1000, 6000, 1000)}, {s: 0.6 for s in range(1000, 6000, 1000)}]
    assert chunk_vs_sac.steps_to_sustained_success(steady, 0.8) == 5000
    assert chunk_vs_sac.steps_to_sustained_success([{1000: 1.0, 2000: 1.0}], 0.8) is None  # under five evaluations


def test_a_kept_run_matches_the_overrides_the_bench_starts_it_with(chunk_vs_sac, tmp_path):
    """The overrides a run is started with, as Hydra records them, are those the bench compares a kept run
    against: the same options and overrides find it again, another --chunk override does not."""
    args = chunk_vs_sac.options(["--quick", "--workdir", str(tmp_path), "--chunk", "agent.chunk_len=3"])
    overrides = chunk_vs_sac.run_overrides("chunk", "panda_reach", 1, args, tmp_path, -9.0)
    code = chunk_vs_sac.source_digest()
    run_dir = kept_run(chunk_vs_sac.CODE_STAMP, tmp_path / "run", overrides, code)
    assert chunk_vs_sac.finished_run(
        run_dir, chunk_vs_sac.run_overrides("chunk", "panda_reach", 1, args, tmp_path, -9.0), code
    )
    other = chunk_vs_sac.options(["--quick", "--chunk", "agent.chunk_len=2"])
    assert not chunk_vs_sac.finished_run(
        run_dir, chunk_vs_sac.run_overrides("chunk", "panda_reach", 1, other, tmp_path, -9.0), code
    )
