"""The benches take agent and task settings as the Hydra overrides robotrl-train takes: positional ones for
every run, per-arm options for one arm's runs, a later override of a key winning over the bench's default, and
an unknown key failing, named, before any run starts."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        yield lambda name: importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


def test_one_override_per_key_the_last_winning(bench):
    common = bench("common")
    defaults = ["agent=sac", "agent.batch_size=64", "+agent.extra=1", "seed=1"]
    assert common.merge_overrides(defaults) == defaults  # no repeated key: unchanged
    given = ["agent.batch_size=32", "agent.extra=2", "her_ratio=0.8"]
    assert common.merge_overrides(defaults, given, ["agent.batch_size=16"]) == [
        "agent=sac",
        "seed=1",
        "agent.extra=2",
        "her_ratio=0.8",
        "agent.batch_size=16",
    ]
    assert common.override_key("~agent.obs_norm") == "agent.obs_norm"


def test_a_positional_argument_must_be_an_override(bench, capsys):
    common = bench("common")
    with pytest.raises(SystemExit):
        common.parse_args("x", overrides=True, argv=["chunk_len"])
    assert "not a Hydra override" in capsys.readouterr().err


def test_options_and_overrides_may_interleave(bench):
    common = bench("common")
    args = common.parse_args(
        "x", overrides=True, sides=("sac", "chunk"), argv=["a=1", "--quick", "b=2", "--chunk", "c=3"]
    )
    assert (args.overrides, args.sac, args.chunk, args.quick) == (["a=1", "b=2"], [], ["c=3"], True)


@pytest.fixture(scope="module")
def chunk_runs(bench, tmp_path_factory):
    """chunk_vs_sac --quick with a positional override and one per agent: its composed configs and overrides."""
    chunk_vs_sac = bench("chunk_vs_sac")
    workdir = tmp_path_factory.mktemp("chunk_vs_sac")
    argv = ["--quick", "agent.batch_size=32", "--chunk", "agent.chunk_len=3", "--sac", "agent.batch_size=16"]
    args = chunk_vs_sac.options(argv)
    configured = chunk_vs_sac.configure(args, args.tasks, workdir)
    overrides = {
        agent: chunk_vs_sac.run_overrides(agent, "panda_reach", 1, args, workdir, configured["panda_reach", agent][0])
        for agent in chunk_vs_sac.AGENTS
    }
    return configured, overrides


def test_a_chunk_override_reaches_the_chunk_runs_only(chunk_runs):
    configured, overrides = chunk_runs
    chunk, sac = configured["panda_reach", "chunk"][1], configured["panda_reach", "sac"][1]
    assert chunk.agent.chunk_len == 3 and "agent.chunk_len=3" in overrides["chunk"]
    assert not hasattr(sac.agent, "chunk_len") and not any("chunk_len" in o for o in overrides["sac"])


def test_given_overrides_win_over_the_bench_defaults(chunk_runs):
    configured, overrides = chunk_runs
    chunk, sac = configured["panda_reach", "chunk"][1], configured["panda_reach", "sac"][1]
    # --quick's small networks set agent.batch_size=64; the positional override wins, --sac's over that
    assert chunk.agent.batch_size == 32 and sac.agent.batch_size == 16
    assert [o for o in overrides["sac"] if o.startswith("agent.batch_size=")] == ["agent.batch_size=16"]
    assert chunk.log_interval == chunk.eval_interval == 500  # the bench's interpolated default, resolved


def test_the_target_entropy_follows_the_composed_plan_length(chunk_runs):
    configured, _ = chunk_runs
    (sac_entropy, sac), (chunk_entropy, chunk) = configured["panda_reach", "sac"], configured["panda_reach", "chunk"]
    assert chunk_entropy == 3 * sac_entropy  # -1 per entry: a plan of chunk_len 3 actions
    assert (chunk.agent.target_entropy, sac.agent.target_entropy) == (chunk_entropy, sac_entropy)


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--quick", "agent.no_such_key=1"], "agent.no_such_key"),
        (["--quick", "--chunk", "agent.no_such_key=1"], "agent.no_such_key"),
        (["--quick", "agent.chunk_len=3"], "--chunk"),  # a chunk-only key given to both agents: the hint says where
        (["--quick", "--sac", "agent=chunk"], "agent=chunk"),  # the arms' agents are the bench's own
        (["--quick", "seed=4"], "--seeds"),
    ],
)
def test_a_bad_override_fails_naming_it_before_any_run(bench, tmp_path, monkeypatch, argv, named):
    chunk_vs_sac = bench("chunk_vs_sac")
    monkeypatch.setattr(chunk_vs_sac, "run_logged", lambda *a, **k: pytest.fail("a run started"))
    monkeypatch.setattr(sys, "argv", ["chunk_vs_sac.py", *argv, "--workdir", str(tmp_path)])
    with pytest.raises(SystemExit, match=re.escape(named)):
        chunk_vs_sac.main()


def _never(*args, **kwargs):
    raise AssertionError("a run started")


@pytest.mark.parametrize(
    "name, argv, named, starts",
    [
        ("sac_returns", ["agent.no_such_key=1"], "agent.no_such_key", ["run_logged"]),
        ("sac_returns", ["task.env_id=Hopper-v5"], "--envs", ["run_logged"]),
        ("gsde_smoothness", ["--gsde", "agent.no_such_key=1"], "agent.no_such_key", ["ProcessPoolExecutor"]),
        ("gsde_smoothness", ["agent.exploration=gsde"], "what the arms compare", ["ProcessPoolExecutor"]),
        ("hil_pick", ["--hil", "agent.no_such_key=1"], "agent.no_such_key", ["record_scripted_demos", "start_run"]),
        ("hil_pick", ["--no-hil", "hil.no_such_key=1"], "hil.no_such_key", ["record_scripted_demos", "start_run"]),
        ("her_fetch", ["agent.no_such_key=1"], "agent.no_such_key", ["run_logged"]),
        ("her_fetch", ["task.env_id=FetchSlide-v4"], "the bench's two tasks", ["run_logged"]),
    ],
)
def test_the_other_benches_fail_on_a_bad_override_before_any_run(bench, monkeypatch, name, argv, named, starts):
    module = bench(name)
    for start in starts:
        monkeypatch.setattr(module, start, _never)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--quick", *argv])
    with pytest.raises(SystemExit, match=re.escape(named)):
        module.main()


def test_sac_returns_adds_the_overrides_to_the_locomotion_settings(bench):
    sac_returns, common = bench("sac_returns"), bench("common")
    given = common.merge_overrides(common.LOCOMOTION, ["agent.init_alpha=0.1", "learning_starts=50"])
    run = sac_returns.run_overrides("Pendulum-v1", 3_000, 1, given)
    assert "agent.init_alpha=0.1" in run and "agent.init_alpha=1.0" not in run
    assert [o for o in run if o.startswith("learning_starts=")] == ["learning_starts=50"]
    assert "agent.log_std_min=-20" in run


def test_her_fetch_gives_both_libraries_the_zoo_settings_and_robotrl_the_overrides_after_them(bench):
    her_fetch = bench("her_fetch")
    run = her_fetch.run_overrides("FetchReach-v4", 2_000, 1, 500, ["agent.gamma=0.98"])
    assert "agent.gamma=0.98" in run and "agent.gamma=0.95" not in run
    assert {"her_ratio=0.8", "agent.obs_norm=true", "eval_episodes=20", "eval_interval=500"} <= set(run)
    assert her_fetch.steps_to([(500, 0.2), (1000, 0.95), (1500, 1.0)], 0.9, 2_000, 500) == 1000
    assert her_fetch.steps_to([(500, 0.2)], 0.9, 2_000, 500) == 2_500  # never reached: budget plus an interval


def test_gsde_runs_take_the_given_overrides_and_keep_their_arms_exploration(bench):
    gsde = bench("gsde_smoothness")
    run = gsde.run_overrides("panda_reach", "gaussian", 1_600, 1, True, ["agent.smoothness_weight=1"])
    assert "agent.smoothness_weight=1" in run and run[-3:] == [
        "agent.exploration=gaussian",
        "seed=1",
        "total_steps=1600",
    ]
