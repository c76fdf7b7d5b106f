"""`minillm bench step`: the host time of one decode step of the engine, split into its phases.

A small model's decode step is bound by what the CPU does around the kernels: scheduling, building
the inputs, launching the kernels, reading the sampled tokens back, bookkeeping. This benchmark
times each phase of `LLMEngine.step()` by wrapping the engine's own methods for the duration of
the measurement: `Scheduler.schedule`, `ModelRunner.prepare`, `execute` and `sample`, the step's
`get_output` ("wait": its tokens read back), and `Scheduler.update`; "other" is the rest of the
step (output processing). An older engine has a
single `ModelRunner.run` for prepare, execute and sample, and updates inside `step()`: it is timed
as "runner" and its update falls in "other".

With `--speculative-config` every step is a speculative one, and its runner phases are the
proposer's `propose` (the k draft steps, or the n-gram lookup), the target's prepare and execute,
and `verify`, the rejection sampler in place of the sampler: what c and v of `bench spec` are made
of, on the host. Its requests draft from random prompts, so the tokens per step are whatever the
draft's acceptance gives.

The times are the CPU's: nothing synchronizes inside a step. On a GPU, execute and sample only
queue kernels (and the copy of the sampled tokens to the host), and wait (verify, when speculating)
waits for them when it reads the tokens, so the device's time shows up there: a draft model's too,
since `propose` only queues its steps. (An engine older than the split of sample and wait shows its
wait in sample.)

With `--baseline REV` the same measurement runs on REV's engine in a subprocess, against a
temporary git worktree of REV (or a folder holding REV's tree, exported where the git history is,
for a machine that has none); there this file is run by path, so it imports nothing from minillm
but the public API that every revision has.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from time import perf_counter
from unittest import mock

import torch
from tqdm.auto import tqdm

import minillm
from minillm import LLM, SamplingParams

PROMPT_LEN = 32
WARMUP_STEPS = 5
# Phase -> (the path to an object of the engine, its method). What an engine lacks is not timed on its own.
PHASES = {"schedule": ("scheduler", "schedule"), "propose": ("model_runner.proposer", "propose"),
          "prepare": ("model_runner", "prepare"), "execute": ("model_runner", "execute"),
          "sample": ("model_runner", "sample"), "verify": ("model_runner", "rejection_sampler"),
          # The class of the outputs the runner's steps return, found in the runner's module.
          "wait": ("model_runner:AsyncModelRunnerOutput", "get_output"),
          "update": ("scheduler", "update")}
RUNNER_PHASES = ("propose", "prepare", "execute", "sample", "verify", "wait")
CURRENT = "working tree"
COLUMNS = [("version", "version"), ("batch", "batch"), ("schedule_us", "schedule"), ("propose_us", "propose"),
           ("prepare_us", "prepare"), ("execute_us", "execute"), ("sample_us", "sample"), ("verify_us", "verify"),
           ("wait_us", "wait"),
           ("runner_us", "runner"), ("update_us", "update"), ("other_us", "other"), ("total_us", "total"),
           ("median_us", "median"), ("p90_us", "p90"), ("tokens_per_step", "tokens/step"),
           ("tokens_per_s", "tokens/s"), ("vs_before", "x before")]
CAPTION = ("host µs per decode step: the phases' means (they add up to the mean total; runner: the model runner's "
           "phases together), the total's median and 90th percentile, tokens per step and per second (means), "
           "and the median over the baseline's (x before); blank: no such method in that version's engine (an engine "
           "without Scheduler.update counts the update in other), or no speculation (propose, verify)")


class PhaseClock:
    """Seconds spent in each wrapped method, less the time of wrapped methods it calls itself, so
    that nothing counts twice whichever phase calls which."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._nested: list[float] = []  # per open call: seconds of the wrapped calls inside it

    def wrap(self, phase: str, method: Callable) -> Callable:
        def timed(*args, **kwargs):
            self._nested.append(0.0)
            start = perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                elapsed = perf_counter() - start
                self.seconds[phase] += elapsed - self._nested.pop()
                self.calls[phase] += 1
                if self._nested:
                    self._nested[-1] += elapsed

        return timed

    def lap(self, phases: list[str]) -> dict[str, float]:
        """Seconds per phase since the last lap."""
        lap = {phase: self.seconds[phase] for phase in phases}
        self.seconds.clear()
        return lap


