"""The scheduler alone, driven by hypothesis through random workloads without a model: each step
hands what a model would have produced (a token where the batch samples) to the output processor
and then to `Scheduler.update`, as the engine's step does; requests are aborted at random, and the
limits and guarantees are checked after every step. Then the scheduling policy: by name, as an
object, as a class, and refused with the argument named."""

from __future__ import annotations

import ast
import inspect
from types import SimpleNamespace

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minillm.config.engine import SCHEDULING_POLICIES, SchedulerConfig
from minillm.engine import scheduler as scheduler_module
from minillm.engine.output_processor import OutputProcessor
from minillm.engine.policy import POLICIES, SchedulingPolicy
from minillm.engine.runner_output import ModelRunnerOutput
from minillm.engine.scheduler import ScheduledBatch, Scheduler
from minillm.kv.block_manager import BlockManager
from minillm.kv.cache_manager import ContiguousKVCacheManager, PagedKVCacheManager
from minillm.kv.contiguous_cache import ContiguousKVCache
from minillm.models.loader import resolve_model_path
from minillm.models.registry import read_model_config
from minillm.outputs import RequestOutput
from minillm.sampling_params import SamplingParams
from minillm.sequence import Sequence, SequenceStatus

BLOCK_SIZE = 4
TINY = read_model_config(resolve_model_path("tiny"))

requests = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12), st.integers(0, 3)), min_size=1, max_size=20)


def paged_scheduler(max_num_seqs: int, budget: int, blocks: BlockManager, policy: object = "fcfs") -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_seqs, budget, scheduling_policy=policy), PagedKVCacheManager(blocks))


def produced(batch: ScheduledBatch, token: int = 0) -> ModelRunnerOutput:
    """What a model would hand back for the batch: one token where one is due."""
    return ModelRunnerOutput([[token] if sample else [] for sample in batch.do_sample])


def finish_step(scheduler: Scheduler, batch: ScheduledBatch, output: ModelRunnerOutput) -> list[RequestOutput]:
    """The rest of the engine's step: the output processor appends the tokens and decides the stops,
    then the scheduler follows."""
    outputs = OutputProcessor(None).process_outputs(batch.seqs, output)
    scheduler.update(batch, output)
    return outputs


def run(scheduler: Scheduler, workload: list[tuple[int, int, int]], aborts: set[int],
        arrivals_per_step: int) -> dict[str, int]:
    """Steps until every request is done; returns the step at which each one finished."""
    pending = [Sequence(f"r{i}", prompt_token_ids=[(i + t) % 7 for t in range(prompt)],
                        params=SamplingParams(max_tokens=max_tokens))
               for i, (prompt, max_tokens, _) in enumerate(workload)]
    seqs = list(pending)
    finished: dict[str, int] = {}
    blocks = scheduler.kv_cache_manager.block_manager
    for step in range(10_000):
        for _ in range(arrivals_per_step):
            if pending:
                scheduler.add_request(pending.pop(0))
        if not pending and not scheduler.has_unfinished_requests():
            break
        batch = scheduler.schedule()
        assert batch.num_batched_tokens <= scheduler.max_num_batched_tokens
        assert len(scheduler.running) <= scheduler.max_num_seqs
        assert len({s.request_id for s in batch.seqs}) == len(batch.seqs)
        assert all(s.status is SequenceStatus.RUNNING for s in batch.seqs)
        assert all(s.status is SequenceStatus.WAITING and s.num_computed_tokens == 0 for s in batch.preempted)
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            assert n >= 1 and seq.num_computed_tokens + n <= seq.num_tokens
            if blocks is not None:
                assert len(seq.block_table) * BLOCK_SIZE >= seq.num_computed_tokens + n
        finish_step(scheduler, batch, produced(batch))
        for seq in batch.seqs:
            if seq.is_finished:
                assert seq.num_output_tokens == seq.params.max_tokens
                finished[seq.request_id] = step
        for i, (_, _, abort_at) in enumerate(workload):
            seq = seqs[i]
            if i in aborts and abort_at == step % 4 and seq.status is not SequenceStatus.FINISHED \
                    and scheduler.find(seq.request_id):
                scheduler.finish(seq)
                finished[seq.request_id] = step
        if blocks is not None:
            held = {b for s in scheduler.running for b in s.block_table}
            assert all(blocks.blocks[b].ref_count > 0 for b in held)
            assert not any(s.block_table for s in scheduler.waiting)
    else:
        raise AssertionError(f"not done after 10,000 steps: {scheduler.running} {list(scheduler.waiting)}")
    assert len(finished) == len(workload)  # every admitted request finishes: nothing starves
    if blocks is not None:
        assert blocks.num_free_blocks == blocks.num_blocks  # and nothing leaks
    return finished


