#!/usr/bin/env bash
# Puts the widget stack Google Colab ships (ipywidgets 7.7.1, plotly 5.24.1) into
# .venv-colab-widgets, a plain folder that shadows the main venv's versions when it comes first
# on PYTHONPATH:
#     PYTHONPATH=.venv-colab-widgets .venv/bin/python -m pytest tests/course/test_widgets.py
# Only those packages and what they need beyond the main venv are installed (--no-deps), so the
# rest (IPython, traitlets, torch, ...) is the main venv's. Idempotent: it does nothing when the
# folder already holds exactly these pins, and rebuilds it when the pins change.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
TARGET=.venv-colab-widgets
PINS=(
    ipywidgets==7.7.1
    widgetsnbextension==3.6.10  # ipywidgets 7.7.1 asks for ~=3.6.0
    jupyterlab_widgets==1.1.11  # ... and >=1.0.0; 1.x is the series made for ipywidgets 7
    ipython_genutils==0.2.0     # imported by ipywidgets 7, gone from current environments
    plotly==5.24.1
    tenacity==8.5.0             # a requirement of plotly 5 (used only by its orca exporter)
)
STAMP="$TARGET/.installed"  # the file the Makefile's rule makes

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "${PINS[*]}" ]]; then
    touch "$STAMP"  # newer than this script again, so make stops asking
    exit 0
fi
# Build beside the target and swap it in, so an interrupted run never leaves a half-made folder
# that the stamp check would accept.
rm -rf "$TARGET.tmp"
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --target "$TARGET.tmp" "${PINS[@]}"
echo "${PINS[*]}" > "$TARGET.tmp/.installed"
rm -rf "$TARGET"
mv "$TARGET.tmp" "$TARGET"
