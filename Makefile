# minillama: every target creates .venv on first use and installs the pinned environment.
#   make book          build the site from the notebooks' stored outputs -> _build/html/index.html (needs npm once)
#   make test          everything CI runs, in this order (515 s measured on 2 idle cores, 24 min on busy ones):
#     make lint          ruff (seconds)
#     make pytest        pytest tests/ without the two below (a few minutes)
#     make nbval         every notebook re-executed, stored outputs compared (a few minutes)
#     make colab-test    README snippet after a plain pip install; each notebook alone in a Colab-like venv
#     make book-strict   the site built with warnings as errors (needs npm once)
#     make browser-test  headless Chromium over the site (needs chromium: .ci/install-chromium, apt-get)
#   make execute       re-execute every notebook in place (CPU or GPU) to refresh the stored outputs
#   make lab           JupyterLab on notebooks/, minillama importable
#   make bench         python -m minillama bench -> benchmarks/local/ (ARGS="--publish" adds it to the book's results)
#   make clean         remove build outputs (keeps .venv; `make distclean` removes it and .cache too)

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.NOTPARALLEL:
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# Where torch==2.13.0 comes from. Empty: pip's configured indexes. On a machine where that would pull a
# CUDA build, pass the CPU index to the FIRST target you run (it builds .venv; later targets reuse it):
#   make book TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu   (to switch later: make distclean first)
TORCH_INDEX_URL ?=
TORCH_PIN := torch==2.13.0
# Reinstalls whenever requirements.txt or pyproject.toml changes.
STAMP := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))
# The site typesets its math with its own MathJax (no CDN): the npm package, by name and version, unpacked into
# .venv/mathjax (book/_ext/minillama_site.py serves it; its MATHJAX_VERSION must match).
MATHJAX_VERSION := 3.2.2
MATHJAX := $(VENV)/mathjax/es5/tex-mml-chtml.js
CELL_TIMEOUT ?= 600

.PHONY: help venv mathjax book test lint pytest nbval colab-test book-strict browser-test execute lab bench clean distclean

help:
	@sed -n '2,13p' Makefile | sed 's/^# //'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): requirements.txt pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet pip==26.3
	$(BIN)/python -m pip install --quiet $(TORCH_PIN) -c requirements.txt \
	  $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL) --extra-index-url https://pypi.org/simple)
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

venv: $(STAMP)

$(MATHJAX): | $(BIN)/python
	@command -v npm >/dev/null || { echo "make: npm is needed to fetch mathjax@$(MATHJAX_VERSION) (apt-get install npm)"; exit 1; }
	rm -rf $(VENV)/mathjax $(VENV)/mathjax.tmp && mkdir -p $(VENV)/mathjax.tmp
	cd $(VENV)/mathjax.tmp && npm pack --silent mathjax@$(MATHJAX_VERSION) >/dev/null && tar xzf mathjax-$(MATHJAX_VERSION).tgz
	mv $(VENV)/mathjax.tmp/package $(VENV)/mathjax && rm -rf $(VENV)/mathjax.tmp
	@test -f $@

mathjax: $(MATHJAX)

book: $(STAMP) $(MATHJAX)
	$(BIN)/jupyter-book build .
	@echo "The book: $(CURDIR)/_build/html/index.html"

test: lint pytest nbval colab-test book-strict browser-test
	@echo "make test: all checks passed"

lint: $(STAMP)
	$(BIN)/ruff check .

pytest: $(STAMP)
	$(BIN)/python -m pytest tests/ --ignore=tests/test_site.py --ignore=tests/test_colab.py

# The book outside .venv: the README snippet after a plain `pip install`, and every notebook copied alone
# into an empty folder and run in a Colab-like venv (its first cell installs minillama[book]) with the
# GPU branches taken on the CPU. Its venvs are cached in .cache/ (rebuilt when the dependencies change).
colab-test: $(STAMP)
	TORCH_INDEX_URL="$(TORCH_INDEX_URL)" $(BIN)/python -m pytest tests/test_colab.py -v --durations=0

# Every notebook re-executed on this machine and its stored outputs compared (text exactly; images not).
nbval: $(STAMP)
ifeq ($(NOTEBOOKS),)
	@echo "nbval: no notebooks in notebooks/ yet, nothing to compare"
else
	$(BIN)/python -m pytest --nbval --nbval-current-env --nbval-cell-timeout=$(CELL_TIMEOUT) \
	  --nbval-sanitize-with tests/nbval_sanitize.cfg $(NOTEBOOKS)
endif

# --all: reread every page, so warnings of pages unchanged since the last build are not skipped.
book-strict: $(STAMP) $(MATHJAX)
	$(BIN)/jupyter-book build --all -W --keep-going .

browser-test: $(STAMP) $(MATHJAX)
	-@.ci/install-chromium || echo "chromium is not installed: the browser test skips (fails under CI=true)"
	$(BIN)/python -m pytest tests/test_site.py

execute: $(STAMP)
ifeq ($(NOTEBOOKS),)
	@echo "execute: no notebooks in notebooks/ yet"
else
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	  --ExecutePreprocessor.timeout=$(CELL_TIMEOUT) --ExecutePreprocessor.kernel_name=python3 $(NOTEBOOKS)
endif

# LAB_ARGS="--no-browser --port 8889" passes options; root (containers, Colab-like VMs) needs --allow-root
LAB_ARGS ?=
lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

bench: $(STAMP)
	$(BIN)/python -m minillama bench $(ARGS)

clean:
	rm -rf _build .jupyter_cache .pytest_cache .ruff_cache *.egg-info build dist
	find . -path ./.venv -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -print0 \
	  | xargs -0 rm -rf

distclean: clean
	rm -rf $(VENV) .cache
