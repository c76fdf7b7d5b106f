"""On a CUDA GPU: parity with transformers in bfloat16. Skipped where there is no GPU (CI has none);
run it on one with `pytest tests/test_gpu.py`."""

from __future__ import annotations

import pytest
import torch
from conftest import HF_CONFIGS, make_hf_model

from minillm import LLM, SamplingParams
from minillm.model_runner import sequence_logits

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("kind", HF_CONFIGS)
def test_bf16_parity_on_cuda(kind, tmp_path):
    hf = make_hf_model(kind)
    hf.save_pretrained(tmp_path)
    hf = hf.to("cuda", torch.bfloat16)
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, device="cuda", dtype="bfloat16")
    prompts = [torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (1, 33, 100)]
    logits = sequence_logits(llm.llm_engine.model, prompts)
    for p, ours in zip(prompts, logits):
        ref = hf(torch.tensor([p], device="cuda")).logits[0].float()
        scale = ref.abs().max()
        # bf16 keeps 8 bits of mantissa: two implementations agree to a few units of 2^-8 of the scale.
        assert (ours - ref).abs().max() <= 0.04 * scale, f"{kind}: {((ours - ref).abs().max() / scale):.3f}"
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    for p, out in zip(prompts, llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)):
        ids = torch.tensor([p], device="cuda")
        ref = hf.generate(ids, do_sample=False, max_new_tokens=16, min_new_tokens=16, output_logits=True,
                          return_dict_in_generate=True)
        expected = ref.sequences[0, len(p):].tolist()
        ours = out.outputs[0].token_ids
        # Token for token, except that after a near-tie (top two within bf16 noise) the two may
        # legitimately take different branches.
        for i, (a, b) in enumerate(zip(ours, expected)):
            if a != b:
                top2 = ref.logits[i][0].float().topk(2).values
                assert top2[0] - top2[1] <= 0.04 * top2[0].abs(), f"{kind}: diverged at token {i} without a near-tie"
                break
