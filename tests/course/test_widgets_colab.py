"""The widget tests again, with Colab's ipywidgets 7.7.1 and plotly 5.24.1 shadowing ours.

scripts/colab_widget_env.sh makes .venv-colab-widgets; CI runs it and sets
MINILLM_REQUIRE_COLAB_WIDGETS=1, so that there a missing folder fails instead of skipping.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
COLAB_WIDGETS = ROOT / ".venv-colab-widgets"
COLAB_VERSIONS = {"ipywidgets": "7.7.1", "plotly": "5.24.1"}
WIDGET_TESTS = ("test_widgets.py", "test_widget_block_pool.py", "test_widget_batch_slots.py",
                "test_widget_draft_acceptance.py", "test_widget_quant_error.py", "test_widget_serving_dashboard.py",
                "test_widget_roofline.py", "test_widget_latency_curve.py")
# Tests whose cost is an engine's or a server's run, not the widget layer's: each view's drawing and
# controls are tested here on recorded traces, and LiveView's redraws on a running engine
# (test_widgets.py) as well, so these three run once, on our versions.
ENGINE_RUNS = ("test_live_on_a_real_engine_with_chunks_and_preemption", "test_live_on_a_speculating_engine",
               "test_live_on_a_server_under_a_burst")

# Checked in the same interpreter that then runs the tests, so they surely ran on these versions;
# on Colab's versions FigureWidget is an ipywidgets widget, not an anywidget one.
RUN_ON_COLAB_VERSIONS = f"""
import sys, ipywidgets, plotly, pytest
import plotly.graph_objects as go
found = {{"ipywidgets": ipywidgets.__version__, "plotly": plotly.__version__}}
assert found == {COLAB_VERSIONS!r}, f"expected Colab's versions, found {{found}}"
assert isinstance(go.FigureWidget(), ipywidgets.DOMWidget)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-k", {"not (" + " or ".join(ENGINE_RUNS) + ")"!r},
                      *{[str(HERE / f) for f in WIDGET_TESTS]!r}]))
"""


@pytest.mark.slow
def test_widget_tests_pass_on_colab_versions() -> None:
    if not COLAB_WIDGETS.is_dir():
        message = f"{COLAB_WIDGETS.name}/ is missing; make it with scripts/colab_widget_env.sh"
        if os.environ.get("MINILLM_REQUIRE_COLAB_WIDGETS"):
            pytest.fail(message)
        pytest.skip(message + " (MINILLM_REQUIRE_COLAB_WIDGETS=1 makes this a failure)")
    path = os.pathsep.join([str(COLAB_WIDGETS), *filter(None, [os.environ.get("PYTHONPATH")])])
    result = subprocess.run([sys.executable, "-c", RUN_ON_COLAB_VERSIONS], cwd=ROOT, capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": path}, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