@settings(max_examples=60, deadline=None)
# Found by hypothesis: with prefix caching, a victim could be readmitted in the step that preempted it.
@example(workload=[(1, 1, 0)] * 4 + [(3, 7, 0), (1, 6, 0), (1, 1, 0), (1, 1, 0), (1, 3, 3), (1, 2, 3), (40, 6, 0),
                   (4, 3, 3)], num_blocks=15, max_num_seqs=6, budget=42, arrivals=5, caching=True, aborts=set())
@given(workload=requests, num_blocks=st.integers(13, 40), max_num_seqs=st.integers(1, 6),
       budget=st.integers(1, 64), arrivals=st.integers(1, 5), caching=st.booleans(),
       aborts=st.sets(st.integers(0, 19), max_size=5))
def test_paged_limits_hold_and_every_request_finishes(workload, num_blocks, max_num_seqs, budget, arrivals, caching,
                                                      aborts):
    # 13 blocks of 4 tokens hold the longest request alone (40 + 12 tokens), as the engine guarantees.
    scheduler = paged_scheduler(max_num_seqs, budget, BlockManager(num_blocks, BLOCK_SIZE, caching))
    run(scheduler, workload, aborts, arrivals)


@settings(max_examples=30, deadline=None)
@given(workload=requests, max_num_seqs=st.integers(1, 6), budget=st.integers(1, 64), arrivals=st.integers(1, 5))
def test_contiguous_limits_hold_and_every_request_finishes(workload, max_num_seqs, budget, arrivals):
    cache = ContiguousKVCache(TINY, torch.float32, torch.device("cpu"), capacity_tokens=60)
    run(Scheduler(SchedulerConfig(max_num_seqs, budget), ContiguousKVCacheManager(cache)), workload, set(), arrivals)


def test_decodes_go_first_and_prompts_fill_the_rest_in_chunks():
    scheduler = paged_scheduler(4, 10, BlockManager(64, BLOCK_SIZE))
    short = Sequence("short", prompt_token_ids=[1, 2, 3], params=SamplingParams(max_tokens=8))
    long = Sequence("long", prompt_token_ids=list(range(25)), params=SamplingParams(max_tokens=8))
    scheduler.add_request(short)
    scheduler.add_request(long)
    batch = scheduler.schedule()  # short's whole prompt, then the first 7 tokens of long's
    assert [(s.request_id, n, d) for s, n, d in zip(batch.seqs, batch.num_new_tokens, batch.do_sample)] == [
        ("short", 3, True), ("long", 7, False)]
    assert [out.request_id for out in finish_step(scheduler, batch, produced(batch, 9))] == ["short"]
    assert (short.num_computed_tokens, long.num_computed_tokens, short.output_token_ids) == (3, 7, [9])
    batch = scheduler.schedule()  # short's decode first, then 9 more tokens of long
    assert list(zip([s.request_id for s in batch.seqs], batch.num_new_tokens)) == [("short", 1), ("long", 9)]


def test_steps_waited_counts_scheduled_steps_since_arrival_and_forgets_finished_requests():
    """The step clock an admission policy ages requests by (exercise 04): it ticks once per schedule()."""
    scheduler = paged_scheduler(1, 64, BlockManager(16, BLOCK_SIZE))
    first = Sequence("first", prompt_token_ids=[1, 2, 3], params=SamplingParams(max_tokens=1))
    second = Sequence("second", prompt_token_ids=[4, 5], params=SamplingParams(max_tokens=1))
    scheduler.add_request(first)
    batch = scheduler.schedule()
    scheduler.add_request(second)  # waits: one sequence at a time
    assert (scheduler.steps_waited(first), scheduler.steps_waited(second)) == (1, 0)
    finish_step(scheduler, batch, produced(batch))  # first generates its one token and finishes
    assert scheduler.schedule().seqs == [second] and scheduler.steps_waited(second) == 1
    assert "first" not in scheduler.arrival_steps


