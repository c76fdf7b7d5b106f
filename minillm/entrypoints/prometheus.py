"""GET /metrics: the engine's metrics (get_metrics) in Prometheus' text format, under vLLM's names,
written by prometheus_client. Counters gain their `_total` suffix there, as vLLM's do."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from minillm.engine.metrics import Counter, Histogram, Vector
from minillm.engine.metrics import Metric as EngineMetric


class _Snapshot:
    """A collector over one reading of the engine: each scrape reads the engine once, between steps."""

    def __init__(self, metrics: list[EngineMetric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for m in self.metrics:
            labels = dict(m.labels)
            if isinstance(m, Vector):  # one counter per position, as vLLM labels them
                for position, value in enumerate(m.values):
                    _family(families, m.name, CounterMetricFamily, [*labels, "position"]).add_metric(
                        [*labels.values(), str(position)], value)
            elif isinstance(m, Histogram):
                _family(families, m.name, HistogramMetricFamily, list(labels)).add_metric(
                    list(labels.values()), list(m.buckets.items()), m.sum)
            else:
                kind = CounterMetricFamily if isinstance(m, Counter) else GaugeMetricFamily
                _family(families, m.name, kind, list(labels)).add_metric(list(labels.values()), m.value)
        yield from families.values()


def _family(families: dict[str, Metric], name: str, kind: type, labels: list[str]) -> Metric:
    if name not in families:
        families[name] = kind(name, name.removeprefix("vllm:").replace("_", " "), labels=labels)
    return families[name]


def prometheus_text(metrics: list[EngineMetric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(metrics))
    return generate_latest(registry)
