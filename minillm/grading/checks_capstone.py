"""Checks for exercise 09, the capstone: the learner's pieces from exercises 00 to 08 plugged at once
into one engine, through the seams the exercises' last checks used, by the learner's own
`seams(llm, pieces)`; the engine then serves a workload and must give what the same engine with its
own pieces gives: the same tokens, and the same number of drafts accepted.

`seams` returns (owner, attribute, value) triples; the check sets them all for one run and puts the
engine's own values back afterwards, whatever happened. The engine is small on purpose, so that one
workload exercises every piece: a pool too small for every sequence at once (preemption), prompts
sharing a prefix (prefix hits), a step budget that chunks prompts beside decodes, INT4 weights,
greedy and seeded requests, and a draft model. The target's steps verify drafts with the prefill
kernel; the decode kernel runs the draft's steps, where a wrong one cannot change a token
(speculation keeps the target's output whatever the draft proposes) but does change how many drafts
are accepted, which is why that count is compared too. The sampler draws each request's first token,
the rejection sampler every later one.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from minillm.engine.scheduler import ScheduledBatch, Scheduler
from minillm.grading.capstone_pieces import EXERCISES, Pieces, piece_names
from minillm.grading.engine_check import LOGPROB_TOLERANCE
from minillm.grading.feedback import CheckFailed, call_learner, shape
from minillm.kv import pool as kv_pool
from minillm.kv.pool import kv_bytes_per_token
from minillm.layers.quant_linear import QuantLinear, decoder_linears
from minillm.llm import LLM
from minillm.models.loader import load_model
from minillm.outputs import RequestOutput
from minillm.sampling_params import SamplingParams

Seam = tuple[object, str, Any]

BLOCK_SIZE = 8  # small blocks, so that short prompts (few rows for the kernels) still fill and share them
POOL_BLOCKS = 4  # the budget below holds 4.5 blocks: two sequences at once outgrow it, and one is preempted
# The engine: 2 sequences at most, a step of 64 tokens at most. Your token_budget runs at exercise 07's cost
# and target, which allow 150 tokens a step: the cap binds, and the schedule is the engine's own (a budget
# decides how many drafts a step may verify, so another schedule would accept other drafts).
ENGINE = {"dtype": "float32", "quantization": "int4", "quant_group_size": 64, "block_size": BLOCK_SIZE,
          "max_model_len": 32, "max_num_seqs": 2, "max_num_batched_tokens": 64, "enforce_eager": True}
NUM_SPECULATIVE_TOKENS = 3
MAX_TOKENS = 6
PREFIX = "x = [1, 2, 3]\n"
# The first and the last share their first block (a prefix hit); the second outgrows the pool beside the first;
# the draft model guesses some of every request's tokens wrong (rejections).
PROMPTS = (PREFIX + "print(", "Once upon a time", PREFIX + "for")
# Greedy and seeded requests in turn: each seeded request draws from a generator of its own, so its tokens
# depend on its seed alone and are compared token for token, as greedy ones are.
SEEDED = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.05}
MAX_IDLE_STEPS = 20  # steps in a row that compute nothing: the engine has stalled
CALLED_BY_THE_CHECK = ("plan_kv_blocks",)  # it sizes the pool here, before any seam is set


def pool_budget(llm: LLM) -> int:
    """The bytes the KV pool may take: room for POOL_BLOCKS and a half of the target model's blocks."""
    engine = llm.llm_engine
    per_block = BLOCK_SIZE * kv_bytes_per_token(engine.model_config, engine.dtype)
    return POOL_BLOCKS * per_block + per_block // 2


def capstone_llm(model: str, draft_model: str, device: str | None = None) -> LLM:
    """The capstone's engine, with the KV pool the engine's own planner sizes from the capstone's budget."""
    llm = LLM(model, device=device, **ENGINE, num_kv_blocks=POOL_BLOCKS,
              speculative_config={"model": draft_model, "num_speculative_tokens": NUM_SPECULATIVE_TOKENS})
    engine = llm.llm_engine
    if kv_pool.plan_kv_blocks(engine.model_config, pool_budget(llm), BLOCK_SIZE, engine.dtype) != POOL_BLOCKS:
        raise ValueError("pool_budget must hold POOL_BLOCKS blocks")  # a guard on the constants above
    return llm


