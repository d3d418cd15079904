# Every target creates the virtual environment first if it is missing (or older than the project files).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: train test lint format bench-quick clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e ".[dev,robotics]"
	touch $@

## Train a policy on the default task (override anything: make train ARGS="task.env_id=HalfCheetah-v5").
train: $(VENV)/.installed
	$(BIN)/robotrl-train $(ARGS)

## Lint, then the test suite: one worker per core (at most TEST_WORKERS), each taking whole test files in the
## order tests/conftest.py gives, then the tests on DDS alone. pytest exits 5 where ARGS select no test of a phase.
TEST_WORKERS ?= 4
test: $(VENV)/.installed lint
	$(BIN)/python -m pytest -q -n auto --maxprocesses $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not dds" $(ARGS) || [ $$? -eq 5 ]
	$(BIN)/python -m pytest -q -m dds $(ARGS) || [ $$? -eq 5 ]

# import-linter finds a package's modules under its directory on disk, and robotrl.tasks, .hardware and
# .sim2real live in tasks/, hardware/ and sim2real/: the layers are checked on a tree of links that puts them
# where the installed package has them.
IMPORT_GRAPH := build/import-graph
lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf $(IMPORT_GRAPH) && mkdir -p $(IMPORT_GRAPH)/robotrl
	for path in robotrl/* tasks hardware sim2real; do ln -s "$$PWD/$$path" $(IMPORT_GRAPH)/robotrl/; done
	cd $(IMPORT_GRAPH) && PYTHONPATH=. $(abspath $(BIN))/lint-imports --config $(CURDIR)/pyproject.toml --no-cache

format: $(VENV)/.installed
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench-quick: $(VENV)/.installed
	$(BIN)/python bench/sac_speed.py --quick

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
