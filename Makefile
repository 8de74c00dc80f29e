# Headwater: `make demo` runs the main job, `make test` the suite. Both set up what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo tour dev-cluster test test-all zookeeper browser bench bench-storage bench-network bench-latency bench-spark bench-cluster lint format clean venv bytecode

venv: $(STAMP)

# The suite, the demo and the benchmarks start many Python processes; with
# PYTHONDONTWRITEBYTECODE set (as on some CI hosts) each would compile every module again
# (about 0.25 s a process here). compileall writes the .pyc files whatever that says.
bytecode: venv
	@$(PY) -m compileall -q -j0 headwater bench tests

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,compression,server,spark,cluster,http]'
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: bytecode
	$(PY) -m headwater.demo.pipeline

tour: bytecode
	$(PY) -m headwater.demo.tour

# ZooKeeper and three brokers on this machine until Ctrl-C (docs/cluster.md)
dev-cluster: bytecode zookeeper
	$(VENV)/bin/headwater dev-cluster --brokers 3

# The suite in two parts: most tests on $(TEST_WORKERS) workers (pytest-xdist, one module a
# worker at a time), then those marked `serial` alone (Spark's JVMs take both cores; some
# tests wait fixed times or measure latency against a baseline). Both parts always run.
TEST_WORKERS ?= 2
PYTEST_PARTS = rc=0; \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m '$(1)not serial' || rc=$$?; \
	$(PY) -m pytest -q -m '$(1)serial' || rc=$$?; \
	exit $$rc

test: lint bytecode zookeeper browser
	@$(call PYTEST_PARTS,not slow and )

test-all: lint bytecode zookeeper browser
	@$(call PYTEST_PARTS,)

# the cluster's tests run a real ZooKeeper: Debian's package, run by the Java the Spark
# tests use (needs root the first time; nothing is started here)
zookeeper:
	@test -f /usr/share/java/zookeeper.jar || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q zookeeper)

# the web console's tests drive a headless Chromium through Debian's chromedriver (root the
# first time; tests/support/browser.py)
browser:
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver)

bench: bench-storage bench-network bench-latency bench-spark

bench-storage: bytecode
	$(PY) -m bench.storage

bench-network: bytecode
	$(PY) -m pip install --quiet -r bench/requirements.txt
	$(PY) -m bench.network

bench-latency: bytecode
	$(PY) -m pip install --quiet -r bench/requirements.txt
	$(PY) -m bench.latency

bench-spark: bytecode
	$(PY) -m bench.spark

bench-cluster: bytecode zookeeper
	$(PY) -m bench.cluster

# the layer contracts, ruff's lint rules and its formatting (run 'make format' to apply it),
# then mypy over the strictly typed layers (the files pyproject.toml's [tool.mypy] lists)
lint: venv
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/ruff check --quiet headwater tests bench examples
	$(VENV)/bin/ruff format --check --quiet headwater tests bench examples
	$(VENV)/bin/mypy

format: venv
	$(VENV)/bin/ruff format --quiet headwater tests bench examples
	$(VENV)/bin/ruff check --quiet --fix headwater tests bench examples

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis demo-data bench/results
