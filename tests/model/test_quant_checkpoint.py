"""Quantized checkpoints: saved as safetensors, loaded back already quantized, bit for bit the same
model (and so the same tokens); other quantization formats and mismatched arguments are refused."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from minillm import LLM, SamplingParams
from minillm.cli import main
from minillm.layers.quant_linear import QuantLinear
from minillm.models.quant_checkpoint import save_quantized

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [1, 5, 9, 2, 7]}, {"prompt_token_ids": [3, 3, 8]}]


def tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def assert_same_model(a: LLM, b: LLM) -> None:
    sa, sb = a.llm_engine.model.state_dict(), b.llm_engine.model.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert sa[name].dtype == sb[name].dtype and torch.equal(sa[name], sb[name]), name


@pytest.mark.parametrize(("method", "group_size"), [("int8", 128), ("int4", 32)])
def test_round_trip_with_merged_layers_and_biases(hf_checkpoint, tmp_path, method, group_size):
    # Biases on q/k/v and the MLP: every quantized tensor of a merged layer is split back by rows.
    _, path = hf_checkpoint("llama_bias")
    llm = LLM(str(path), quantization=method, quant_group_size=group_size, skip_tokenizer_init=True)
    out = save_quantized(llm.llm_engine.model, path, tmp_path / "q")
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    expected = {"qweight", "scales", "bias"} | ({"zeros"} if method == "int4" else set())
    assert {n.rsplit(".", 1)[1] for n in names if ".q_proj." in n} == expected
    assert not any(".qkv_proj." in n or ".gate_up_proj." in n for n in names)
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config == {"quant_method": "minillm", "quantization": method,
                      "group_size": group_size if method == "int4" else None}
    loaded = LLM(str(out), skip_tokenizer_init=True)
    assert all(m.method == method for m in loaded.llm_engine.model.modules() if isinstance(m, QuantLinear))
    assert_same_model(llm, loaded)
    assert tokens(loaded) == tokens(llm)
    # Loaded layers run on the engine's kernels too.
    on_triton = LLM(str(out), skip_tokenizer_init=True, attention_backend="triton")
    assert {m.kernel for m in on_triton.llm_engine.model.modules() if isinstance(m, QuantLinear)} == {"triton"}
    # Random weights are made unquantized: a quantized checkpoint's shapes are refused, not left unfilled.
    with pytest.raises(ValueError, match=rf"load_format='dummy' makes unquantized random weights, but the model "
                                         rf"in .* is quantized \('{method}'\)"):
        LLM(str(out), skip_tokenizer_init=True, load_format="dummy")


def test_cli_quantizes_tiny_and_the_folder_loads_with_its_tokenizer(tmp_path, capsys):
    main(["quantize", "--model", "tiny", "--quantization", "int4", "--group-size", "64", "--output",
          str(tmp_path / "tiny-int4")])
    assert "wrote" in capsys.readouterr().out
    # Saved in the checkpoint's own dtype (bf16), not the CPU's float32.
    config = json.loads((tmp_path / "tiny-int4" / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "bfloat16"
    # Its card says what the folder is, above the source's; its weights are as readable as its config.
    readme = (tmp_path / "tiny-int4" / "README.md").read_text()
    assert readme.startswith("# tiny, quantized (int4 g64)") and "whose card follows" in readme
    weights, config_file = (tmp_path / "tiny-int4" / name for name in ("model.safetensors", "config.json"))
    assert weights.stat().st_mode & 0o777 == config_file.stat().st_mode & 0o777
    loaded = LLM(str(tmp_path / "tiny-int4"), dtype="bfloat16")
    assert loaded.get_tokenizer() is not None
    assert_same_model(LLM("tiny", dtype="bfloat16", quantization="int4", quant_group_size=64), loaded)
    # Asking for the scheme it already has is fine; asking for another is an error naming both.
    LLM(str(tmp_path / "tiny-int4"), quantization="int4", quant_group_size=64)
    with pytest.raises(ValueError, match=r"quantization='int8'.*already quantized as 'int4' with group size 64"):
        LLM(str(tmp_path / "tiny-int4"), quantization="int8")


def test_unquantized_models_other_formats_and_used_folders_are_refused(hf_checkpoint, tmp_path):
    _, path = hf_checkpoint("llama_mha")
    with pytest.raises(ValueError, match="not quantized"):
        save_quantized(LLM(str(path), skip_tokenizer_init=True).llm_engine.model, path, tmp_path / "out")
    with pytest.raises(ValueError, match="already holds a model"):
        save_quantized(LLM(str(path), quantization="int8", skip_tokenizer_init=True).llm_engine.model, path, path)
    gptq = tmp_path / "gptq"
    gptq.mkdir()
    for file in path.iterdir():
        (gptq / file.name).write_bytes(file.read_bytes())
    config = json.loads((gptq / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (gptq / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unsupported quantization_config 'gptq'"):
        LLM(str(gptq), skip_tokenizer_init=True)
    config["quantization_config"] = {"quant_method": "minillm", "quantization": "int4"}  # no group size
    (gptq / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="group_size=None"):
        LLM(str(gptq), skip_tokenizer_init=True)
    config["quantization_config"] = {"quant_method": "minillm", "quantization": "fp8", "group_size": None}
    (gptq / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"quantization_config in .*config.json must give a quantization in "
                                         r"\('int8', 'int4'\).*got quantization='fp8'"):
        LLM(str(gptq), skip_tokenizer_init=True)