def test_update_takes_several_tokens_and_cuts_them_where_plain_decoding_stops():
    """What verifying drafted tokens hands back: several tokens per sequence. They are appended one at a
    time; a stop token, or max_tokens, cuts the run there, and the finished sequence frees its blocks."""
    blocks = BlockManager(16, BLOCK_SIZE)
    scheduler = paged_scheduler(4, 64, blocks)
    stops = Sequence("stops", prompt_token_ids=[1, 2, 3, 4, 5],
                     params=SamplingParams(max_tokens=10, stop_token_ids=[7]))
    short = Sequence("short", prompt_token_ids=[1, 2, 3, 4, 6], params=SamplingParams(max_tokens=3))
    runs = Sequence("runs", prompt_token_ids=[2, 2], params=SamplingParams(max_tokens=10))
    for seq in (stops, short, runs):
        scheduler.add_request(seq)
    batch = scheduler.schedule()
    # short found the block its prompt shares with stops' in the prefix cache, registered as stops was
    # scheduled a moment earlier: it computes one token, and runs first, with the single tokens.
    assert batch.seqs == [short, stops, runs] and batch.num_new_tokens == [1, 5, 2] and short.num_cached_tokens == 4
    outputs = finish_step(scheduler, batch, ModelRunnerOutput([[6, 6, 6, 6, 6], [5, 7, 8], [3, 3]]))
    assert [out.request_id for out in outputs] == ["short", "stops", "runs"]
    assert (stops.output_token_ids, stops.finish_reason, stops.stop_reason) == ([5, 7], "stop", 7)
    assert (short.output_token_ids, short.finish_reason) == ([6, 6, 6], "length")
    assert (runs.output_token_ids, runs.finish_reason, runs.num_computed_tokens) == ([3, 3], None, 2)
    assert scheduler.running == [runs] and stops.block_table == [] == short.block_table
    # Only computed tokens reach the prefix cache: the first block the two 5-token prompts share, not the
    # block that runs' prompt and its two new tokens fill, as the new tokens' K/V are not computed yet.
    assert blocks.num_cached_blocks == 1 and len(runs.block_hashes) == 0
    assert blocks.num_free_blocks == blocks.num_blocks - len(runs.block_table)


def shortest_first(scheduler: Scheduler, batch: ScheduledBatch, budget: int) -> None:
    """Admission in another order than arrival: the shortest waiting prompt first."""
    while scheduler.waiting and budget > 0 and not batch.preempted and len(scheduler.running) < scheduler.max_num_seqs:
        seq = min(scheduler.waiting, key=lambda s: s.num_tokens)
        if not scheduler.allocate(seq):
            break
        scheduler.waiting.remove(seq)
        scheduler.running.append(seq)
        budget -= batch.add(seq, scheduler.num_new_tokens(seq, budget))


class ShortestFirst:
    """A policy written as a class: the engine makes one without arguments."""

    def admit(self, scheduler: Scheduler, batch: ScheduledBatch, budget: int) -> None:
        shortest_first(scheduler, batch, budget)

    def token_budget(self, scheduler: Scheduler) -> int:
        return 4


@pytest.mark.parametrize("policy, admitted, num_tokens", [
    ("fcfs", ["long"], 8), (SchedulingPolicy(), ["long"], 8), (SchedulingPolicy(admit=shortest_first), ["short"], 3),
    (SchedulingPolicy(token_budget=lambda scheduler: 5), ["long"], 5), (ShortestFirst, ["short"], 3),
    (ShortestFirst(), ["short"], 3)], ids=["by-name", "default-object", "admit", "token-budget", "class", "instance"])
def test_the_scheduling_policy_decides_admission_and_the_step_budget(policy, admitted, num_tokens):
    scheduler = paged_scheduler(1, 8, BlockManager(16, BLOCK_SIZE), policy)
    scheduler.add_request(Sequence("long", prompt_token_ids=list(range(20)), params=SamplingParams(max_tokens=2)))
    scheduler.add_request(Sequence("short", prompt_token_ids=[1, 2, 3], params=SamplingParams(max_tokens=2)))
    batch = scheduler.schedule()
    assert [s.request_id for s in batch.seqs] == admitted and batch.num_batched_tokens == num_tokens


def test_every_scheduling_policy_by_name_has_an_implementation():
    assert set(POLICIES) == set(SCHEDULING_POLICIES)
    first, second = (Scheduler(SchedulerConfig(), None).policy for _ in range(2))
    assert first is not second  # each scheduler has its own: changing one never changes another


@pytest.mark.parametrize("policy, got", [
    ("priority", "got 'priority'"), ("FCFS", "got 'FCFS'"), (None, "got None, which has no admit and no token_budget"),
    (shortest_first, "which has no admit and no token_budget"),
    (SimpleNamespace(admit=shortest_first), "which has no token_budget method")],
    ids=["vllms-other-name", "case", "none", "a-bare-function", "no-token-budget"])
def test_a_bad_scheduling_policy_is_refused_with_the_argument_named(policy, got):
    with pytest.raises(ValueError, match=rf"^scheduling_policy must be one of \('fcfs',\) or an object with the "
                                         rf"methods admit\(scheduler, batch, budget\) and token_budget\(scheduler\), "
                                         rf".*{got}"):
        SchedulerConfig(scheduling_policy=policy)


