"""Every command in README.md and docs/*.md is checked, so none goes stale.

Commands are the lines of fenced code blocks labelled bash, sh, shell or console, and of unlabelled blocks whose
first line starts like a command (`.venv/bin/...`, `robotrl-...`, `make ...`, `python bench/...`), continuation
lines joined and comments dropped; in README.md also its inline code spans that start so (the recipes). Each one is
classified, and a command that fits no class fails `test_every_command_is_checked`, naming it: a command added to
the docs needs a way to be checked here.

- The cheapest representative ones are run, shortened (few env steps, one evaluation episode, a run directory in
  a temporary folder): the main job (`make train`, run as the robotrl-train it invokes), an evaluation of that
  run, and a gymnasium-robotics env with hindsight relabelling. The main job's run directory must hold every file
  the README's table names.
- The other robotrl programs (hardware, SLURM jobs, long trainings) are composed against their real config schema
  in process, as each program converts and validates its config before it starts: an unknown key, a wrong type or
  a bad value fails naming the key. A sweep (`-m`) is composed for each of its values; a sweep without `-m` fails.
- `make` targets must exist, and what `make -n` says they run is checked in turn; `python bench/<name>.py` must
  exist and take the flags it is given; `pip install` may name only extras pyproject.toml defines; a ROS 2 launch
  file must exist and declare the arguments given; `sbatch --wrap` is checked by the command it wraps; a few
  external tools (mkdir, openssl, squeue, ...) are only recognised, and `python -c` snippets must compile.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import run_module

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOC_FILES = [README, *sorted((REPO / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent  # the venv running the tests: .venv/bin in the docs

SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
COMMAND_START = re.compile(r"^(\$ )?(\.venv/bin/|robotrl-|make |python bench/|python -m robotrl|pip install )")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
# placeholders the docs use for a path the reader supplies; composed as a path
PLACEHOLDERS = ("<run dir>", "<push run>", "<dir>")
PLACEHOLDER_PATH = "runs/2026-01-01/00-00-00_panda_reach_sac_s1"
# programs that are not robotrl's, recognised but not run
EXTERNAL_TOOLS = {"mkdir", "chmod", "openssl", "squeue", "scancel", "tmux", "wandb"}

SCRIPTS = {
    ep.name: ep.value.split(":")[0]
    for ep in importlib.metadata.distribution("robotrl").entry_points
    if ep.group == "console_scripts"
}
MODULE_SCRIPTS = {module: name for name, module in SCRIPTS.items()}


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    text: str  # as the docs give it, continuation lines joined, comments dropped

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


# ---- extraction ---------------------------------------------------------------------------------------------


def _logical_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Lines joined over trailing backslashes; the number of each one's first line."""
    joined, start, parts = [], None, []
    for number, line in lines:
        if start is None:
            start = number
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        parts.append(line)
        joined.append((start, " ".join(part.strip() for part in parts)))
        start, parts = None, []
    if parts:
        joined.append((start, " ".join(part.strip() for part in parts)))
    return joined