def phase_methods(engine) -> dict[str, tuple[object, str]]:
    """Phase -> (object, attribute) of what this engine's step calls: a speculative engine's steps
    verify rather than sample; an engine without speculation has no proposer or rejection sampler."""
    found = {}
    for phase, (path, name) in PHASES.items():
        path, _, class_name = path.partition(":")
        owner = engine
        for attribute in path.split("."):
            owner = getattr(owner, attribute, None)
        if class_name:
            owner = getattr(sys.modules[type(owner).__module__], class_name, None)
        if getattr(owner, name, None) is not None:
            found[phase] = (owner, name)
    if "verify" in found:  # a speculative step reads its tokens in verify
        del found["sample"]
        found.pop("wait", None)
    if not any(phase in found for phase in RUNNER_PHASES) and hasattr(engine.model_runner, "run"):
        found["runner"] = (engine.model_runner, "run")
    if "schedule" not in found or not {"runner", *RUNNER_PHASES} & found.keys():
        raise RuntimeError(f"bench step does not know this engine: it found only {sorted(found)}")
    return found


@contextmanager
def timed_phases(engine, clock: PhaseClock) -> Iterator[list[str]]:
    """The engine's phase methods replaced by timed wrappers on its objects; yields the phases."""
    methods = phase_methods(engine)
    with ExitStack() as stack:
        for phase, (owner, name) in methods.items():
            stack.enter_context(mock.patch.object(owner, name, clock.wrap(phase, getattr(owner, name))))
        yield list(methods)


def _synchronize() -> None:
    # Only around the timed steps: work queued before them must not be billed to them.
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    elif torch.backends.mps.is_available():
        torch.mps.synchronize()


def _decode_steps(llm: LLM, batch: int, steps: int, bar: tqdm, warmup: int = WARMUP_STEPS,
                  max_step_tokens: int = 1) -> list[dict[str, float]]:
    """Per timed step of `batch` decoding requests, after `warmup` untimed ones: seconds per phase, the
    step's ("total") and the tokens it made; max_step_tokens: the most a request makes in a step (k + 1
    where it speculates k)."""
    engine = llm.llm_engine
    rng = random.Random(batch)
    # Prefill takes `batch` steps at most, each of which may give the requests admitted so far tokens;
    # the last timed step must not finish them either.
    params = SamplingParams(temperature=0, max_tokens=(batch + warmup + steps + 1) * max_step_tokens, ignore_eos=True)
    ids = [f"step-{batch}-{i}" for i in range(batch)]
    for request_id in ids:
        # Ids below 256 exist in every vocabulary; the shapes are what matter.
        engine.add_request(request_id, {"prompt_token_ids": [rng.randrange(1, 256) for _ in range(PROMPT_LEN)]},
                           params)
    emitted = {request_id: 0 for request_id in ids}  # each request's tokens so far

    def count(outputs: list) -> None:
        emitted.update((out.request_id, len(out.outputs[0].token_ids)) for out in outputs)

    for _ in range(batch * PROMPT_LEN):  # a step prefills one token at least
        count(engine.step())
        if all(emitted.values()):
            break
    else:
        raise RuntimeError(f"{list(emitted.values()).count(0)} of {batch} requests never produced a token")
    for _ in range(warmup):
        count(engine.step())
    clock = PhaseClock()
    per_step = []
    _synchronize()
    with timed_phases(engine, clock) as phases:
        for _ in range(steps):
            before = sum(emitted.values())
            start = perf_counter()
            outputs = engine.step()
            total = perf_counter() - start
            count(outputs)
            if len(outputs) != batch or any(out.finished for out in outputs):
                raise RuntimeError(f"a timed step was not a decode step of {batch} requests")
            per_step.append({**clock.lap(phases), "total": total, "tokens": sum(emitted.values()) - before})
            bar.update()
    _synchronize()
    for request_id in ids:
        engine.abort_request(request_id)
    missed = [phase for phase in phases if clock.calls[phase] < steps]
    if missed:
        raise RuntimeError(f"{missed} not called in every step: the engine no longer calls them on its objects")
    return per_step


def _summarize(batch: int, per_step: list[dict[str, float]]) -> dict:
    phases = [phase for phase in per_step[0] if phase not in ("total", "tokens")]
    row: dict = {"batch": batch, "steps": len(per_step), "phases": phases}
    for phase in phases:
        row[f"{phase}_us"] = statistics.fmean(step[phase] for step in per_step) * 1e6
    if "runner" not in phases:
        row["runner_us"] = sum(row[f"{phase}_us"] for phase in RUNNER_PHASES if phase in phases)
    totals = [step["total"] * 1e6 for step in per_step]
    row["total_us"] = statistics.fmean(totals)
    row["other_us"] = row["total_us"] - sum(row[f"{phase}_us"] for phase in phases)
    row["median_us"] = statistics.median(totals)
    row["p90_us"] = statistics.quantiles(totals, n=10)[-1]
    row["tokens_per_step"] = statistics.fmean(step["tokens"] for step in per_step)
    row["tokens_per_s"] = row["tokens_per_step"] / row["total_us"] * 1e6  # the means' rate
    return row


