"""minillm's model against Hugging Face transformers on random checkpoints of every supported family:
logits of whole prompts (flattened varlen batch), and greedy generation through the KV cache."""

from __future__ import annotations

import pytest
import torch
from conftest import HF_CONFIGS

from minillm import LLM, SamplingParams
from minillm.engine.model_runner import sequence_logits
from minillm.layers.rotary import rope_inv_freq
from minillm.models.registry import model_config_from_hf

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


# Llama 3.1's own scaling (head_dim 128): its frequencies fall on both sides of the smoothed band and
# inside it; and linear scaling (no shipped test checkpoint uses it).
ROPE_SCALINGS = {
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
}


@pytest.mark.parametrize("kind", ROPE_SCALINGS)
def test_rope_scaling_gives_the_frequencies_of_transformers(kind):
    """The frequencies a config.json's rope scaling gives, as minillm reads the file, against the ones
    transformers computes from the same config: the slow frequencies divided by the factor, the fast
    ones kept and, for llama3, the band between blended smoothly."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = LlamaConfig(hidden_size=4096, num_attention_heads=32, max_position_embeddings=131072,
                     rope_parameters=dict(ROPE_SCALINGS[kind]))
    config = model_config_from_hf({**hf.to_dict(), "architectures": ["LlamaForCausalLM"]})
    ours = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
    expected = ROPE_INIT_FUNCTIONS[kind](hf)[0]
    torch.testing.assert_close(ours, expected.float(), rtol=1e-6, atol=0)
    plain = rope_inv_freq(config.head_dim, config.rope_theta, {})
    kept, divided = (ours == plain).sum(), torch.isclose(ours, plain / 4 if kind == "linear" else plain / 8).sum()
    if kind == "llama3":  # every region of the piecewise rule is reached
        assert 0 < kept and 0 < divided and kept + divided < len(ours), (kept, divided)
    else:
        assert divided == len(ours)


def test_no_cache_mode_generates_the_same_tokens(hf_checkpoint):
    _, path = hf_checkpoint("llama_gqa_tied")
    prompts = [{"prompt_token_ids": p} for p in random_prompts(512, seed=3)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    cached = LLM(str(path), skip_tokenizer_init=True).generate(prompts, params, use_tqdm=False)
    recomputed = LLM(str(path), skip_tokenizer_init=True, kv_cache="none").generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in cached] == [o.outputs[0].token_ids for o in recomputed]
