# Headwater: `make demo` runs the main job, `make test` the suite. Both set up what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo tour test test-all bench bench-storage bench-network bench-latency bench-spark lint clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,compression,server,spark]'
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: venv
	$(PY) -m headwater.demo.pipeline

tour: venv
	$(PY) -m headwater.demo.tour

test: venv
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q

test-all: venv
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -m ''

bench: bench-storage bench-network bench-latency bench-spark

bench-storage: venv
	$(PY) -m bench.storage

bench-network: venv
	$(PY) -m pip install --quiet -r bench/requirements.txt
	$(PY) -m bench.network

bench-latency: venv
	$(PY) -m pip install --quiet -r bench/requirements.txt
	$(PY) -m bench.latency

bench-spark: venv
	$(PY) -m bench.spark

lint: venv
	$(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis demo-data bench/results