def host_phases(llm: LLM, batch: int = 1, steps: int = 3, warmup: int = WARMUP_STEPS) -> dict:
    """The phases of `steps` decode steps of `batch` requests on this engine, after `warmup` untimed ones
    (fewer will do where its kernels ran already), as a row of `minillm bench step`: `{phase}_us` for each
    of `phases`, "other" and "total". The engine must hold no request."""
    spec = llm.llm_engine.config.speculative
    with tqdm(total=steps, disable=True) as bar:
        return _summarize(batch, _decode_steps(llm, batch, steps, bar, warmup,
                                               1 + (spec.num_speculative_tokens if spec else 0)))


def measure(model: str, batch_sizes: list[int], steps: int, device: str | None, dtype: str,
            speculative_config: dict | None = None, async_scheduling: bool = False) -> dict:
    """The phases of `steps` decode steps at each batch size, on the `minillm` this imported."""
    # Requests never finish within a measurement, and their token ids need no tokenizer.
    k = speculative_config.get("num_speculative_tokens", 0) if speculative_config else 0
    spec = {"speculative_config": speculative_config} if speculative_config else {}
    if async_scheduling:
        spec["async_scheduling"] = True
    llm = LLM(model, device=device, dtype=dtype, skip_tokenizer_init=True, max_num_seqs=max(batch_sizes),
              max_model_len=PROMPT_LEN + (max(batch_sizes) + WARMUP_STEPS + steps + 2) * (1 + k), **spec)
    rows = []
    with tqdm(total=len(batch_sizes) * steps, desc="bench step", leave=False) as bar:
        for batch in batch_sizes:
            rows.append(_summarize(batch, _decode_steps(llm, batch, steps, bar, max_step_tokens=1 + k)))
    return {"minillm": minillm.__file__, "rows": rows}


def side_by_side(results: dict[str, dict]) -> list[dict]:
    """One row per batch size and version, versions in the order given (before, then after); each
    version after the first gets its median total over the first's."""
    before, *_ = results
    medians = {row["batch"]: row["median_us"] for row in results[before]["rows"]}
    rows = [{"version": version, **row} for version, result in results.items() for row in result["rows"]]
    for row in rows:
        if row["version"] != before:
            row["vs_before"] = row["median_us"] / medians[row["batch"]]
    return sorted(rows, key=lambda row: row["batch"])  # stable: the versions keep their order


def bench_step(model: str, batch_sizes: list[int], steps: int, device: str | None = None, dtype: str = "auto",
               baseline: str | None = None, speculative_config: dict | None = None,
               async_scheduling: bool = False) -> tuple[list[dict], dict]:
    """The phases on this tree's engine and, with `baseline` (a git revision), on that revision's first;
    speculative_config: every step speculates, as `LLM(speculative_config=...)`; async_scheduling:
    each step is queued before the one before is read, so a step's phases are the next step's
    schedule, prepare, execute and sample and the step before's wait, update and outputs."""
    if steps < 2:
        raise ValueError(f"--steps must be at least 2 (for a 90th percentile), got {steps}")
    config = {"model": model, "batch_sizes": batch_sizes, "steps": steps, "device": device, "dtype": dtype}
    if speculative_config:  # only then: an older revision's engine may not speculate
        config["speculative_config"] = speculative_config
    if async_scheduling:
        config["async_scheduling"] = True
    results = {}
    if baseline is not None:
        # Imported here: the worker runs this file against a revision that may not have it.
        from minillm.bench.revision import checkout, run_against

        with checkout(baseline) as (tree, sha), tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "bench-step.json"
            run_against(tree, Path(__file__), json.dumps(config), str(out))
            results[f"{baseline} ({sha})"] = json.loads(out.read_text())
    results[CURRENT] = measure(**config)
    rows = side_by_side(results)
    summary = {"minillm": {version: result["minillm"] for version, result in results.items()},
               "vs_before": {str(row["batch"]): row["vs_before"] for row in rows if "vs_before" in row}}
    return rows, summary


def _worker(config: str, out: str) -> None:
    """The measurement on another revision's `minillm`, which must be the one in the current folder
    (the worktree), not an installed one."""
    if not Path(minillm.__file__).resolve().is_relative_to(Path.cwd().resolve()):
        raise RuntimeError(f"minillm was imported from {minillm.__file__}, not from the worktree {Path.cwd()}")
    Path(out).write_text(json.dumps(measure(**json.loads(config))))


if __name__ == "__main__":
    _worker(*sys.argv[1:])
