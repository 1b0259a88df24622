# Every target does its own set-up: a fresh machine needs only python3, a C++ compiler and cmake.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test lint typecheck unit mutation llama-server model transcripts device demo serve bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	@touch $(STAMP)

venv: $(STAMP)

# The blocking flavour is generated from the asyncio source: a stale or hand-edited copy fails here.
lint: $(STAMP)
	$(PY) scripts/unasync.py --check
	$(VENV)/bin/ruff check src tests bench scripts
	$(VENV)/bin/ruff format --check src tests bench scripts

typecheck: $(STAMP)
	$(VENV)/bin/mypy --strict src

# The real llama-server and the small model, built and fetched once into a cache outside the repo.
llama-server: $(STAMP)
	$(PY) scripts/llama_server.py build

model: $(STAMP)
	$(PY) scripts/llama_server.py model

unit: $(STAMP)
	$(PY) -m pytest tests/unit tests/contract

# The whole suite: lint, types, unit, contract and the device tier against the real llama-server.
# INFERPATH_SKIP_DEVICE=1 is the only opt-out; every skipped device test then says why.
test: lint typecheck
	@if [ "$${INFERPATH_SKIP_DEVICE:-0}" != "1" ]; then $(MAKE) --no-print-directory llama-server model; fi
	$(PY) -m pytest tests/unit tests/contract tests/device

# Mutation testing of the domain, the client and the self-test against the unit and contract
# tiers (not part of `make test`: it takes a while). mutmut works on a copy in ./mutants/, started
# afresh each time so that it never tests a stale copy of a file edited since; the [tool.mutmut]
# section of pyproject.toml says what is mutated, which tests run and the type check (the venv's
# mypy) that refuses a mutant before any test runs. Then one score per file.
MUTATION_JOBS ?= 2

mutation: $(STAMP)
	rm -rf mutants
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/mutmut run --max-children $(MUTATION_JOBS)
	$(PY) scripts/mutation_report.py

transcripts: llama-server model
	$(PY) scripts/record_transcripts.py

device: llama-server model
	$(PY) scripts/device.py

demo: llama-server model
	$(PY) scripts/demo.py

# The small model's llama-server and the proxy on .run/infer.sock, with a matching .run/config.toml,
# until Ctrl-C: the stack the README's examples run against. `make serve ROUTER=1` runs a llama-server
# router of two models instead (the brief's deployment; see "Against a router" in the README).
serve: llama-server model
	$(PY) scripts/serve.py $(if $(ROUTER),--router)

bench: llama-server model
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
