"""QuantError: the histogram / group error / outlier channel panels drawn from a hand-made weight
with one planted outlier (every number where the quantization formulas put it), from layers of the
shipped tiny model, and the view's layer, method and group size controls. Also run with Colab's
widget versions (tests/course/test_widgets_colab.py)."""

from __future__ import annotations

import subprocess
import sys

import ipywidgets
import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest
import torch
from torch import nn

from minillm import LLM
from minillm.layers.quant_linear import QuantLinear, decoder_linears
from minillm.widgets import QuantError, quant_error_figure
from minillm.widgets.quant_error import quant_error_stats

OUTLIER = (5, 70)  # row, input channel: in group 2 of 32 inputs


def planted() -> torch.Tensor:
    """64 x 256 weights of std 0.02, and one of 0.5."""
    weight = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * 0.02
    weight[OUTLIER] = 0.5
    return weight


def trace(fig: go.Figure, name: str) -> go.BaseTraceType:
    (found,) = [t for t in fig.data if t.name == name]
    return found


def level_values(fig: go.Figure) -> list[float]:
    return sorted({x for x in trace(fig, "levels").x if x is not None})


def histogram_total(fig: go.Figure) -> int:
    return sum(trace(fig, "weights").y)


# ---- the pure figure, on a hand-made weight ----

def test_int4_outlier_group_has_the_largest_error_and_its_levels_are_drawn() -> None:
    weight = planted()
    fig = quant_error_figure(weight, "int4", 32, name="hand")
    z = np.array(trace(fig, "error").z)
    assert z.shape == (64, 8)  # rows x groups of 32, no pooling at this size
    row, group = OUTLIER[0], OUTLIER[1] // 32
    assert np.unravel_index(z.argmax(), z.shape) == (row, group)
    others = np.delete(z[row], group)
    assert z[row, group] > 3 * others.max()  # group-wise: the rest of the row keeps its fine levels
    levels = level_values(fig)
    assert len(levels) == 16
    # The levels drawn are those the dequantized group actually takes, the outlier's among them.
    stats = quant_error_stats(weight, "int4", 32)
    assert (stats.row, stats.group) == (row, group)
    taken = np.unique(stats.dequantized[row, group * 32:(group + 1) * 32])
    assert np.isin(taken, np.array(levels, dtype=np.float32)).all()
    assert stats.level_counts.sum() == 32 and np.count_nonzero(stats.level_counts) == taken.size
    assert histogram_total(fig) == weight.numel()
    assert trace(fig, "outlier channels").x[0] == OUTLIER[1]
    assert "hand · int4, groups of 32 inputs<br><sup>weight 64 × 256 · " in fig.layout.title.text
    assert f"row {row}, inputs 64–95" in fig.layout.annotations[0].text


def test_int8_outlier_row_has_the_largest_error_and_every_level_is_drawn() -> None:
    weight = planted()
    fig = quant_error_figure(weight, "int8", name="hand")
    z = np.array(trace(fig, "error").z)
    assert z.shape == (64, 1) and z.argmax() == OUTLIER[0]  # one group per row: the whole row pays
    levels = level_values(fig)
    assert len(levels) == 255 and levels[-1] == pytest.approx(0.5) and levels[0] == pytest.approx(-0.5)
    assert np.diff(levels) == pytest.approx(0.5 / 127, rel=1e-4)
    assert histogram_total(fig) == weight.numel()
    assert trace(fig, "outlier channels").x[0] == OUTLIER[1]
    assert "255 int8 levels" in fig.layout.annotations[0].text


