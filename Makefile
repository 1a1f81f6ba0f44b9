# Two entry points, each setting itself up on a fresh clone (virtualenv + pinned install).
VENV ?= .venv
PY := $(VENV)/bin/python

# requirements-dev.txt: the deploy set (requirements.txt, what `pulumi up` installs) plus training and tests.
$(VENV)/.installed: requirements.txt requirements-dev.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

.PHONY: demo test
demo: $(VENV)/.installed  ## train the tiny model on the shipped sample text, local Ray, 2 CPU workers
	$(PY) -m training --demo

test: $(VENV)/.installed  ## the whole suite: config, Pulumi mocks, CRD validation, real Ray runs
	$(PY) -m pytest