def test_the_scheduler_neither_imports_the_output_processor_nor_appends_tokens():
    """One owner per step for tokens and stops: the output processor, called by the engine's step."""
    imported = {node.module for node in ast.walk(ast.parse(inspect.getsource(scheduler_module)))
                if isinstance(node, ast.ImportFrom)}
    assert "minillm.engine.output_processor" not in imported
    scheduler = paged_scheduler(1, 8, BlockManager(16, BLOCK_SIZE))
    seq = Sequence("r", prompt_token_ids=[1, 2, 3], params=SamplingParams(max_tokens=2))
    scheduler.add_request(seq)
    batch = scheduler.schedule()
    scheduler.update(batch, produced(batch))
    assert seq.num_output_tokens == 0 and seq.num_computed_tokens == 3


def spec_scheduler(budget: int, k: int, blocks: BlockManager | None = None) -> Scheduler:
    """A scheduler for a speculating engine: each decode reserves k lookahead slots."""
    config = SchedulerConfig(4, budget, num_lookahead_slots=k)
    return Scheduler(config, PagedKVCacheManager(blocks or BlockManager(32, BLOCK_SIZE)))


def prefilled(scheduler: Scheduler, *seqs: Sequence) -> None:
    """Admit seqs and run their prompts in one step: each then decodes."""
    for seq in seqs:
        scheduler.add_request(seq)
    batch = scheduler.schedule()
    assert batch.do_sample == [True] * len(seqs)
    finish_step(scheduler, batch, produced(batch, 9))


@pytest.mark.parametrize("max_tokens, budget, drafts", [
    (20, 64, 3),  # k drafts
    (4, 64, 2),  # 3 tokens left: the step emits at most drafts + 1 of them
    (2, 64, 0),  # 1 token left: nothing to draft
    (20, 3, 2),  # the budget holds the decode and 2 drafts only
], ids=["k", "near-max-tokens", "last-token", "small-budget"])
def test_a_decode_reserves_lookahead_slots_within_max_tokens_and_the_budget(max_tokens, budget, drafts):
    """Drafts past max_tokens could never be kept, and a decode with its drafts must fit the step's
    budget like any other work."""
    scheduler = spec_scheduler(budget, 3)
    seq = Sequence("r", prompt_token_ids=[1, 2, 3], params=SamplingParams(max_tokens=max_tokens))
    prefilled(scheduler, seq)
    batch = scheduler.schedule()
    assert (batch.num_new_tokens, batch.num_spec_tokens) == ([1 + drafts], [drafts])
    assert batch.num_batched_tokens <= budget
    assert len(seq.block_table) == scheduler.kv_cache_manager.block_manager.blocks_needed(seq.num_tokens + drafts)


def test_decodes_with_lookahead_that_use_up_the_budget_leave_the_rest_for_the_next_step():
    """Each decode takes 1 + k of the budget: once it is spent, the others wait for the next step
    rather than join this one with nothing to compute."""
    scheduler = spec_scheduler(5, 2)
    seqs = [Sequence(f"r{i}", prompt_token_ids=[i], params=SamplingParams(max_tokens=20)) for i in range(3)]
    prefilled(scheduler, *seqs)
    batch = scheduler.schedule()
    assert list(zip([s.request_id for s in batch.seqs], batch.num_new_tokens, batch.num_spec_tokens)) == [
        ("r0", 3, 2), ("r1", 2, 1)]


def verify(scheduler: Scheduler, seq: Sequence, accepted: int, last: int = 9) -> ScheduledBatch:
    """A speculative step of seq alone: its drafts (tokens 100, 101, ...) verified, the first `accepted`
    kept, then the target's own token `last`."""
    batch = scheduler.schedule()
    assert batch.seqs == [seq]
    drafts = [100 + j for j in range(batch.num_spec_tokens[0])]
    finish_step(scheduler, batch, ModelRunnerOutput([drafts[:accepted] + [last]], spec_token_ids=[drafts]))
    return batch