def _without_comment(line: str) -> str:
    """The line without a trailing shell comment: a # that starts a word, outside quotes."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].strip()
    return line.strip()


def commands_in(path: Path) -> list[Command]:
    name = path.relative_to(REPO).as_posix()
    lines = path.read_text().splitlines()
    commands: list[Command] = []
    prose: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        language, body = opened.group(2).lower(), []
        i += 1
        while i < len(lines) and not FENCE.match(lines[i]):
            body.append((i + 1, lines[i]))
            i += 1
        i += 1  # the closing fence
        first = next((line.strip() for _, line in body if line.strip()), "")
        if language in SHELL_LANGUAGES or (language == "" and COMMAND_START.match(first)):
            if language == "console":  # commands after a "$ " prompt; the other lines are their output
                body = [(number, line.strip()[2:]) for number, line in body if line.strip().startswith("$ ")]
            for number, line in _logical_lines(body):
                text = _without_comment(line.strip())
                if text:
                    commands.append(Command(f"{name}:{number}", text))
    if path == README:
        for number, line in prose:
            for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", line):
                if COMMAND_START.match(span):
                    commands.append(Command(f"{name}:{number}", span.strip()))
    return commands


ALL_COMMANDS = [command for path in DOC_FILES for command in commands_in(path)]


# ---- classification and checks -----------------------------------------------------------------------------


class Unclassified(Exception):
    """A command this test has no way to check."""


def _argv(text: str) -> list[str]:
    for placeholder in PLACEHOLDERS:
        text = text.replace(placeholder, PLACEHOLDER_PATH)
    if re.search(r"<[a-z][^>]*>", text):
        raise Unclassified(f"a placeholder this test does not know: {re.search(r'<[a-z][^>]*>', text).group()}")
    text = os.path.expandvars(text)
    return shlex.split(text, posix=True)


def _split_pipeline(argv: list[str]) -> list[list[str]]:
    """Commands joined by &&, ;, | or & (in the background); redirections dropped."""
    parts, current, skip = [], [], False
    for token in argv:
        if skip:
            skip = False
            continue
        if token in ("&&", ";", "|", "&", "||"):
            parts.append(current)
            current = []
        elif token in (">", ">>", "<", "2>"):
            skip = True
        else:
            current.append(token)
    parts.append(current)
    return [part for part in parts if part]


def _program(argv: list[str]) -> tuple[str, list[str]] | None:
    """(console script, its arguments) for `robotrl-x ...`, `.venv/bin/robotrl-x ...`, `python -m robotrl.x ...`."""
    head = argv[0]
    name = head.split("/")[-1] if head.startswith(".venv/bin/") else head
    if name in SCRIPTS:
        return name, argv[1:]
    if Path(name).name in ("python", "python3") and argv[1:2] == ["-m"] and argv[2] in MODULE_SCRIPTS:
        return MODULE_SCRIPTS[argv[2]], argv[3:]
    return None


def check(command: Command) -> str:
    """Checks the command; returns how ("compose", "make:compose", "bench", ...). Raises Unclassified for a command
    this test has no check for, and the check's own error where the command is wrong."""
    kinds = [check_argv(argv) for argv in _split_pipeline(_argv(command.text))]
    return "+".join(kinds)


def check_argv(argv: list[str]) -> str:
    program = _program(argv)
    if program is not None:
        compose_check(*program)
        return "compose"
    head = argv[0].split("/")[-1] if argv[0].startswith(".venv/bin/") else argv[0]
    if head == "make":
        return check_make(argv[1:])
    if head in ("python", "python3") and len(argv) > 1 and argv[1].startswith("bench/"):
        check_bench(argv[1], argv[2:])
        return "bench"
    if head in ("python", "python3") and argv[1:2] == ["-c"]:
        compile(argv[2], "<python -c>", "exec")
        return "external"
    if head in ("python", "python3") and argv[1:3] == ["-m", "pytest"]:
        return "external"
    if head == "pip" and argv[1:2] == ["install"]:
        check_pip(argv[2:])
        return "pip"
    if head == "ros2" and argv[1:2] == ["launch"]:
        check_launch(argv[2], argv[3:])
        return "launch"
    if head == "sbatch":
        wrapped = [a.split("=", 1)[1] for a in argv if a.startswith("--wrap=")]
        wrapped += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--wrap"]
        if not wrapped:
            raise Unclassified("sbatch without --wrap: nothing to check")
        return "sbatch:" + "+".join(check_argv(inner) for w in wrapped for inner in _split_pipeline(shlex.split(w)))
    if head in EXTERNAL_TOOLS:
        return "external"
    raise Unclassified(f"no check for a command starting {argv[0]!r}")


# -- robotrl programs: compose against the schema, convert and validate as the program does


def _to_train(cfg):
    from robotrl.config import to_train_config

    return to_train_config(cfg)


def _strict(schema_of):
    def convert(cfg):
        from robotrl.config import strict_object

        config = strict_object(schema_of(cfg), cfg)
        if hasattr(config, "validate"):
            config.validate()
        return config

    return convert


def _to_record(cfg):
    from robotrl.record import to_record_config

    return to_record_config(cfg)


