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

## Lint, then the test suite.
test: $(VENV)/.installed lint
	$(BIN)/python -m pytest -q $(ARGS)

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.installed
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench-quick: $(VENV)/.installed
	$(BIN)/python bench/sac_speed.py --quick

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
