"""minillm's model against Hugging Face transformers on random checkpoints of every supported family:
logits of whole prompts (flattened varlen batch), and greedy generation through the KV cache."""

from __future__ import annotations

import pytest
import torch
from conftest import HF_CONFIGS

from minillm import LLM, SamplingParams
from minillm.engine.model_runner import sequence_logits

PROMPT_LENGTHS = [1, 2, 17, 64, 100]
NEW_TOKENS = 20


def random_prompts(vocab: int, seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


@pytest.mark.parametrize("kind", HF_CONFIGS)
def test_prompt_logits_match_transformers(kind, hf_checkpoint):
    hf, path = hf_checkpoint(kind)
    llm = LLM(str(path), skip_tokenizer_init=True, dtype="float32")
    prompts = random_prompts(hf.config.vocab_size)
    logits = sequence_logits(llm.llm_engine.model, prompts)  # all prompts in one flattened batch
    with torch.no_grad():
        for p, ours in zip(prompts, logits):
            expected = hf(torch.tensor([p])).logits[0]
            where = f"{kind}, prompt of {len(p)} tokens"
            torch.testing.assert_close(ours.cpu(), expected, atol=1e-4, rtol=0,
                                       msg=lambda m, where=where: f"{where}: {m}")


@pytest.mark.parametrize("kind", HF_CONFIGS)
def test_batched_greedy_generation_matches_transformers(kind, hf_checkpoint):
    hf, path = hf_checkpoint(kind)
    llm = LLM(str(path), skip_tokenizer_init=True, dtype="float32")
    prompts = random_prompts(hf.config.vocab_size, seed=2)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        ref = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW_TOKENS,
                          min_new_tokens=NEW_TOKENS, output_logits=True, return_dict_in_generate=True)
        expected = ref.sequences[0, len(prompt):].tolist()
        assert out.outputs[0].token_ids == expected, f"{kind}: prompt of {len(prompt)} tokens diverged"
        # The logprob of each chosen token, computed through the KV cache, against transformers' logits.
        ref_logprobs = [torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(ref.logits, expected)]
        ours = [entry[t].logprob for entry, t in zip(out.outputs[0].logprobs, expected)]
        assert ours == pytest.approx(ref_logprobs, abs=1e-4)


def test_no_cache_mode_generates_the_same_tokens(hf_checkpoint):
    _, path = hf_checkpoint("llama_gqa_tied")
    prompts = [{"prompt_token_ids": p} for p in random_prompts(512, seed=3)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    cached = LLM(str(path), skip_tokenizer_init=True).generate(prompts, params, use_tqdm=False)
    recomputed = LLM(str(path), skip_tokenizer_init=True, kv_cache="none").generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in cached] == [o.outputs[0].token_ids for o in recomputed]