def requests() -> list[tuple[str, SamplingParams]]:
    return [(prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1,
                                    **({"temperature": 0.0} if i % 2 == 0 else {**SEEDED, "seed": i})))
            for i, prompt in enumerate(PROMPTS)]


_ORIGINAL_WEIGHTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def int4_weights(llm: LLM, quantize_int4: Callable, pack_int4: Callable) -> list[Seam]:
    """The seams of exercise 06: every INT4 layer of the model given the levels, scales and zero points your
    functions make from the checkpoint's weights, and the PyTorch matmul (which calls dequantize_int4)."""
    engine = llm.llm_engine
    if engine not in _ORIGINAL_WEIGHTS:  # the checkpoint's weights, and the PyTorch ops of a model built alone
        model = load_model(engine.model_path, engine.model_config, engine.dtype, engine.device)
        _ORIGINAL_WEIGHTS[engine] = ({name: m.weight for name, m in decoder_linears(model)}, model.ops)
    weights, reference_ops = _ORIGINAL_WEIGHTS[engine]
    seams: list[Seam] = []
    for name, layer in decoder_linears(engine.model):
        if not isinstance(layer, QuantLinear) or layer.method != "int4":
            continue
        case = f"layer {name}, weight {shape(weights[name])}, group_size={layer.group_size}"
        got = call_learner(quantize_int4, "quantize_int4", case, weights[name], layer.group_size)
        if not (isinstance(got, tuple) and len(got) == 3):
            raise CheckFailed(f"quantize_int4 returned {type(got).__name__}; expected (q, scales, zeros)\n  on: {case}")
        q, scales, zeros = got
        packed = call_learner(pack_int4, "pack_int4", case, q)
        for buffer, value in (("qweight", packed), ("scales", scales), ("zeros", zeros)):
            if shape(value) != shape(getattr(layer, buffer)):
                raise CheckFailed(f"for {case}, your functions give {buffer} {shape(value)}; the engine expects "
                                  f"{shape(getattr(layer, buffer))}")
            seams.append((layer, buffer, value))
        seams.append((layer, "ops", reference_ops))
    return seams


def check_pieces(pieces: Pieces) -> None:
    """Every piece was found in your notebooks, and none is still a `raise NotImplementedError()`."""
    if pieces.problems:
        raise CheckFailed("the capstone assembles your answers to exercises 00 to 08, from your notebooks beside "
                          "this one; finish these first:\n  " + "\n  ".join(pieces.problems))
    print(f"check_pieces passed: {len(piece_names())} pieces from exercises "
          f"{', '.join(sorted(set(EXERCISES.values())))}, each implemented")