def _schema(module: str, name: str):
    return lambda cfg: getattr(importlib.import_module(module), name)


def _to_actor(cfg):
    from robotrl.actor import to_actor_config

    return to_actor_config(cfg)


def _to_learner(cfg):
    from robotrl.runtime.learner_config import to_learner_config

    config = to_learner_config(cfg)
    config.validate()
    return config


# console script -> (its module, config name, the conversion its entry point applies)
PROGRAMS = {
    "robotrl-train": ("robotrl.train", "config", _to_train),
    "robotrl-eval": ("robotrl.eval", "eval", _strict(_schema("robotrl.config", "EvalConfig"))),
    "robotrl-record": ("robotrl.record", "record", _to_record),
    "robotrl-train-classifier": (
        "robotrl.train_classifier",
        "train_classifier",
        _strict(_schema("robotrl.train_classifier", "TrainClassifierConfig")),
    ),
    "robotrl-actor": ("robotrl.actor", "actor", _to_actor),
    "robotrl-learner": ("robotrl.learner", "learner", _to_learner),
    "robotrl-sim-twin": (
        "robotrl.hardware.sim_twin",
        "sim_twin",
        _strict(_schema("robotrl.hardware.sim_twin", "SimTwinConfig")),
    ),
    "robotrl-deploy": (
        "robotrl.hardware.deploy",
        "deploy",
        _strict(_schema("robotrl.hardware.deploy", "DeployConfig")),
    ),
    "robotrl-export": ("robotrl.export", "export", _strict(_schema("robotrl.config", "ExportConfig"))),
    "robotrl-sysid": (
        "robotrl.hardware.identify",
        "sysid",
        _strict(_schema("robotrl.hardware.identify", "SysidConfig")),
    ),
    "robotrl-bag-to-dataset": (
        "robotrl.hardware.bag_dataset",
        "bag_to_dataset",
        _strict(_schema("robotrl.hardware.bag_dataset", "BagToDatasetConfig")),
    ),
}


