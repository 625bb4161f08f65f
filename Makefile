# The two commands: `make run` (the whole stack on an embedded default) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: run test install audit mutation browser bench clean

run: $(STAMP)
	$(BIN)/python manage.py runstack

test: $(TEST_STAMP) browser audit
	$(BIN)/python -m console.embedded_redis $(BIN)/python -m pytest $(PYTEST_ARGS)

install: $(STAMP)

# Runtime packages only: test tools (Playwright, tritonclient, …) never reach `make run`.
$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $(STAMP)

$(TEST_STAMP): $(STAMP) requirements-test.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
	touch $(TEST_STAMP)

# pip-audit over the pinned requirements; see tools/audit_requirements.py.
audit: $(TEST_STAMP)
	$(BIN)/python tools/audit_requirements.py

# Mutation testing of the core modules (not in CI: minutes per module); see docs/testing.md.
mutation: $(TEST_STAMP)
	nice -n 10 $(BIN)/python tools/mutation.py

# Debian's Chromium for the browser tests (Playwright drives it; no browser download).
browser:
	@command -v chromium >/dev/null || { \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else echo "install Debian's chromium package (sudo apt-get install chromium) for the browser tests"; exit 1; fi; }

# Benchmarks print tables; docs/benchmarks.md records the latest figures.
bench: $(STAMP)
	$(BIN)/python -m bench.serve_bench
	$(BIN)/python -m bench.targets
	$(BIN)/python -m bench.overload_bench --model mid
	$(BIN)/python -m bench.overload_bench --model small
	$(BIN)/python -m bench.interference_bench --model mid
	$(BIN)/python -m bench.interference_bench --model small
	$(BIN)/python -m bench.keeper_bench
	$(BIN)/python -m console.embedded_redis $(BIN)/python -m bench.drill_bench
	$(BIN)/python -m bench.soak_bench

clean:
	rm -rf $(VENV) test-artifacts