def check_engine(seams: Callable[[LLM, Pieces], list[Seam]], pieces: Pieces, llm: LLM | None = None,
                 model: str = "tiny", draft_model: str = "tiny-draft", device: str | None = None) -> None:
    """The workload on llm (capstone_llm(model, draft_model, device) when not given, built once the pieces are
    known to be there) with every seam yours, against the same engine with its own pieces: the same tokens (and
    log-probabilities) and drafts accepted, within the engine's limits, every KV block free at the end."""
    if pieces.problems:
        raise CheckFailed("your engine needs every piece; finish these first:\n  " + "\n  ".join(pieces.problems))
    llm = llm or capstone_llm(model, draft_model, device)
    if llm.llm_engine.model_runner.rejection_sampler is None:
        raise CheckFailed("this check needs the capstone's engine, which speculates: create it with capstone_llm")
    _check_pool(pieces, llm)
    expected, expected_accepted = reference_outputs(llm)
    calls = {name: 0 for name in piece_names()}
    plugged = call_learner(seams, "seams", "the capstone's engine", llm, _counted(pieces, calls))
    with assembled(llm, _validated(plugged)):
        got, accepted = serve(llm, "your pieces")
    never = [n for n in piece_names() if n not in CALLED_BY_THE_CHECK and not calls[n]]
    if never:
        raise CheckFailed(f"your seams never called {', '.join(never)}: each piece must go where the engine calls it "
                          "(see the table of seams)")
    for i, ((prompt, params), want, have) in enumerate(zip(requests(), expected, got, strict=True)):
        _compare(i, prompt, params, want, have)
    if accepted != expected_accepted:
        raise CheckFailed(f"with your pieces the engine generated the right tokens, but its target accepted {accepted} "
                          f"draft tokens where, with its own pieces, it accepted {expected_accepted}: the draft "
                          "proposed other tokens. Speculation keeps the target's output whatever the draft proposes, "
                          "so only this count shows a wrong piece in the draft model's steps: its decode attention "
                          "(paged_decode), its norm (fused_add_rms_norm)")
    print(f"check_engine passed: with your {len(piece_names())} pieces the engine served {len(PROMPTS)} requests x "
          f"{MAX_TOKENS} tokens (greedy and seeded) exactly as with its own, accepted the same {accepted} drafts, "
          "and freed every KV block")


_REFERENCE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def reference_outputs(llm: LLM) -> tuple[list[RequestOutput], int]:
    """The workload served by llm's own pieces (kept: the engine gives them the same every time)."""
    if llm not in _REFERENCE:
        with assembled(llm, []):
            _REFERENCE[llm] = serve(llm, "the engine's own pieces")
    return _REFERENCE[llm]


@contextmanager
def assembled(llm: LLM, seams: list[Seam]) -> Iterator[None]:
    """llm with the seams set, on a pool with every block free, its limits watched; everything put back after.
    Eager steps: a CUDA graph replays the kernels it recorded, not the functions swapped in."""
    engine = llm.llm_engine
    engine.block_manager.reset()  # whatever an earlier run left cached, every run starts from the same pool
    with ExitStack() as stack:
        stack.callback(engine.block_manager.reset)  # a wrong piece must not leave the pool corrupted
        # Set and put back with setattr, which keeps a module's buffer a buffer (mock.patch would delete it).
        for owner, attr, value in [(engine.model_runner, "cuda_graphs", None),
                                   (engine.scheduler, "schedule", _watched(engine.scheduler)), *seams]:
            stack.callback(setattr, owner, attr, getattr(owner, attr))
            setattr(owner, attr, value)
        yield


def serve(llm: LLM, what: str) -> tuple[list[RequestOutput], int]:
    """The capstone's workload on llm, and the draft tokens its target accepted; every KV block must be free
    afterwards."""
    work, before = requests(), _accepted(llm)
    try:
        outs = llm.generate([p for p, _ in work], [s for _, s in work], use_tqdm=False)
    except CheckFailed:
        raise
    except Exception as e:
        raise CheckFailed(f"the engine failed with {what} ({type(e).__name__}: {e})") from e
    blocks = llm.llm_engine.block_manager
    if blocks.num_free_blocks != blocks.num_blocks:
        raise CheckFailed(f"after serving every request with {what}, {blocks.num_blocks - blocks.num_free_blocks} of "
                          f"{blocks.num_blocks} KV blocks are still held: free must return every block whose "
                          "ref_count reaches 0, and allocate take exactly one reference per block it hands out")
    return outs, _accepted(llm) - before


def _accepted(llm: LLM) -> int:
    return int(next((m.value for m in llm.get_metrics() if m.name == "vllm:spec_decode_num_accepted_tokens"), 0))