def _sweeps(overrides: list[str]) -> list[list[str]]:
    """The override lists a multirun composes: each swept value once, the other keys at their first value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    swept = {i: list(o.sweep_string_iterator()) for i, o in enumerate(parsed) if o.is_sweep_override()}
    if not swept:
        return [overrides]

    def with_value(index: int, value: str) -> list[str]:
        out = []
        for i, (text, o) in enumerate(zip(overrides, parsed, strict=True)):
            if i in swept:
                chosen = value if i == index else swept[i][0]
                out.append(f"{o.get_key_element()}={chosen}")
            else:
                out.append(text)
        return out

    return [with_value(i, value) for i, values in swept.items() for value in values]


def compose_check(script: str, args: list[str]) -> None:
    from hydra import compose, initialize_config_module
    from hydra.core.override_parser.overrides_parser import OverridesParser

    assert script in PROGRAMS, f"{script}: a console script test_docs.py does not know how to compose"
    module_name, config_name, convert = PROGRAMS[script]
    multirun = any(a in ("-m", "--multirun") for a in args)
    overrides = [a for a in args if a not in ("-m", "--multirun")]
    flags = [a for a in overrides if a.startswith("-")]
    assert not flags, f"{script}: options this test does not check: {flags}"
    parsed = OverridesParser.create().parse_overrides(overrides)
    if not multirun:
        assert not any(o.is_sweep_override() for o in parsed), f"{script}: a sweep of values needs -m"
    module = importlib.import_module(module_name)
    if hasattr(module, "register_config"):  # programs that register their schema in main
        module.register_config()
    for run in _sweeps(overrides):
        with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=run)  # hydra.* overrides too, then dropped
        convert(cfg)


# -- make, benches, pip, launch files


def check_make(args: list[str]) -> str:
    targets = [a for a in args if "=" not in a and not a.startswith("-")]
    assert len(targets) == 1, f"make {' '.join(args)}: one target expected"
    result = subprocess.run(
        ["make", "-n", "--no-print-directory", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        check=False,
    )
    assert result.returncode == 0, f"make -n {' '.join(args)}: {result.stderr.strip()}"
    recipe = result.stdout.strip().splitlines()[-1]  # the target's own recipe comes last
    if "pytest" in recipe:
        return "make"  # make test runs the test suite itself: only its existence is checked here
    inner = _split_pipeline(shlex.split(recipe))
    return "make:" + "+".join(check_argv(argv) for argv in inner)


class _Parsed(Exception):
    def __init__(self, namespace):
        self.namespace = namespace


def check_bench(script: str, args: list[str]) -> None:
    path = REPO / script
    assert path.is_file(), f"{script} does not exist"
    sys.path.insert(0, str(path.parent))
    saved_argv = sys.argv
    originals = {name: getattr(argparse.ArgumentParser, name) for name in ("parse_args", "parse_intermixed_args")}

    def stopping(name):
        def parse(self, *a, **k):
            raise _Parsed(originals[name](self, *a, **k))

        return parse

    try:
        module = importlib.import_module(path.stem)
        for name in originals:
            setattr(argparse.ArgumentParser, name, stopping(name))
        sys.argv = [script, *args]
        try:
            module.main()
        except _Parsed as parsed:
            namespace = parsed.namespace
        except SystemExit as e:
            raise AssertionError(f"{script} {' '.join(args)}: its options do not parse ({e})") from None
        else:
            raise AssertionError(f"{script}: main() returned without parsing its options")
    finally:
        for name, original in originals.items():
            setattr(argparse.ArgumentParser, name, original)
        sys.argv = saved_argv
        sys.path.remove(str(path.parent))
    overrides = list(getattr(namespace, "overrides", None) or [])
    if overrides:
        from hydra import compose, initialize_config_module

        from robotrl.config import register_configs, to_train_config

        register_configs()
        with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
            to_train_config(compose(config_name="config", overrides=overrides))


def _extras() -> set[str]:
    """The extras pyproject.toml defines (the installed metadata's where Python has no tomllib)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return set(importlib.metadata.metadata("robotrl").get_all("Provides-Extra") or [])
    return set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def check_pip(args: list[str]) -> None:
    extras = _extras()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-c":
            assert (REPO / args[i + 1]).is_file(), f"pip install -c {args[i + 1]}: no such file"
            i += 2
            continue
        if arg == "-e":
            i += 1
            continue
        match = re.fullmatch(r"(\.|robotrl)(\[([\w,-]+)\])?", arg)
        assert match, f"pip install {arg}: not robotrl (. or robotrl[extras])"
        named = set((match.group(3) or "").split(",")) - {""}
        assert named <= extras, f"pip install {arg}: no extra {sorted(named - extras)} in pyproject.toml"
        i += 1


def check_launch(file: str, args: list[str]) -> None:
    path = REPO / file
    assert path.is_file(), f"{file} does not exist"
    source = path.read_text()
    for arg in args:
        name, sep, _ = arg.partition(":=")
        assert sep, f"{file} {arg}: launch arguments are name:=value"
        assert re.search(rf"""DeclareLaunchArgument\(\s*["']{re.escape(name)}["']""", source), (
            f"{file} declares no launch argument {name!r}"
        )


# ---- the tests ------------------------------------------------------------------------------------------------


def test_the_docs_have_commands():
    assert len(ALL_COMMANDS) > 20, [str(c) for c in ALL_COMMANDS]
    assert any(c.text == "make train" for c in ALL_COMMANDS if c.where.startswith("README.md"))


def test_every_command_is_checked():
    """Every command is classified and passes its check; the failures are listed together."""
    failures = []
    for command in ALL_COMMANDS:
        try:
            check(command)
        except Unclassified as e:
            failures.append(f"{command}\n    cannot be checked: {e}")
        except Exception as e:  # every failing command is listed, not only the first
            failures.append(f"{command}\n    {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}")
    assert not failures, "commands in the docs that fail their check:\n" + "\n".join(failures)


# -- the commands that are run, shortened

SHORT = [
    "total_steps=200",
    "learning_starts=100",
    "eval_interval=200",
    "eval_episodes=1",
    "checkpoint_interval=200",
    "log_interval=100",
    "replay_capacity=10000",
    "progress=false",
    "threads=1",
]
MAIN_JOB = "make train"
EVALUATION = ".venv/bin/robotrl-eval run=<run dir> episodes=20"
GYM_RECIPE = ".venv/bin/robotrl-train task=gym task.env_id=FetchReach-v4 her_ratio=0.8"


def _env() -> dict[str, str]:
    # headless rendering as conftest.py sets it: robotrl-train's own default comes after tasks/memory.py has
    # imported mujoco, and without it the main job's evaluation video is skipped on a machine without a display
    env = dict(os.environ, MUJOCO_GL="egl", OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="1")
    # what the make running the tests hands down: `make test ARGS=...` exports ARGS, and `make -n train` would
    # read pytest's options from it as the main job's overrides
    for name in ("MAKEFLAGS", "MAKEOVERRIDES", "MFLAGS", "MAKELEVEL", "ARGS"):
        env.pop(name, None)
    return env


def _shortened(argv: list[str], extra: list[str]) -> list[str]:
    """`argv` with the overrides of `extra` in place of any of the same key."""
    keys = {o.partition("=")[0] for o in extra}
    return [a for a in argv if a.partition("=")[0] not in keys] + extra


def _run(argv: list[str], cwd: Path, timeout: float = 120, process: bool = False) -> subprocess.CompletedProcess:
    """The documented program with `argv`'s arguments, from `cwd`: its console script in a process of its own
    (`process`), else its main() in this one (tests/helpers.py run_module), which spares the imports."""
    program = _program(argv)
    assert program is not None, argv
    if process:
        result = subprocess.run(
            [str(BIN / program[0]), *program[1]],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_env(),
            check=False,
        )
    else:
        with contextlib.chdir(cwd):
            result = run_module(SCRIPTS[program[0]], *program[1], check=False)
    assert result.returncode == 0, f"{' '.join(argv)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _documented(text: str) -> Command:
    found = [c for c in ALL_COMMANDS if c.text == text]
    assert found, f"{text!r} is no longer in the docs: pick the command this test runs in its place"
    return found[0]


@pytest.fixture(scope="module")
def main_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The main job (what `make train` runs), shortened to 200 env steps."""
    _documented(MAIN_JOB)
    recipe = subprocess.run(
        ["make", "-n", "--no-print-directory", "train"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=_env(),
        check=True,
    )
    argv = shlex.split(recipe.stdout.strip().splitlines()[-1])
    assert _program(argv) == ("robotrl-train", []), f"make train runs {argv}, not robotrl-train"
    work = tmp_path_factory.mktemp("main_job")
    run_dir = work / "run"
    result = _run(_shortened(argv, [*SHORT, f"hydra.run.dir={run_dir}"]), cwd=work, process=True)
    return run_dir, result


def _table_files(path: Path, heading: str) -> list[str]:
    """The backticked names in the first column of the table that follows `heading` (or the first table)."""
    text = path.read_text()
    start = text.index(heading) if heading else 0
    names = []
    for line in text[start:].splitlines():
        if line.startswith("| `"):
            names += re.findall(r"`([^`]+)`", line.split("|")[1])
        elif names and not line.startswith("|"):
            break
    return names


def _exists(run_dir: Path, name: str) -> bool:
    if "<" in name:  # step_<N:09d>/, eval_step_<N:09d>.mp4: a file of that pattern
        pattern = re.sub(r"<[^>]+>", "*", name).rstrip("/")
        return any(run_dir.glob(pattern))
    return (run_dir / name.rstrip("/")).exists()


def test_the_main_job_runs_and_writes_what_the_readme_says(main_run):
    run_dir, result = main_run
    readme_files = _table_files(README, "The main job trains")
    assert {"config.yaml", "metrics.csv", "summary.json", "deploy_spec.json"} <= set(readme_files), readme_files
    training_files = _table_files(REPO / "docs" / "training.md", "## What a run writes")
    missing = [name for name in readme_files + training_files if not _exists(run_dir, name)]
    assert not missing, f"the docs say a run writes {missing}; {run_dir} holds {sorted(os.listdir(run_dir))}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 200 and "eval/return" in summary, summary
    assert "run directory" in result.stdout + result.stderr  # the log line the README points to


def test_an_evaluation_of_that_run(main_run, tmp_path):
    run_dir, _ = main_run
    argv = _shortened(_argv(_documented(EVALUATION).text), [f"run={run_dir}", "episodes=1"])
    result = _run(argv, cwd=tmp_path)
    line = json.loads(result.stdout.strip().splitlines()[-1])
    assert line["episodes"] == 1 and "return" in line, line
    written = list((run_dir / "eval").glob("*/eval.json"))
    assert written and list((run_dir / "eval").glob("*/eval.mp4")), "robotrl-eval wrote no eval.json and eval.mp4"


def test_a_gymnasium_robotics_env_with_hindsight_trains(tmp_path):
    pytest.importorskip("gymnasium_robotics", reason="the robotics extra (gymnasium-robotics) is not installed")
    argv = _argv(_documented(GYM_RECIPE).text)
    run_dir = tmp_path / "run"
    _run(_shortened(argv, [*SHORT, f"hydra.run.dir={run_dir}"]), cwd=tmp_path)
    assert json.loads((run_dir / "summary.json").read_text())["env_steps"] >= 200


# -- the pages themselves


def _benches() -> list[str]:
    """The benchmark scripts: those in bench/ that print the one JSON line (bench/common.py's emit)."""
    return sorted(p.stem for p in (REPO / "bench").glob("*.py") if "emit(" in p.read_text() and p.stem != "common")


def test_the_benchmarks_page_shows_each_bench_with_its_latest_saved_line():
    page = (REPO / "docs" / "benchmarks.md").read_text()
    problems = []
    for name in _benches():
        rows = [line for line in page.splitlines() if line.startswith(f"| [`{name}`]")]
        if len(rows) != 1:
            problems.append(f"{name}: {len(rows)} rows in docs/benchmarks.md, one expected")
            continue
        results = REPO / "bench" / "results" / f"{name}.jsonl"
        lines = [line for line in results.read_text().splitlines() if line.strip()] if results.exists() else []
        if lines:
            date = json.loads(lines[-1])["time"][:10]
            if f"| {date} |" not in rows[0]:
                problems.append(f"{name}: its row does not cite the last saved line, of {date} ({results.name})")
        elif "no saved line yet" not in rows[0]:
            problems.append(f"{name}: no results file, and its row does not say 'no saved line yet'")
        notes = REPO / "bench" / "results" / f"{name}.md"
        if notes.exists() and f"(../bench/results/{name}.md)" not in rows[0]:
            problems.append(f"{name}: its row does not link bench/results/{name}.md")
    assert not problems, "\n".join(problems)


def test_every_docs_page_is_in_the_architecture_docs_table_and_the_readme():
    architecture = (REPO / "docs" / "architecture.md").read_text()
    readme = README.read_text()
    pages = [p.name for p in DOC_FILES[1:]]
    missing = [p for p in pages if p != "architecture.md" and f"]({p})" not in architecture]
    missing += [f"README: {p}" for p in pages if f"](docs/{p})" not in readme]
    assert not missing, f"docs pages not linked: {missing}"


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) <= 100


def test_commands_that_cannot_be_checked_are_named():
    """The classification itself: a command of an unknown program is refused, naming it."""
    with pytest.raises(Unclassified, match="rm"):
        check(Command("x:1", "rm -rf runs"))
    with pytest.raises(Unclassified, match="<task>"):
        check(Command("x:1", ".venv/bin/robotrl-train task=<task>"))
    with pytest.raises(Exception, match="no_such_key"):
        check(Command("x:1", ".venv/bin/robotrl-train agent.no_such_key=1"))
    with pytest.raises(AssertionError, match="-m"):
        check(Command("x:1", ".venv/bin/robotrl-train seed=1,2"))
    assert shutil.which("make"), "make is needed to check the make targets"
