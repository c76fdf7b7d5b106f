"""What weight-only quantization does to one linear layer: the layer's weights against the levels
one group can take, the rounding error of every group, and the input channels whose weights stand
out.

Everything is computed with the formulas of minillm/quant (quantize, unpack, dequantize), in the
weight's own dtype, as QuantLinear does; nothing here rounds a weight by itself.

The error of a group is its RMS rounding error in weight units, sqrt(mean((dequantized - w)^2)).
Rounding to the nearest of evenly spaced levels errs by about spacing / sqrt(12), and the spacing
is the group's range / 15 (int4) or its row's max|w| / 127 (int8): one large weight widens the
range, so every weight of its group (int4) or of its whole row (int8) rounds coarser. Measured
relative to the spacing or the range, every group would look the same; in weight units, the
groups with an outlier stand out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from minillm.quant import INT4_GROUP_SIZES, QUANTIZATION_METHODS
from minillm.quant.int4 import dequantize_int4, pack_int4, quantize_int4, unpack_int4
from minillm.quant.int8 import dequantize_int8, quantize_int8

WIDTH = 760  # px, as the other views
HEIGHT = 980
HISTOGRAM_BINS = 120
MAX_HEATMAP_CELLS = 256  # per axis; larger layers are shown as the max over blocks of rows / groups
TOP_CHANNELS = 5
BAR_COLOR = "#9aa5b1"
LEVEL_COLOR = "#1f77b4"
OUTLIER_COLOR = "#d62728"
ERROR_SCALE = "Viridis"


@dataclass(frozen=True)
class QuantErrorStats:
    """The numbers behind `quant_error_figure`, as float32 numpy arrays of a weight [out, in].

    For int8 a row is one group (one scale per output channel): `group_size` is then `in`.
    """

    method: str
    group_size: int
    weight: np.ndarray  # [out, in]
    dequantized: np.ndarray  # [out, in], what QuantLinear computes with
    group_rms_error: np.ndarray  # [out, in // group_size], weight units
    group_max_error: np.ndarray  # [out, in // group_size], the largest |dequantized - w| in the group
    group_spacing: np.ndarray  # [out, in // group_size], the distance between two adjacent levels
    input_channel_max: np.ndarray  # [in], max |w| over the rows
    row: int  # the group whose levels are drawn: row `row`, inputs group * group_size ...
    group: int
    levels: np.ndarray  # [16] (int4) or [255] (int8), ascending
    level_counts: np.ndarray  # how many of that group's weights round to each level

    @property
    def num_groups(self) -> int:
        return self.group_rms_error.shape[1]

    @property
    def rms_error(self) -> float:
        return float(np.sqrt(np.mean((self.dequantized - self.weight) ** 2)))

    @property
    def top_channels(self) -> np.ndarray:
        """The input channels with the largest max |w|, largest first."""
        k = min(TOP_CHANNELS, self.input_channel_max.size)
        return np.argsort(-self.input_channel_max, kind="stable")[:k]


def check_quant_args(method: str, group_size: int, in_features: int | None = None) -> None:
    """ValueError naming the argument, as `LLM(quantization=..., quant_group_size=...)` would refuse it."""
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"method must be one of {QUANTIZATION_METHODS}, got {method!r}")
    if method == "int4":
        if group_size not in INT4_GROUP_SIZES:
            raise ValueError(f"group_size must be one of {INT4_GROUP_SIZES} for int4, got {group_size!r}")
        if in_features is not None and in_features % group_size:
            raise ValueError(f"group_size={group_size} does not divide the layer's {in_features} inputs; "
                             f"int4 needs whole groups")


def quant_error_stats(weight: torch.Tensor | np.ndarray, method: str = "int4", group_size: int = 128, *,
                      row: int | None = None, group: int | None = None) -> QuantErrorStats:
    """Quantize `weight` [out, in] with `method` ("int8": per output channel, `group_size` unused;
    "int4": groups of `group_size` inputs) and measure the error.

    The levels are those of row `row` (default: the row holding the largest |w|) and, for int4, of
    its group `group` (default: the group holding that row's largest |w|)."""
    w = torch.as_tensor(weight).detach().cpu()
    if w.dim() != 2:
        raise ValueError(f"weight must be 2-D [out, in], got shape {tuple(w.shape)}")
    if not w.is_floating_point():
        w = w.float()
    out_features, in_features = w.shape
    check_quant_args(method, group_size, in_features)
    magnitude = w.float().abs()
    if row is None:
        row = int(magnitude.argmax()) // in_features
    elif not 0 <= row < out_features:
        raise ValueError(f"row must be in [0, {out_features}), got {row}")
    if method == "int8":
        group_size = in_features
        qweight, scales = quantize_int8(w)
        dequantized = dequantize_int8(qweight, scales)
        spacing = scales.float()[:, None]
        if group not in (None, 0):
            raise ValueError(f"group must be 0 (or None) for int8, whose group is the whole row; got {group}")
        group = 0
        # Every level of the row: q = -127 ... 127, through the same dequantize.
        grid = torch.arange(-127, 128, dtype=torch.int8)[None]
        levels = dequantize_int8(grid, scales[row:row + 1])[0]
        level_counts = np.bincount(qweight[row].int().numpy() + 127, minlength=255)
    else:
        packed, scales, zeros = quantize_int4(w, group_size)
        dequantized = dequantize_int4(packed, scales, zeros, group_size)
        spacing = scales.float()
        num_groups = in_features // group_size
        if group is None:
            group = int(magnitude[row].argmax()) // group_size
        elif not 0 <= group < num_groups:
            raise ValueError(f"group must be in [0, {num_groups}), got {group}")
        # Every level of that group: a row of q = 0, 1, ..., 15, 0, 1, ... packed and dequantized
        # with the group's scale and zero point.
        grid = pack_int4(torch.arange(group_size).remainder(16)[None])
        scale, zero = scales[row:row + 1, group:group + 1], zeros[row:row + 1, group:group + 1]
        levels = dequantize_int4(grid, scale, zero, group_size)[0, :16]
        q = unpack_int4(packed[row:row + 1])[0, group * group_size:(group + 1) * group_size]
        level_counts = np.bincount(q.int().numpy(), minlength=16)
    w32 = w.float().numpy()
    deq32 = dequantized.float().numpy()
    err = (deq32 - w32).reshape(out_features, -1, group_size)
    return QuantErrorStats(
        method=method, group_size=group_size, weight=w32, dequantized=deq32,
        group_rms_error=np.sqrt(np.mean(err.astype(np.float64) ** 2, axis=2)).astype(np.float32),
        group_max_error=np.abs(err).max(axis=2),
        group_spacing=np.broadcast_to(spacing.numpy(), err.shape[:2]).copy(),
        input_channel_max=magnitude.amax(dim=0).numpy(),
        row=row, group=group, levels=levels.float().numpy(), level_counts=level_counts)


def quant_error_figure(weight: torch.Tensor | np.ndarray, method: str = "int4", group_size: int = 128, *,
                       name: str = "", row: int | None = None, group: int | None = None) -> go.Figure:
    """Three panels for one layer's weight [out, in], quantized with `method` / `group_size`:

    (a) histogram of all its weights (log count), with the levels of one group: the 16 int4 levels
        as lines, or, for int8, the row's 255 levels as ticks under the bars (as lines they would
        only grey the chart out);
    (b) RMS rounding error of every group, output channel x input channel (int8: one group per row);
    (c) max |w| of every input channel, the largest few marked; x lines up with (b).
    """
    stats = quant_error_stats(weight, method, group_size, row=row, group=group)
    out_features, in_features = stats.weight.shape
    fig = make_subplots(rows=3, cols=1, row_heights=[0.36, 0.38, 0.26], vertical_spacing=0.12,
                        subplot_titles=(_histogram_title(stats), _error_title(stats), _channel_title(stats)))
    _add_histogram(fig, stats)
    _add_error_heatmap(fig, stats)
    _add_channel_max(fig, stats)
    weight_rms = float(np.sqrt(np.mean(stats.weight.astype(np.float64) ** 2)))
    scheme = ("int8, one scale per output channel" if method == "int8"
              else f"int4, groups of {stats.group_size} inputs")
    title = f"{name} · " if name else ""
    relative = f" ({stats.rms_error / weight_rms:.1%} of the weights' RMS)" if weight_rms > 0 else ""
    fig.update_layout(
        # The shape goes on the second line: long layer names fill the first at this width.
        title=dict(text=f"{title}{scheme}<br><sup>weight {out_features} × {in_features} · RMS rounding error "
                        f"{_num(stats.rms_error)}{relative}</sup>"),
        width=WIDTH, height=HEIGHT, template="plotly_white", bargap=0, showlegend=False,
        margin=dict(l=70, r=30, t=100, b=50))
    for annotation in fig.layout.annotations:  # the subplot titles: smaller, and left-aligned
        annotation.update(font=dict(size=12), x=0, xanchor="left", align="left")
    return fig


def _histogram_title(stats: QuantErrorStats) -> str:
    used = int(np.count_nonzero(stats.level_counts))
    if stats.method == "int8":
        where = f"row {stats.row}"
        what = f"its 255 int8 levels are the ticks, {_num(stats.levels[1] - stats.levels[0])} apart"
    else:
        lo, hi = stats.group * stats.group_size, (stats.group + 1) * stats.group_size - 1
        where = f"row {stats.row}, inputs {lo}–{hi}"
        what = f"its 16 int4 levels are the lines, {_num(stats.levels[1] - stats.levels[0])} apart"
    return (f"(a) All weights (bars) and the levels of {where}: {what}.<br>"
            f"its {stats.group_size} weights use {used} of the {stats.levels.size} levels "
            "(hover a level for its count)")


def _error_title(stats: QuantErrorStats) -> str:
    if stats.method == "int8":
        return ("(b) RMS error per row (int8 has one scale per output channel):<br>"
                "a row with a large weight has wide level spacing, so all its weights round coarser")
    return (f"(b) RMS error per group of {stats.group_size} inputs: a large weight stretches "
            "its group's 16 levels,<br>so the whole group rounds coarser; the other groups of its row keep theirs")


def _channel_title(stats: QuantErrorStats) -> str:
    top = stats.top_channels
    median = float(np.median(stats.input_channel_max))
    ratio = f", {stats.input_channel_max[top[0]] / median:.1f}× the median channel" if median > 0 else ""
    return (f"(c) Largest |w| of each input channel (the groups above are consecutive channels);<br>"
            f"the top {top.size} are marked, channel {top[0]} largest{ratio}")


def _add_histogram(fig: go.Figure, stats: QuantErrorStats) -> None:
    values = stats.weight.ravel()
    lo, hi = float(values.min()), float(values.max())
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    counts, edges = np.histogram(values, bins=HISTOGRAM_BINS, range=(lo, hi))
    centers = (edges[:-1] + edges[1:]) / 2
    fig.add_trace(go.Bar(
        x=centers.tolist(), y=counts.tolist(), width=float(edges[1] - edges[0]), name="weights",
        marker=dict(color=BAR_COLOR, line=dict(width=0)),
        hovertext=[f"{_num(a)} to {_num(b)}: {c} weights" for a, b, c in zip(edges[:-1], edges[1:], counts)],
        hoverinfo="text"), row=1, col=1)
    top = float(max(counts.max(), 1)) * 3
    floor = 0.4  # below a count of 1, on the log axis: room for the int8 ticks
    levels, level_counts = stats.levels.tolist(), stats.level_counts.tolist()
    texts = [f"level q={q}: {_num(v)}, {n} of the group's weights round here"
             for q, (v, n) in enumerate(zip(levels, level_counts), start=-127 if stats.method == "int8" else 0)]
    if stats.method == "int4":
        x, y, hover = [], [], []
        for value, text in zip(levels, texts):
            x += [value, value, None]
            y += [floor, top, None]
            hover += [text, text, None]
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name="levels", line=dict(color=LEVEL_COLOR, width=1),
                                 hovertext=hover, hoverinfo="text"), row=1, col=1)
    else:
        fig.add_trace(go.Scatter(x=levels, y=[0.6] * len(levels), mode="markers", name="levels",
                                 marker=dict(symbol="line-ns-open", size=9, color=LEVEL_COLOR),
                                 hovertext=texts, hoverinfo="text"), row=1, col=1)
    fig.update_xaxes(title_text="weight value", row=1, col=1)
    fig.update_yaxes(title_text="weights (log scale)", type="log", range=[np.log10(floor), np.log10(top)],
                     row=1, col=1)


