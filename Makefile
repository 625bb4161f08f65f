# The two commands: `make run` (the whole stack on an embedded default) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test install browser bench clean

run: $(STAMP)
	$(BIN)/python manage.py runstack

test: $(STAMP) browser
	$(BIN)/python -m console.embedded_redis $(BIN)/python -m pytest $(PYTEST_ARGS)

install: $(STAMP)

$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $(STAMP)

# Debian's Chromium for the browser tests (Playwright drives it; no browser download).
browser:
	@command -v chromium >/dev/null || { \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else echo "install Debian's chromium package (sudo apt-get install chromium) for the browser tests"; exit 1; fi; }

# Benchmarks print tables; docs/benchmarks.md records the latest figures.
bench: $(STAMP)
	$(BIN)/python -m bench.serve_bench
	$(BIN)/python -m console.embedded_redis $(BIN)/python -m bench.drill_bench

clean:
	rm -rf $(VENV) var test-artifacts
