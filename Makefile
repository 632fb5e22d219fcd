# One-command set-up on a fresh machine (Python 3.11, pip and make only).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: train test lint bench figures clean strip-notebooks rejax-compare

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,jaxmarl,brax,jumanji]'
	touch $(STAMP)

## train: PPO on gymnax CartPole-v1 until episode_reward_mean >= 475 (results in runs/)
train: $(STAMP)
	$(BIN)/jaxplan train ppo --env CartPole-v1 --stop-reward 475 --output runs/ppo-cartpole

## test: the whole test suite (what CI runs). --dist loadfile: a module's tests on one worker, so
## a module-scoped fixture (a subprocess of fake devices, a trained run) runs once, not once per
## worker (pytest-xdist 3.8's loadgroup does not group under pytest 9.2)
test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

## strip-notebooks: remove outputs and metadata noise (tests/test_notebooks.py checks it)
strip-notebooks: $(STAMP)
	$(BIN)/python notebooks/strip.py

bench: $(STAMP)
	$(BIN)/python benchmarks/throughput.py
	$(BIN)/python benchmarks/solve.py

## rejax-compare: jaxplan vs rejax 0.1.3 (PPO, DQN; SAC once jaxplan has it), same work, one
## process. rejax is not a project dependency: REJAX_PYTHON is a separate venv with jaxplan and
## rejax (python3 -m venv /work/rejax-venv && /work/rejax-venv/bin/pip install -e . rejax==0.1.3)
REJAX_PYTHON ?= /work/rejax-venv/bin/python
rejax-compare:
	$(REJAX_PYTHON) benchmarks/rejax_compare.py

## figures: benchmarks/figures/curves.png, the README's curves (2 runs x 3 seeds, ~1 min)
figures: $(STAMP)
	$(BIN)/python benchmarks/curves.py

clean:
	rm -rf $(VENV) runs
