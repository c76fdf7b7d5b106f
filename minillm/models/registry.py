"""Which model class implements each architecture a checkpoint's config.json may name.

One class covers the whole Llama family: its members differ only by flags that ModelConfig reads
(biases, q/k norms, tied embeddings), so every supported architecture maps to LlamaForCausalLM.
"""

from __future__ import annotations

from minillm.models.llama import LlamaForCausalLM

MODEL_REGISTRY: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
}


def model_class(architecture: str) -> type[LlamaForCausalLM]:
    if architecture not in MODEL_REGISTRY:
        raise ValueError(f"no model implements architecture {architecture!r}: minillm implements "
                         f"{', '.join(MODEL_REGISTRY)}")
    return MODEL_REGISTRY[architecture]
