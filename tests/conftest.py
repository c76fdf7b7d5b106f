"""Shared fixtures and checks. Tests never touch the Hugging Face Hub: random checkpoints are written locally."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
# Under pytest-xdist (`make test` runs one worker per core) each worker, and every process it starts,
# computes on one thread: two-thread processes on as many cores as workers would wait on each other.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)  # in case torch was imported before the variable was set

# Triton reads this when a kernel is defined: set before anything imports minillm.kernels, so that
# without a GPU every kernel runs (and is tested) in Triton's CPU interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from minillm.models.loader import SHIPPED_MODELS  # noqa: E402
from minillm.utils.staging import StagingArena  # noqa: E402

# Every engine on a CPU stages its inputs as a GPU's does, through host arrays of their own copied by
# the arena's flush: a value staged and read before its flush gives wrong tokens here, not only on a
# GPU. (Outside the tests a CPU's arrays are its tensors, and a flush copies nothing.)
StagingArena.separate_host_on_cpu = True

# Small shapes of each supported family; the keys name what each one exercises.
HF_CONFIGS = {
    "llama_mha": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=4)),
    "llama_gqa_tied": ("LlamaConfig", dict(num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True)),
    "llama3_rope_scaling": ("LlamaConfig", dict(
        num_attention_heads=4, num_key_value_heads=1,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "llama_bias": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
                                       mlp_bias=True)),
    "qwen2_bias": ("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=2)),
    "qwen3_qk_norm": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32)),
    "mistral": ("MistralConfig", dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=None)),
}
MODEL_CLASSES = {"LlamaConfig": "LlamaForCausalLM", "Qwen2Config": "Qwen2ForCausalLM",
                 "Qwen3Config": "Qwen3ForCausalLM", "MistralConfig": "MistralForCausalLM"}


def make_hf_model(kind: str, seed: int = 0, weight_std: float = 0.2):
    """A random transformers model of the given family; weights wider than the default init so
    that greedy choices are not decided by float rounding."""
    import transformers

    config_name, extra = HF_CONFIGS[kind]
    config = getattr(transformers, config_name)(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        max_position_embeddings=256, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, MODEL_CLASSES[config_name])(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, weight_std)
    model.generation_config.eos_token_id = None  # random weights: never stop early
    return model


def write_dequantized(quantized: Path, out: Path, packed: str, companions: tuple[str, ...],
                      dequantize: Callable[[dict[str, torch.Tensor], str], torch.Tensor]) -> dict[str, torch.Tensor]:
    """An unquantized float32 checkpoint of the weights a quantized checkpoint holds, in `out` with the
    quantized one's other files: each layer's tensor named `packed` becomes its float32 `weight`,
    dequantize(tensors, layer prefix), its `companions` (scales, zero points, shape) are dropped, and
    every other tensor is cast to float32. Returns the dense tensors by name."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(quantized / "model.safetensors"), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    dense = {}
    for name, tensor in tensors.items():
        prefix, _, kind = name.rpartition(".")
        if kind == packed:
            dense[f"{prefix}.weight"] = dequantize(tensors, prefix)
        elif kind not in companions:
            dense[name] = tensor.float()
    out.mkdir()
    for file in quantized.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, out / file.name)
    config = json.loads((out / "config.json").read_text())
    del config["quantization_config"]
    config["dtype"] = config["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config))
    save_file(dense, str(out / "model.safetensors"), metadata={"format": "pt"})
    return dense


# A quantized checkpoint's engine, in float32 so that it and its dequantized twin choose alike.
QUANT_ENGINE = dict(skip_tokenizer_init=True, dtype="float32", max_model_len=64, num_kv_blocks=16)


def assert_loads_as_dense(quantized: Path, dense_folder: Path, dense: dict[str, torch.Tensor], group_size: int) -> None:
    """The quantized checkpoint loads with every decoder projection int4 in groups of group_size,
    holding exactly the weights (and biases) of `dense` (each checkpoint matrix in its rows of a
    merged layer), and generates the greedy tokens of the dense checkpoint in dense_folder."""
    from minillm import LLM, SamplingParams
    from minillm.layers.quant_linear import QuantLinear
    from minillm.quant.int4 import dequantize_int4

    llm = LLM(str(quantized), **QUANT_ENGINE)
    model = llm.llm_engine.model
    layers = {name: m for name, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert len(layers) == 4 * model.config.num_hidden_layers
    assert {(m.method, m.group_size) for m in layers.values()} == {("int4", group_size)}
    for name, layer in layers.items():
        parent, _, child = name.rpartition(".")
        shards = sorted((index, ckpt) for ckpt, (merged, index) in model.packed_modules_mapping.items()
                        if merged == child) or [(0, child)]
        expected = torch.cat([dense[f"{parent}.{ckpt}.weight"] for _, ckpt in shards])
        assert torch.equal(dequantize_int4(layer.qweight, layer.scales, layer.zeros, group_size), expected), name
        if layer.bias is not None:
            assert torch.equal(layer.bias, torch.cat([dense[f"{parent}.{ckpt}.bias"] for _, ckpt in shards])), name
    prompts = [{"prompt_token_ids": [1, 5, 9, 2, 7]}, {"prompt_token_ids": [3, 3, 8, 40, 11, 2]}]
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    tokens = [[o.outputs[0].token_ids for o in engine.generate(prompts, greedy, use_tqdm=False)]
              for engine in (llm, LLM(str(dense_folder), **QUANT_ENGINE))]
    assert tokens[0] == tokens[1]


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """kind -> (transformers model, folder it was saved to with save_pretrained)."""
    cache = {}

    def get(kind: str):
        if kind not in cache:
            model = make_hf_model(kind)
            path = tmp_path_factory.mktemp(kind)
            model.save_pretrained(path)
            cache[kind] = (model, path)
        return cache[kind]

    return get


@pytest.fixture(scope="session")
def tiny_llm():
    """The shipped model, loaded once for the session; tests must leave its engine empty."""
    from minillm import LLM

    if not (SHIPPED_MODELS["tiny"] / "model.safetensors").is_file():
        pytest.fail("the shipped tiny model is missing from minillm/assets/tiny")
    return LLM("tiny")


# Engine features on a budget that makes steps mix prompt chunks with decodes (max_num_batched_tokens
# 24, max_model_len 96): engine arguments by name. "abort" aborts a request in the middle of the run.
ENGINE_FEATURES = {
    "chunked": {},
    "prefix cache": {"enable_prefix_caching": True, "block_size": 4},
    "preemption": {"num_kv_blocks": 26, "block_size": 4},
    "int8 cache": {"kv_cache_dtype": "int8"},
    "abort": {},
}


def step_until_done(llm, prompts: list, params: list, abort_step: int | None = None) -> dict:
    """Each request's tokens, log-probabilities of those tokens (empty without logprobs), finish reason
    and text, by request id ("0", "1", ...), stepping the engine as generate does; with abort_step,
    request "0" is aborted after that step (and maps to "abort")."""
    engine = llm.llm_engine
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), prompt, p)
    done = {}
    while engine.has_unfinished_requests():
        if engine.num_steps == abort_step:
            assert engine.scheduler.find("0") is not None, "request 0 finished before it could be aborted"
            engine.abort_request("0")
            done["0"] = "abort"
        for out in engine.step():
            if out.finished:
                completion = out.outputs[0]
                logprobs = [e[t].logprob for e, t in zip(completion.logprobs or [], completion.token_ids)]
                done[out.request_id] = (completion.token_ids, logprobs, completion.finish_reason, completion.text)
    return done