def _watched(scheduler: Scheduler) -> Callable[[], ScheduledBatch]:
    """scheduler.schedule, with the engine's limits checked after each step and a stall stopped."""
    schedule, idle = scheduler.schedule, [0]

    def watched() -> ScheduledBatch:
        batch = schedule()
        if batch.num_batched_tokens > scheduler.max_num_batched_tokens or len(scheduler.running) > \
                scheduler.max_num_seqs:
            raise CheckFailed(f"a step computes {batch.num_batched_tokens} tokens for {len(scheduler.running)} running "
                              f"sequences; the limits are max_num_batched_tokens={scheduler.max_num_batched_tokens} "
                              f"and max_num_seqs={scheduler.max_num_seqs} (admit and token_budget keep them)")
        idle[0] = idle[0] + 1 if not batch.num_batched_tokens else 0
        if idle[0] > MAX_IDLE_STEPS:
            blocks = scheduler.kv_cache_manager.block_manager
            raise CheckFailed(f"the engine stalled: {MAX_IDLE_STEPS} steps in a row computed no token while requests "
                              f"waited ({len(scheduler.waiting)} waiting, {len(scheduler.running)} running, "
                              f"{blocks.num_free_blocks} of {blocks.num_blocks} KV blocks free); a token budget gives "
                              "at least one token per decode plus one, admit moves a waiting request in while there "
                              "is room, and free puts every block nobody holds back on the free list")
        return batch
    return watched


def _check_pool(pieces: Pieces, llm: LLM) -> None:
    engine = llm.llm_engine
    budget = pool_budget(llm)
    case = f"the capstone's pool: {budget:,} bytes, blocks of {BLOCK_SIZE} tokens, {engine.dtype}"
    got = call_learner(pieces.plan_kv_blocks, "plan_kv_blocks", case, engine.model_config, budget, BLOCK_SIZE,
                       engine.dtype)
    if got != engine.block_manager.num_blocks:
        raise CheckFailed(f"your plan_kv_blocks sizes {case} at {got!r} blocks; the engine's planner at "
                          f"{engine.block_manager.num_blocks}: run exercise 08's check_plan_kv_blocks for the reason")


def _counted(pieces: Pieces, calls: dict[str, int]) -> Pieces:
    def counted(name: str, fn: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)
        call.__name__ = name
        return call
    return dataclasses.replace(pieces, **{n: counted(n, getattr(pieces, n)) for n in piece_names()})


def _validated(plugged: object) -> list[Seam]:
    if not isinstance(plugged, list | tuple) or not all(isinstance(s, tuple) and len(s) == 3 for s in plugged):
        raise CheckFailed(f"seams returned {type(plugged).__name__}; expected a list of (owner, attribute, value) "
                          "triples")
    for i, (owner, attr, _) in enumerate(plugged):
        if not isinstance(attr, str) or not hasattr(owner, attr):
            raise CheckFailed(f"seam {i}: {type(owner).__name__} has no attribute {attr!r} to replace; a seam "
                              "replaces what the engine already calls")
    return list(plugged)


def _compare(i: int, prompt: str, params: SamplingParams, want: RequestOutput, have: RequestOutput) -> None:
    request = f"request {i} ({prompt!r}, {'greedy' if params.greedy else f'seeded, seed {params.seed}'})"
    a, b = want.outputs[0], have.outputs[0]
    if a.token_ids != b.token_ids:
        at = next(j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y)
        raise CheckFailed(f"with your pieces the engine generated other tokens than with its own for {request}"
                          f"\n  expected: {a.token_ids}\n  got:      {b.token_ids}\n  first difference at generated "
                          f"token {at}\n  hint: each exercise's checks passed one piece at a time; together they must "
                          "agree too. Rerun each exercise's last check, then look at the seams")
    for j, token in enumerate(a.token_ids):
        diff = abs(a.logprobs[j][token].logprob - b.logprobs[j][token].logprob)
        if diff > LOGPROB_TOLERANCE:
            raise CheckFailed(f"with your pieces the engine generated the right tokens for {request}, but the "
                              f"log-probability of token {j} is off by {diff:.3g} (more than {LOGPROB_TOLERANCE}): "
                              "the model computes something else (the weights, the norm or the attention)")