def test_update_keeps_the_accepted_drafts_computed_and_gives_back_the_rejected_ones_blocks():
    blocks = BlockManager(32, BLOCK_SIZE)
    scheduler = spec_scheduler(64, 4, blocks)
    seq = Sequence("r", prompt_token_ids=[1, 2, 3, 4], params=SamplingParams(max_tokens=20))
    prefilled(scheduler, seq)  # 5 tokens, 4 computed
    batch = verify(scheduler, seq, accepted=1)  # the step reserved 5 + 4 slots: 3 blocks
    assert batch.num_spec_tokens == [4] and seq.output_token_ids == [9, 100, 9]
    # The token the step sampled is the next decode's input; everything before it is in the cache.
    assert seq.num_computed_tokens == seq.num_tokens - 1 == 6
    # The third block held rejected drafts only: back in the pool.
    assert len(seq.block_table) == 2 and blocks.num_free_blocks == blocks.num_blocks - 2
    batch = scheduler.schedule()  # the next step is a decode, with drafts again
    assert (batch.num_new_tokens, batch.num_spec_tokens) == ([5], [4])


def test_a_stop_among_the_accepted_drafts_counts_only_the_tokens_kept_as_computed():
    """The drafts after a stop were verified, but the sequence ends before them: what reaches the prefix
    cache is full blocks of the tokens kept, never a block the cut left partly filled."""
    blocks = BlockManager(32, BLOCK_SIZE)
    scheduler = spec_scheduler(64, 4, blocks)
    seq = Sequence("r", prompt_token_ids=[1, 2, 3, 4], params=SamplingParams(max_tokens=20, stop_token_ids=[101]))
    prefilled(scheduler, seq)
    verify(scheduler, seq, accepted=4)  # all four kept, but the second one stops the sequence
    assert (seq.output_token_ids, seq.finish_reason) == ([9, 100, 101], "stop")
    assert seq.num_computed_tokens <= seq.num_tokens
    assert blocks.num_cached_blocks == 1 and blocks.num_free_blocks == blocks.num_blocks


def test_a_sequence_preempted_while_its_step_was_in_flight_still_finishes():
    """Async scheduling: the next step may preempt a sequence before the step it ran in is read. If
    that step's token ends it, it leaves the queue and frees everything instead of running again."""
    scheduler = paged_scheduler(2, 64, BlockManager(16, BLOCK_SIZE))
    seq = Sequence("r", prompt_token_ids=[1, 2, 3], params=SamplingParams(max_tokens=1))
    scheduler.add_request(seq)
    batch = scheduler.schedule()
    scheduler.preempt(seq)  # as the next step's scheduling would, short of memory
    finish_step(scheduler, batch, produced(batch))
    assert seq.is_finished and seq.finish_reason == "length"
    assert not scheduler.has_unfinished_requests() and scheduler.schedule().seqs == []


def test_the_preempted_sequence_goes_back_first_in_line_with_nothing_computed():
    """The newest running sequence is the victim; it is recomputed before anyone who arrived after it,
    keeps the prefix-cache hits of its first admission as its own, and its draft has computed nothing
    either (the blocks that held the draft's K/V are gone too)."""
    blocks = BlockManager(4, BLOCK_SIZE)
    scheduler = paged_scheduler(2, 64, blocks)
    old = Sequence("old", prompt_token_ids=list(range(8)), params=SamplingParams(max_tokens=8))
    new = Sequence("new", prompt_token_ids=list(range(10, 18)), params=SamplingParams(max_tokens=8))
    later = Sequence("later", prompt_token_ids=[1, 2], params=SamplingParams(max_tokens=2))
    prefilled(scheduler, old, new)  # 9 tokens each, 8 computed: all four blocks
    scheduler.add_request(later)
    new.num_draft_computed_tokens = 8  # as a draft model would have
    batch = scheduler.schedule()  # old's decode needs a third block: new goes
    assert batch.seqs == [old] and batch.preempted == [new]
    assert [s.request_id for s in scheduler.waiting] == ["new", "later"]
    assert (new.num_computed_tokens, new.num_draft_computed_tokens, new.num_cached_tokens) == (0, 0, 0)
    finish_step(scheduler, batch, produced(batch))
    scheduler.finish(old)
    batch = scheduler.schedule()  # new again, its first block a prefix-cache hit now
    assert batch.seqs[0] is new and new.num_computed_tokens == BLOCK_SIZE
    assert new.num_cached_tokens == 0  # as first admitted: what the user's request found in the cache


def test_a_step_puts_single_token_work_first():
    """Decodes first (and any sequence with a single token left): attention then runs them through the
    decode kernel in one call and only the rest through prefill."""
    scheduler = paged_scheduler(4, 64, BlockManager(16, BLOCK_SIZE))
    for request_id, prompt in (("long", [1, 2, 3, 4, 5]), ("one", [6])):
        scheduler.add_request(Sequence(request_id, prompt_token_ids=prompt, params=SamplingParams(max_tokens=4)))
    batch = scheduler.schedule()
    assert [(s.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)] == [("one", 1), ("long", 5)]
