# packshard — developer entry points.  `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev
DEMO_OUT ?= demo-out

.PHONY: install demo test test-core test-latest repin lint bench docs clean

BENCH_STAMP := $(VENV)/.installed-bench

# pip compiles every installed module on one core (about half of the install); compileall
# does the same on every core
COMPILE = $(PY) -m compileall -q -j 0 $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') >/dev/null 2>&1 || true

$(STAMP): pyproject.toml constraints-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile -e '.[dev]' -c constraints-dev.txt
	$(COMPILE)
	touch $(STAMP)

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q --no-compile -e '.[dev,bench]' -c constraints-dev.txt
	$(COMPILE)
	touch $(BENCH_STAMP)

install: $(STAMP)

demo: install
	PY=$(PY) OUT=$(DEMO_OUT) bash scripts/demo.sh

test: install
	$(PY) -m pytest -n 2 --dist loadgroup -q

test-core:
	PYTHON=$(PYTHON) bash scripts/core_install_check.sh

# the fixture, parity and equivalence tests in .venv-latest, with the newest releases
# (LATEST="pkg==X" tries given ones); prints what moved, exit 1 when something did
test-latest:
	VENV=.venv-latest DEV_VENV=$(VENV) $(PYTHON) scripts/test_latest.py $(LATEST)

# rewrite the fixture pins deliberately (tests/fixtures/contract/pins.json)
repin: install
	$(PY) scripts/repin_fixtures.py

# docs/cli.md from the commands (tests/cli/test_reference.py fails when it is stale)
docs: install
	$(PY) -m packshard.cli.reference docs/cli.md

lint: install
	$(VENV)/bin/ruff format --check packshard tests scripts
	$(VENV)/bin/ruff check packshard tests scripts
	$(VENV)/bin/mypy packshard

bench: $(BENCH_STAMP)
	$(PY) scripts/bench_ingest.py
	$(PY) scripts/bench_pack.py
	$(PY) scripts/bench_verify.py
	$(PY) scripts/bench_reader.py
	$(PY) scripts/bench_scale.py
	$(PY) scripts/bench_alignment.py
	$(PY) scripts/bench_backends.py --floor
	$(PY) scripts/bench_render.py

clean:
	rm -rf $(VENV) .venv-core .venv-latest $(DEMO_OUT) .pytest_cache .mypy_cache .ruff_cache
