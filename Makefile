# Two commands on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_FLAGS := -q --disable-pip-version-check

.PHONY: demo test install install-test clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) --upgrade pip==25.3

$(VENV)/.installed: setup.py | $(VENV)/bin/python
	$(PY) -m pip install $(PIP_FLAGS) -e .
	touch $@

$(VENV)/.installed-test: setup.py $(VENV)/.installed
	$(PY) -m pip install $(PIP_FLAGS) -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# The five-stage pipeline at tiny scale on CPU (see README "Demo").
demo: install
	JAX_PLATFORMS=cpu $(PY) -m experiments.pipeline --model=tiny --workdir=runs/demo

# The whole test suite, slow tests included.
test: install-test
	$(PY) -m pytest tests

clean:
	rm -rf runs .cache .pytest_cache
