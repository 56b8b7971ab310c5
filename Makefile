# gpubot: `make run` starts the bot (Slack when tokens are set, otherwise the local console);
# `make test` sets up what it needs and runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
# Test workers (pytest-xdist): one per core by default; PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= auto

.PHONY: run test lint agent bench clean

run: $(STAMP) agent
	@$(BIN)/gpubot

test: $(STAMP) $(VENV)/.torch agent
	$(BIN)/pytest -n $(PYTEST_WORKERS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

agent: $(STAMP)
	@$(BIN)/python -m agents.zipapp dist/gpu-agent.pyz >&2

bench: $(STAMP) agent
	$(BIN)/python bench/agent_status.py
	$(BIN)/python bench/fleet_status.py
	$(BIN)/python bench/poll_capacity.py
	$(BIN)/python bench/ack_latency.py
	$(BIN)/python bench/stall.py
	$(BIN)/python bench/tick_scale.py
	$(BIN)/python bench/spend_scale.py

# constraints.txt pins the runtime dependencies (deploy/constraints.py writes it); the image
# installs the same versions.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) >&2
	@$(BIN)/python -m pip install --quiet --upgrade pip >&2
	@$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]' >&2
	@# Vast.ai's official SDK, for the stand-in's contract tests: it pins its own dependencies
	@# hard, so it comes without them (requests and python-dateutil are in the dev extra).
	@$(BIN)/python -m pip install --quiet --no-deps 'vastai==1.9.1' >&2
	@touch $@

# The CPU build of PyTorch serves the CUDA-check tests (a CPU-only build must fail them).
$(VENV)/.torch: $(STAMP)
	@$(BIN)/python -m pip install --quiet '$(TORCH_SPEC)' >&2
	@touch $@

clean:
	rm -rf $(VENV) dist build *.egg-info
