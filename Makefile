# packshard — developer entry points.  `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev
DEMO_OUT ?= demo-out

.PHONY: install demo test test-core lint bench clean

BENCH_STAMP := $(VENV)/.installed-bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $(BENCH_STAMP)

install: $(STAMP)

demo: install
	PY=$(PY) OUT=$(DEMO_OUT) bash scripts/demo.sh

test: install
	$(PY) -m pytest -n 2 --dist loadgroup -q

test-core:
	PYTHON=$(PYTHON) bash scripts/core_install_check.sh

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

clean:
	rm -rf $(VENV) .venv-core $(DEMO_OUT) .pytest_cache .mypy_cache .ruff_cache