def test_choosing_the_row_and_group() -> None:
    fig = quant_error_figure(planted(), "int4", 64, row=9, group=3)
    assert "row 9, inputs 192–255" in fig.layout.annotations[0].text
    stats = quant_error_stats(planted(), "int4", 64, row=9, group=3)
    assert len(level_values(fig)) == 16 and level_values(fig) == pytest.approx(stats.levels.tolist())
    with pytest.raises(ValueError, match="row must be in"):
        quant_error_figure(planted(), row=64)
    with pytest.raises(ValueError, match="group must be in"):
        quant_error_figure(planted(), "int4", 128, row=0, group=2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(method="int3"), "method must be one of"),
    (dict(method="fp8"), "method must be one of"),
    (dict(group_size=48), "group_size must be one of"),
    (dict(group_size=256), "group_size must be one of"),
])
def test_bad_method_or_group_size(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        quant_error_figure(planted(), **kwargs)


def test_group_size_that_does_not_divide_the_inputs() -> None:
    with pytest.raises(ValueError, match="group_size=64 does not divide the layer's 96 inputs"):
        quant_error_figure(torch.randn(8, 96), "int4", 64)
    assert histogram_total(quant_error_figure(torch.randn(8, 96), "int8", 64)) == 8 * 96  # int8 has no groups


def test_figure_is_deterministic_and_pure() -> None:
    assert quant_error_figure(planted()).to_json() == quant_error_figure(planted()).to_json()
    code = ("import sys, torch; from minillm.widgets import quant_error_figure; "
            "quant_error_figure(torch.randn(4, 32), 'int4', 32); "
            "assert 'ipywidgets' not in sys.modules, 'the pure layer imported ipywidgets'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- the pure figure, on the shipped tiny model ----

def test_tiny_model_layer_matches_quant_linear(tiny_llm: LLM) -> None:
    layers = dict(decoder_linears(tiny_llm.llm_engine.model))
    down = layers["model.layers.0.mlp.down_proj"]  # 256 x 768
    for method, group_size, groups in (("int4", 128, 6), ("int8", 128, 1)):
        stats = quant_error_stats(down.weight, method, group_size)
        # The engine's own forward pass on the identity gives its dequantized weight, exactly.
        reference = QuantLinear(down, method, group_size)(torch.eye(down.in_features)).T
        assert np.array_equal(stats.dequantized, reference.numpy())  # the engine's formulas, not a copy
        fig = quant_error_figure(down.weight, method, group_size)
        assert np.array(trace(fig, "error").z).shape == (256, groups)
        assert histogram_total(fig) == down.weight.numel()
    gate_up = layers["model.layers.0.mlp.gate_up_proj"]  # 1536 rows: shown as the max over blocks of 6
    stats = quant_error_stats(gate_up.weight, "int4", 32)
    z = np.array(trace(quant_error_figure(gate_up.weight, "int4", 32), "error").z)
    assert z.shape == (256, 8)
    assert z == pytest.approx(stats.group_rms_error.reshape(256, 6, 8).max(axis=1))


# ---- the view ----

def shown(view: QuantError) -> go.Figure:
    """The figure the view shows right now, whichever widget holds it."""
    if isinstance(view.plot, ipywidgets.Output):
        (output,) = view.plot.outputs
        return go.Figure(output["data"]["application/vnd.plotly.v1+json"])
    return go.Figure(view.plot)


def test_view_switches_layer_method_and_group_size(tiny_llm: LLM) -> None:
    view = QuantError(tiny_llm)
    names = [name for name, _ in decoder_linears(tiny_llm.llm_engine.model)]
    assert [value for _, value in view.layer.options] == names and view.layer.value == names[0]
    assert isinstance(view, ipywidgets.VBox) and view.plot in view.children
    first = shown(view)
    assert first.layout.title.text.startswith(f"{names[0]} · int4, groups of 128 inputs<br><sup>weight 512 × 256")
    view.layer.value = "model.layers.3.mlp.down_proj"
    after = shown(view)
    assert after.layout.title.text.startswith("model.layers.3.mlp.down_proj · int4, groups of 128 inputs<br><sup>"
                                              "weight 256 × 768")
    assert np.array(trace(after, "error").z).shape == (256, 6)
    assert list(trace(after, "weights").y) != list(trace(first, "weights").y)  # redrawn, not just retitled
    down = dict(decoder_linears(tiny_llm.llm_engine.model))["model.layers.3.mlp.down_proj"].weight
    assert list(trace(after, "max |w|").y) == pytest.approx(down.abs().amax(dim=0).tolist())
    view.group_size.value = 32
    assert "groups of 32 inputs" in shown(view).layout.title.text
    assert np.array(trace(shown(view), "error").z).shape == (256, 24)
    view.method.value = "int8"
    assert view.group_size.disabled and len(level_values(shown(view))) == 255
    assert "int8, one scale per output channel" in shown(view).layout.title.text
    assert repr(view) == "QuantError(layer='model.layers.3.mlp.down_proj', int8)"
    view.method.value = "int4"
    assert not view.group_size.disabled and len(level_values(shown(view))) == 16
    assert repr(view) == "QuantError(layer='model.layers.3.mlp.down_proj', int4, group_size=32)"


def test_view_sources_and_bad_arguments(tiny_llm: LLM) -> None:
    model = tiny_llm.llm_engine.model
    for source in (tiny_llm.llm_engine, model):
        assert QuantError(source, "int8", layer="model.layers.1.self_attn.o_proj").layer.value.endswith("o_proj")
    with pytest.raises(ValueError, match="method must be one of"):
        QuantError(tiny_llm, method="int2")
    with pytest.raises(ValueError, match="group_size must be one of"):
        QuantError(tiny_llm, group_size=100)
    with pytest.raises(ValueError, match="layer must be one of"):
        QuantError(tiny_llm, layer="lm_head")
    with pytest.raises(TypeError, match="got str"):
        QuantError("tiny")


def test_view_refuses_a_quantized_model_and_reports_groups_that_do_not_fit() -> None:
    torch.manual_seed(0)
    quantized = nn.Module()
    quantized.layers = nn.ModuleList([QuantLinear(nn.Linear(64, 64), "int8", 128)])
    with pytest.raises(ValueError, match=r"already quantized \(int8\)"):
        QuantError(quantized)
    odd = nn.Module()
    odd.layers = nn.ModuleList([nn.Linear(96, 8), nn.Linear(128, 8)])  # 96 inputs: no groups of 64 or 128
    view = QuantError(odd, "int4", 32)
    drawn = shown(view).to_plotly_json()
    view.group_size.value = 64
    assert "group_size=64 does not divide the layer's 96 inputs" in view.message.value
    assert shown(view).to_plotly_json() == drawn  # the last chart that could be drawn stays
    view.layer.value = "layers.1"
    assert view.message.value == "" and "weight 8 × 128" in shown(view).layout.title.text


def test_view_on_colab_uses_an_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "google.colab", sys.modules[__name__])  # any module will do
    monkeypatch.setattr(pio.renderers, "default", "plotly_mimetype")  # as JupyterLab's (Colab's is HTML)
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(64, 16), nn.Linear(128, 16)])
    view = QuantError(model, "int4", 32)
    assert isinstance(view.plot, ipywidgets.Output)
    view.layer.value = "layers.1"
    assert len(view.plot.outputs) == 1 and "weight 16 × 128" in shown(view).layout.title.text
