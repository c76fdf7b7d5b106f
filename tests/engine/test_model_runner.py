"""The runner's three parts on their own: `prepare` stages a step in the persistent buffers, `execute`
gives logits at any positions asked for (several per sequence, as verifying drafted tokens needs),
and `sample` queues the sampler, whose output hands back a list of tokens per sequence."""

from __future__ import annotations

import torch

from minillm import LLM, SamplingParams
from minillm.engine.model_runner import sequence_logits

PROMPTS = [list(range(5, 17)), list(range(40, 47))]


def test_several_positions_of_a_sequence_get_logits_and_tokens():
    llm = LLM("tiny", skip_tokenizer_init=True, dtype="float32", device="cpu")
    engine = llm.llm_engine
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=4))
    batch = engine.scheduler.schedule()
    runner = engine.model_runner
    with torch.inference_mode():
        model_input = runner.prepare(batch)
        assert model_input.input_ids.data_ptr() == runner.buffers.input_ids.tensor.data_ptr()  # no new tensor
        # The last three positions of the first prompt, the last one of the second.
        ends = [len(PROMPTS[0]), len(PROMPTS[0]) + len(PROMPTS[1])]
        model_input.logits_indices = [ends[0] - 3, ends[0] - 2, ends[0] - 1, ends[1] - 1]
        model_input.num_logits = [3, 1]
        logits = runner.execute(model_input)
        output = runner.sample(logits, batch.seqs, model_input).get_output()
    expected = sequence_logits(engine.model, PROMPTS)
    torch.testing.assert_close(logits[:3], expected[0][-3:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[3], expected[1][-1], atol=1e-4, rtol=1e-4)
    assert output.sampled_token_ids == [expected[0][-3:].argmax(-1).tolist(), [expected[1][-1].argmax().item()]]
    for seq in batch.seqs:
        engine.abort_request(seq.request_id)