def _add_error_heatmap(fig: go.Figure, stats: QuantErrorStats) -> None:
    out_features, num_groups = stats.group_rms_error.shape
    row_block = -(-out_features // MAX_HEATMAP_CELLS)
    group_block = -(-num_groups // MAX_HEATMAP_CELLS)
    z = _max_pool(stats.group_rms_error, row_block, group_block)
    worst = _max_pool(stats.group_max_error, row_block, group_block)
    spacing = _max_pool(stats.group_spacing, row_block, group_block)
    width = stats.group_size * group_block  # input channels per cell
    in_features = stats.weight.shape[1]
    # Cell edges, not centres: a single column (int8) has no spacing to infer a width from.
    x = [min(j * width, in_features) - 0.5 for j in range(z.shape[1] + 1)]
    y = [min(i * row_block, out_features) - 0.5 for i in range(z.shape[0] + 1)]
    bottom_top = fig.layout.yaxis2.domain  # the colour bar spans this panel only
    hover = []
    for i in range(z.shape[0]):
        rows = f"row {i * row_block}" if row_block == 1 else (
            f"rows {i * row_block}–{min((i + 1) * row_block, out_features) - 1} (the largest)")
        hover.append([f"{rows}, inputs {j * width}–{min((j + 1) * width, in_features) - 1}<br>"
                      f"RMS error {_num(z[i, j])}, max error {_num(worst[i, j])}<br>"
                      f"level spacing {_num(spacing[i, j])}" for j in range(z.shape[1])])
    fig.add_trace(go.Heatmap(
        x=x, y=y, z=z.tolist(), name="error", colorscale=ERROR_SCALE, zmin=0, hovertext=hover, hoverinfo="text",
        colorbar=dict(title=dict(text="RMS error", side="right"), thickness=12, len=bottom_top[1] - bottom_top[0],
                      y=sum(bottom_top) / 2, yanchor="middle")),
        row=2, col=1)
    fig.update_xaxes(title_text="input channel", range=[-0.5, in_features - 0.5], row=2, col=1)
    fig.update_yaxes(title_text="output channel", range=[out_features - 0.5, -0.5], row=2, col=1)


def _add_channel_max(fig: go.Figure, stats: QuantErrorStats) -> None:
    channel_max = stats.input_channel_max
    fig.add_trace(go.Scatter(
        x=list(range(channel_max.size)), y=channel_max.tolist(), mode="lines", name="max |w|",
        line=dict(color=BAR_COLOR, width=1), hovertemplate="input channel %{x}: max |w| %{y:.3g}<extra></extra>"),
        row=3, col=1)
    top = stats.top_channels
    fig.add_trace(go.Scatter(
        x=top.tolist(), y=channel_max[top].tolist(), mode="markers+text", name="outlier channels",
        text=[f"{c}" for c in top.tolist()], textposition="top center", textfont=dict(color=OUTLIER_COLOR, size=10),
        marker=dict(color=OUTLIER_COLOR, size=7),
        hovertemplate="input channel %{x}: max |w| %{y:.3g} (top " + str(top.size) + ")<extra></extra>"),
        row=3, col=1)
    fig.update_xaxes(title_text="input channel", matches="x2", row=3, col=1)
    fig.update_yaxes(title_text="max |w|", rangemode="tozero", range=[0, float(channel_max.max()) * 1.2 or 1],
                     row=3, col=1)


def _max_pool(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """The max over blocks of `rows` x `cols` (the last blocks may be smaller)."""
    if rows == cols == 1:
        return a
    out = np.maximum.reduceat(a, np.arange(0, a.shape[0], rows), axis=0)
    return np.maximum.reduceat(out, np.arange(0, a.shape[1], cols), axis=1)


def _num(x: float) -> str:
    """A weight-sized number, 3 significant digits, as plotly's ".3g" writes it."""
    return f"{float(x):.3g}"
