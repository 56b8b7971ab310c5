# gpubot: `make run` starts the bot (Slack when tokens are set, otherwise the local console);
# `make test` sets up what it needs and runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
# A CJK font for the charts' Chinese, Japanese and Korean names, so that no system package is
# needed: Noto Sans CJK SC (SIL Open Font License 1.1), taken from the mplfonts wheel on PyPI
# (its hash checked; only this font is kept) into the environment, where bot/charts.py finds it.
CJK_FONT := $(VENV)/share/gpubot-fonts/NotoSansCJKsc-Regular.otf
CJK_WHEEL := mplfonts==0.0.11
CJK_WHEEL_SHA256 := b5e05ba7fd9a59cae48d1db41f657f50e6765e6f04b8d78504438b93a66b6e13
# Test workers (pytest-xdist): half again as many as the machine has cores, since a quarter of
# a worker's time goes to waiting (on sshd, subprocesses, sockets), which the extra worker fills;
# PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; n = os.cpu_count() or 1; print(n + (n + 1) // 2)')

.PHONY: run test lint agent bench simulate clean

run: $(STAMP) $(CJK_FONT) agent
	@$(BIN)/gpubot

test: $(STAMP) $(VENV)/.torch $(CJK_FONT) agent
	$(BIN)/pytest -n $(PYTEST_WORKERS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

agent: $(STAMP)
	@$(BIN)/python -m agents.zipapp dist/gpu-agent.pyz >&2

# The quick size of every bench in bench/, one after another, and one table of their ratios
# against their goals (bench/run_all.py; each bench alone runs its full size).
bench: $(STAMP) agent
	$(BIN)/python bench/run_all.py

# A team's month, simulated against the real store and clock with the world misbehaving
# (bench/team_month.py); SEED, STORE (sqlite or postgresql) and PLATFORMS (of one currency:
# runpod,vast,lambda in dollars, or compshare in yuan) choose the run.
SEED ?= 1
STORE ?= sqlite
PLATFORMS ?= runpod,vast,lambda
simulate: $(STAMP)
	$(BIN)/python bench/team_month.py --seed $(SEED) --days 30 --store $(STORE) --platforms $(PLATFORMS)

# constraints.txt pins the runtime dependencies (deploy/constraints.py writes it); the image
# installs the same versions with every file's hash checked, from deploy/requirements.lock
# (deploy/lock.sh writes it from pyproject.toml and constraints.txt).
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

$(CJK_FONT): $(STAMP)
	@rm -rf $(VENV)/.cjk-wheel && mkdir -p $(VENV)/.cjk-wheel $(dir $@)
	@$(BIN)/python -m pip download --quiet --no-deps --dest $(VENV)/.cjk-wheel '$(CJK_WHEEL)' >&2
	@echo "$(CJK_WHEEL_SHA256)  $$(ls $(VENV)/.cjk-wheel/*.whl)" | sha256sum --check --quiet
	@$(BIN)/python -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); \
		open(sys.argv[2], 'wb').write(z.read('mplfonts/fonts/NotoSansCJKsc-Regular.otf'))" \
		$$(ls $(VENV)/.cjk-wheel/*.whl) $@.part
	@mv $@.part $@ && rm -rf $(VENV)/.cjk-wheel

clean:
	rm -rf $(VENV) dist build *.egg-info
