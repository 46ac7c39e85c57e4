# Every target builds the virtual environment on first use, so a fresh clone
# needs nothing but Python 3.11 and this file.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: bench-tools help venv migrate run demo test chromium lint bench bench-quick clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $(STAMP)

venv: $(STAMP)  ## create .venv and install the pinned packages

migrate: $(STAMP)  ## apply the alembic (domain) and Django (auth/session) migrations
	$(PY) manage.py migrate_all

run: $(STAMP)  ## start web, worker and beat on embedded defaults (SQLite, no broker server)
	$(PY) -m workers.embedded run

demo: $(STAMP)  ## run one whole erasure headless and print the certificate
	$(PY) -m workers.embedded demo

# Two test processes by default (pytest-xdist): the end-to-end tests spend most of their time
# in one single-threaded worker child each, so one process leaves a core idle.  Tests that
# share an expensive session fixture carry the same xdist_group and run in one process.
TEST_PROCESSES ?= 2
test: $(STAMP) chromium  ## run the test suite (needs PostgreSQL and Redis on 127.0.0.1)
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist loadgroup

# The browser test drives Debian's Chromium through playwright (never a playwright
# browser download).  Installed once, as root, from Debian's packages.
chromium:
	@test -x /usr/bin/chromium || { \
	  echo "installing Debian's chromium for the browser test"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

lint: $(STAMP)  ## ruff, import contracts and strict types on domain and unlearning
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy deletion/domain unlearning

bench: $(STAMP) bench-tools  ## full benchmarks (about 2.5 hours on 2 cores) -> docs/benchmarks.md
	$(PY) -m bench run --full

bench-quick: $(STAMP) bench-tools  ## a few-minute benchmark smoke run -> docs/benchmarks.md
	$(PY) -m bench run --quick

# wrk (service load test) and ripgrep (the corpus-scan reference), from Debian's packages: from apt's
# package cache first (a machine without network may hold them there), else downloaded.
# Without them the report says those figures were not measured.
bench-tools:
	@{ test -x /usr/bin/wrk && test -x /usr/bin/rg; } || { \
	  echo "installing Debian's wrk and ripgrep for the benchmarks"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-download wrk ripgrep >/dev/null 2>&1 \
	  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk ripgrep >/dev/null; } \
	  || echo "could not install wrk/ripgrep: the service and scan figures will be reported as not measured"; }

clean:  ## remove the virtual environment and local state under var/
	rm -rf $(VENV) var/
