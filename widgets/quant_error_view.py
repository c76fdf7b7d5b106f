"""`QuantError`: the panels of quant_error.py for any linear layer of a model's decoder, picked from
a dropdown, with the quantization method and the int4 group size as toggles.

    view = QuantError(llm)           # LLM("tiny"), not quantized: the view quantizes each layer itself
    view.layer.value = "model.layers.3.mlp.down_proj"

It needs the full-precision weights, so the model must not be quantized already: a QuantLinear
keeps only the rounded values, and the error of rounding them again would read as (nearly) zero.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ipywidgets
import plotly.graph_objects as go
from torch import nn

from minillm.layers.quant_linear import QuantLinear, decoder_linears
from minillm.quant import INT4_GROUP_SIZES, QUANTIZATION_METHODS

from .figure_host import make_host
from .quant_error import check_quant_args, quant_error_figure

if TYPE_CHECKING:
    from minillm.engine.llm_engine import LLMEngine
    from minillm.llm import LLM


class QuantError(ipywidgets.VBox):
    def __init__(self, source: LLM | LLMEngine | nn.Module, method: str = "int4", group_size: int = 128, *,
                 layer: str | None = None) -> None:
        """source: an `LLM`, an `LLMEngine` or the torch model itself, not quantized; `layer`: the
        name of the decoder linear layer shown first (default: the first one)."""
        check_quant_args(method, group_size)
        # An nn.Module is the model itself (LlamaForCausalLM has a `.model` too: its inner decoder).
        model = source if isinstance(source, nn.Module) else getattr(getattr(source, "llm_engine", source), "model",
                                                                      None)
        if not isinstance(model, nn.Module):
            raise TypeError(f"QuantError shows the layers of an LLM, an LLMEngine or an nn.Module; "
                            f"got {type(source).__name__}")
        linears = decoder_linears(model)
        if not linears:
            raise ValueError("this model has no linear layers in its decoder (named '...layers.N...')")
        quantized = [module for _, module in linears if isinstance(module, QuantLinear)]
        if quantized:
            raise ValueError(f"this model is already quantized ({quantized[0].method}), so its full-precision "
                             "weights are gone; show the model before quantization (e.g. LLM(model) without "
                             "quantization=...): the view quantizes each layer itself")
        self.layers: dict[str, nn.Linear] = dict(linears)
        if layer is not None and layer not in self.layers:
            raise ValueError(f"layer must be one of the decoder's linear layers, e.g. {linears[0][0]!r}; "
                             f"got {layer!r}")
        self.layer = ipywidgets.Dropdown(
            description="layer", options=[(f"{name} ({m.out_features}×{m.in_features})", name)
                                          for name, m in linears],
            value=layer or linears[0][0], layout=ipywidgets.Layout(width="480px"))
        self.method = ipywidgets.ToggleButtons(description="method", options=list(QUANTIZATION_METHODS),
                                               value=method)
        self.group_size = ipywidgets.ToggleButtons(description="group size", options=list(INT4_GROUP_SIZES),
                                                   value=group_size if method == "int4" else 128,
                                                   disabled=method != "int4")
        self.message = ipywidgets.HTML()  # why a choice cannot be drawn (a group size that does not divide)
        self._host = make_host()
        super().__init__(children=[self.layer, self.method, self.group_size, self.message, self._host.widget])
        for control in (self.layer, self.method, self.group_size):
            control.observe(self._on_change, names="value")
        self.redraw()

    @property
    def plot(self) -> ipywidgets.DOMWidget:
        """The widget showing the chart: a plotly FigureWidget, or an ipywidgets Output (figure_host.py)."""
        return self._host.widget

    def figure(self) -> go.Figure:
        """The chart for the current choices, as a plain plotly figure."""
        return quant_error_figure(self.layers[self.layer.value].weight, self.method.value, self.group_size.value,
                                  name=self.layer.value)

    def redraw(self) -> None:
        self.group_size.disabled = self.method.value != "int4"
        try:
            fig = self.figure()
        except ValueError as error:  # e.g. int4 groups of 128 on a layer with 96 inputs
            self.message.value = f"<b>Cannot draw this:</b> {error}"
            return
        self.message.value = ""
        self._host.show(fig)

    def _on_change(self, change: dict) -> None:
        self.redraw()

    def __repr__(self) -> str:
        group = f", group_size={self.group_size.value}" if self.method.value == "int4" else ""
        return f"QuantError(layer={self.layer.value!r}, {self.method.value}{group})"
