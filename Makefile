# hypsearch: `make run` serves the demo, `make test` runs ruff and the whole suite,
# `make test-fast` ruff and everything but the tests marked slow (end to end, training).
# Both do all set-up first: Debian data packages, a .venv, the project.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HYPSEARCH_HOME ?= $(CURDIR)/var
export HYPSEARCH_HOME

FMNIST_DIR := /usr/share/datasets/fashion-mnist
WORDNET_DIR := /usr/share/wordnet

.PHONY: run test test-fast pytest lint setup data browser venv bench clean

run: setup
	$(BIN)/hypsearch demo

# As root, the suite runs in a network namespace of its own that has only lo
# (Ray binds the machine's interface otherwise; its tests skip outside one, and fail
# there under CI=true, where a cluster is expected: tests/support/ray_cluster.py).
test: lint browser
	@$(MAKE) --no-print-directory pytest PYTEST_ARGS=""

# everything but the tests marked slow (tests/conftest.py): a few minutes
test-fast: lint
	@$(MAKE) --no-print-directory pytest PYTEST_ARGS='-m "not slow"'

pytest:
	@if [ "$$(id -u)" = 0 ] && command -v ip >/dev/null && ip netns add hypsearch-test-$$$$ 2>/dev/null; then \
	  ns=hypsearch-test-$$$$; ip netns exec $$ns ip link set lo up; \
	  ip netns exec $$ns env RAY_USAGE_STATS_ENABLED=0 $(BIN)/python -m pytest -q $(PYTEST_ARGS); rc=$$?; \
	  ip netns del $$ns; exit $$rc; \
	else \
	  RAY_USAGE_STATS_ENABLED=0 $(BIN)/python -m pytest -q $(PYTEST_ARGS); \
	fi

# ruff with the rules of pyproject.toml (installed by the test extra)
lint: setup
	$(BIN)/ruff check .

setup: data $(VENV)/.installed

# Debian packages with the data sets; installed only when missing.
data:
	@missing=""; \
	[ -f $(FMNIST_DIR)/t10k-labels-idx1-ubyte.gz ] || [ -f $(FMNIST_DIR)/t10k-labels-idx1-ubyte ] || missing="$$missing dataset-fashion-mnist"; \
	[ -f $(WORDNET_DIR)/data.noun ] || missing="$$missing wordnet-base"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# Debian's Chromium and its driver, for the web page's browser test.
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  echo "installing Debian packages: chromium chromium-driver"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	fi

$(VENV)/.installed: pyproject.toml
	[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch is pinned to the CPU build (see README); install it first so nothing pulls a CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test,ray]'
	touch $@

bench: setup
	$(BIN)/python -m pip install -q -e '.[test,bench]'

clean:
	rm -rf $(VENV) *.egg-info
