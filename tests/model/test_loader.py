"""Loading: what is refused, and that every refusal names the file, tensor or argument at fault."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from minillm import LLM, SamplingParams
from minillm.models.registry import ARCHITECTURES, model_class, model_config_from_hf

# The smallest config.json of a family: what the tests below leave out or change.
BASE = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}


@pytest.fixture
def checkpoint_copy(hf_checkpoint, tmp_path):
    _, path = hf_checkpoint("llama_gqa_tied")
    dest = tmp_path / "model"
    shutil.copytree(path, dest)
    return dest


def test_unsupported_architecture_is_named(checkpoint_copy):
    config = json.loads((checkpoint_copy / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (checkpoint_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'.*LlamaForCausalLM"):
        LLM(str(checkpoint_copy), skip_tokenizer_init=True)


def test_the_registry_translates_each_family_and_names_what_it_lacks():
    flags = {name: (c.qkv_bias, c.o_bias, c.qk_norm, c.model_type) for name in ARCHITECTURES
             for c in [model_config_from_hf({**BASE, "architectures": [name]})]}
    assert flags == {"LlamaForCausalLM": (False, False, False, "llama"),
                     "MistralForCausalLM": (False, False, False, "mistral"),
                     "Qwen2ForCausalLM": (True, False, False, "qwen2"),
                     "Qwen3ForCausalLM": (False, False, True, "qwen3")}
    assert all(model_class(name) is ARCHITECTURES[name].model_cls for name in ARCHITECTURES)
    with pytest.raises(ValueError, match="no model implements architecture 'GPT2LMHeadModel': minillm implements "
                                         "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"):
        model_class("GPT2LMHeadModel")


def test_what_a_config_leaves_out_takes_the_transformers_default():
    """A config.json need not spell out every setting: what it leaves out means transformers'
    default for its family (rms_norm_eps 1e-6, untied embeddings, rope_theta 10000, a context that
    differs by family), not some other."""
    import transformers

    for name in ARCHITECTURES:
        hf = getattr(transformers, name.replace("ForCausalLM", "Config"))()
        ours = model_config_from_hf({**BASE, "architectures": [name]})
        assert (ours.rms_norm_eps, ours.tie_word_embeddings, ours.rope_theta, ours.max_position_embeddings) == (
            hf.rms_norm_eps, hf.tie_word_embeddings, hf.rope_parameters["rope_theta"],
            hf.max_position_embeddings), name


@pytest.mark.parametrize(("change", "match"), [
    ({"hidden_act": "gelu"}, "unsupported hidden_act 'gelu' in config: only 'silu'"),
    ({"num_key_value_heads": 3, "num_attention_heads": 4}, "num_attention_heads=4 is not a multiple of "
                                                            "num_key_value_heads=3 in config"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor in config is not supported"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor in config is not supported"),
])
def test_a_config_the_model_cannot_run_is_refused_by_name(change, match):
    """Settings the Llama-family model does not implement would load and then compute something else:
    refused before a weight is read."""
    with pytest.raises(ValueError, match=match):
        model_config_from_hf({**BASE, "architectures": ["LlamaForCausalLM"], **change})


@pytest.mark.parametrize(("architecture", "change", "window"), [
    ("Qwen2ForCausalLM", {"sliding_window": 4096, "use_sliding_window": False}, None),  # as Qwen2.5 ships
    ("Qwen2ForCausalLM", {"sliding_window": 4096, "use_sliding_window": True}, 4096),
    ("MistralForCausalLM", {"sliding_window": 4096}, 4096),  # Mistral has no switch: a window is used
    ("MistralForCausalLM", {"sliding_window": None}, None),
])
def test_a_sliding_window_counts_only_where_the_model_uses_it(architecture, change, window):
    assert model_config_from_hf({**BASE, "architectures": [architecture], **change}).sliding_window == window


def test_unsupported_rope_scaling_is_named(checkpoint_copy):
    config = json.loads((checkpoint_copy / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    (checkpoint_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unsupported rope scaling type 'yarn'"):
        LLM(str(checkpoint_copy), skip_tokenizer_init=True)


def test_transformers4_config_keys_are_read(checkpoint_copy):
    config = json.loads((checkpoint_copy / "config.json").read_text())
    theta = config.pop("rope_parameters")["rope_theta"]
    config.pop("dtype")
    config.update(rope_theta=theta * 2, rope_scaling={"type": "linear", "factor": 2.0}, torch_dtype="bfloat16")
    parsed = model_config_from_hf(config)
    assert parsed.rope_theta == theta * 2
    assert parsed.rope_scaling == {"type": "linear", "factor": 2.0, "rope_type": "linear"}
    assert parsed.checkpoint_dtype == "bfloat16"


def test_missing_weights_name_the_folder_and_refuse_pickle(checkpoint_copy):
    (checkpoint_copy / "model.safetensors").rename(checkpoint_copy / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"no \*\.safetensors weight files in .*pytorch_model\.bin.*pickle"):
        LLM(str(checkpoint_copy), skip_tokenizer_init=True)


def test_corrupt_weight_file_is_named(checkpoint_copy):
    path = checkpoint_copy / "model.safetensors"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ValueError, match="model.safetensors is corrupt"):
        LLM(str(checkpoint_copy), skip_tokenizer_init=True)


def test_shape_mismatch_names_the_tensor(checkpoint_copy):
    path = checkpoint_copy / "model.safetensors"
    tensors = load_file(path)
    name = "model.layers.1.self_attn.k_proj.weight"
    tensors[name] = torch.zeros(3, 64)
    save_file(tensors, path)
    expected = rf"tensor '{name}' in .* has shape \(3, 64\), but config.json implies \(16, 64\)"
    with pytest.raises(ValueError, match=expected):
        LLM(str(checkpoint_copy), skip_tokenizer_init=True)


def test_missing_tensor_is_named(checkpoint_copy):
    path = checkpoint_copy / "model.safetensors"
    tensors = load_file(path)
    del tensors["model.layers.0.mlp.up_proj.weight"]
    save_file(tensors, path)
    with pytest.raises(ValueError, match=r"missing from the checkpoint .*model\.layers\.0\.mlp\.up_proj\.weight"):
        LLM(str(checkpoint_copy), skip_tokenizer_init=True)


def test_unexpected_tensor_is_named(checkpoint_copy):
    path = checkpoint_copy / "model.safetensors"
    tensors = load_file(path)
    tensors["model.layers.0.self_attn.extra.weight"] = torch.zeros(2)
    save_file(tensors, path)
    with pytest.raises(ValueError, match="unexpected tensor 'model.layers.0.self_attn.extra.weight'"):
        LLM(str(checkpoint_copy), skip_tokenizer_init=True)


def test_rotary_tables_saved_by_older_transformers_are_skipped(checkpoint_copy):
    """transformers 4.3x saved each layer's rotary_emb.inv_freq buffer; minillm computes its own table
    from config.json, so the tensor is neither an error nor read."""
    def greedy() -> tuple[list[int], list[float]]:
        out = LLM(str(checkpoint_copy), skip_tokenizer_init=True, dtype="float32").generate(
            {"prompt_token_ids": [1, 2, 3]}, SamplingParams(temperature=0, max_tokens=3, logprobs=0),
            use_tqdm=False)[0].outputs[0]
        return out.token_ids, [next(iter(lp.values())).logprob for lp in out.logprobs]

    before = greedy()
    path = checkpoint_copy / "model.safetensors"
    tensors = load_file(path)
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.full((8,), float("nan"))
    save_file(tensors, path)
    assert greedy() == before  # NaN frequencies, were they read, would change every logprob


def test_a_shard_missing_from_an_index_is_named(hf_checkpoint, tmp_path):
    hf, _ = hf_checkpoint("qwen2_bias")
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(ValueError, match=f"weight file .*{shard.name} listed in model.safetensors.index.json is "
                                         "missing"):
        LLM(str(tmp_path), skip_tokenizer_init=True)


def test_sharded_checkpoint_loads(hf_checkpoint, tmp_path):
    hf, _ = hf_checkpoint("qwen2_bias")
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    llm = LLM(str(tmp_path), skip_tokenizer_init=True)
    out = llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(temperature=0, max_tokens=5,
                                                                       ignore_eos=True), use_tqdm=False)
    expected = hf.generate(torch.tensor([[1, 2, 3]]), do_sample=False, max_new_tokens=5, min_new_tokens=5)
    assert out[0].outputs[0].token_ids == expected[0, 3:].tolist()


def test_skip_tokenizer_init_works_without_tokenizer_files(checkpoint_copy):
    assert not any(p.name.startswith("tokenizer") for p in checkpoint_copy.iterdir())
    with pytest.raises(ValueError, match="has no tokenizer files .*skip_tokenizer_init=True"):
        LLM(str(checkpoint_copy))
    llm = LLM(str(checkpoint_copy), skip_tokenizer_init=True)
    out = llm.generate({"prompt_token_ids": [5, 6]}, SamplingParams(max_tokens=3), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 3 and out.outputs[0].text == ""
    with pytest.raises(ValueError, match="prompt must be .*prompt_token_ids.* when skip_tokenizer_init=True"):
        llm.generate("text needs a tokenizer", use_tqdm=False)


@pytest.mark.parametrize("name", ["no-such-model", "./no/such/folder", "org/no-such-model-offline"])
def test_unknown_model_raises_value_error_naming_it(name):
    with pytest.raises(ValueError, match=f"unknown model '{name}'"):
        LLM(name)


def test_sliding_window_caps_max_model_len(checkpoint_copy):
    config = json.loads((checkpoint_copy / "config.json").read_text())
    config.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=64)
    (checkpoint_copy / "config.json").write_text(json.dumps(config))
    llm = LLM(str(checkpoint_copy), skip_tokenizer_init=True)
    assert llm.llm_engine.max_model_len == 64
    with pytest.raises(ValueError, match=r"max_model_len must be an integer in \[2, 64\]"):
        LLM(str(checkpoint_copy), skip_tokenizer_init=True, max_model_len=128)
