# README.md's two commands: `make course` opens the course, `make test` runs the whole suite.
# Both create the environment (.venv) first if it is missing or older than pyproject.toml.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
COLAB_WIDGETS := .venv-colab-widgets/.installed

.PHONY: course test env notebook-filter lint exercises check-exercises bench

# JupyterLab refuses to start as root (Docker, many cloud machines) unless allowed to. COURSE_ARGS
# passes more options, e.g. COURSE_ARGS="--no-browser --port=8899".
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
COURSE_ARGS ?=

# JupyterLab's root is the repository's, so that exercises/ and solutions/ sit beside notebooks/ in its
# file browser (given only the chapter, it would take the chapter's folder); chapter 00 opens first.
course: env notebook-filter
	$(BIN)/jupyter lab $(ALLOW_ROOT) --ServerApp.root_dir=. $(COURSE_ARGS) notebooks/00_welcome.ipynb

# One pytest-xdist worker per logical core (at most 4; tests/course/notebook_runs.py counts cores the
# same way), each computing on one thread (tests/conftest.py): much of a test's time is Python on one
# core. Whole files go to a worker (loadfile), since the notebook and grading modules start all their
# runs from one module-scoped fixture.
test: env $(COLAB_WIDGETS)
	$(BIN)/python -m pytest -n logical --maxprocesses 4 --dist loadfile

env: $(INSTALLED)

# torch is installed on its own first only where none is there yet, so a GPU machine keeps its
# CUDA build (and CI its CPU build, see .ci/run); without an NVIDIA GPU, the CPU build
# (scripts/install_torch.sh). pip then only adds what is missing.
$(INSTALLED): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || bash scripts/install_torch.sh $(BIN)/pip
	$(BIN)/pip install -e ".[course,serve,dev]"
	touch $@

# Notebook outputs never reach git: nbstripout as this clone's git filter (scripts/notebook_filter.sh).
notebook-filter: env
	bash scripts/notebook_filter.sh $(BIN)/python

# Colab's ipywidgets 7.7.1 and plotly 5.24.1, which the widget tests also run against.
$(COLAB_WIDGETS): scripts/colab_widget_env.sh | $(INSTALLED)
	bash scripts/colab_widget_env.sh

lint: env
	$(BIN)/ruff check .

exercises: env
	$(BIN)/python -m minillm.grading.exercises

check-exercises: env
	$(BIN)/python -m minillm.grading.exercises --check
