"""What exercise 08's checks feed the learner's functions and how they judge the answers: published
and random Llama-family configurations; a number compared with the engine's own, and a wrong one
compared with what the common mistakes give (attention heads where KV heads belong, K without V, a
tied embedding counted twice, int8 scales forgotten, bits for bytes, ...), so that the message can
name the mistake.
"""

from __future__ import annotations

import dataclasses
import random

import torch

from minillm.config.model import ModelConfig
from minillm.grading.feedback import CheckFailed
from minillm.models.registry import model_config_from_hf

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclasses.dataclass(frozen=True)
class Case:
    label: str
    config: ModelConfig

    def __str__(self) -> str:
        c = self.config
        return (f"{self.label}: {c.num_hidden_layers} layers, hidden_size {c.hidden_size}, "
                f"{c.num_attention_heads} attention heads and {c.num_key_value_heads} KV heads of head_dim "
                f"{c.head_dim}, intermediate_size {c.intermediate_size}, vocab {c.vocab_size}, "
                f"{'tied' if c.tie_word_embeddings else 'untied'} embeddings")


def llama(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int, tied: bool,
          head_dim: int | None = None) -> ModelConfig:
    raw = {"architectures": ["LlamaForCausalLM"], "vocab_size": vocab, "hidden_size": hidden,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
           "intermediate_size": intermediate, "tie_word_embeddings": tied}
    if head_dim is not None:
        raw["head_dim"] = head_dim
    return model_config_from_hf(raw)


def cases(seed: int = 0, num_random: int = 6) -> list[Case]:
    """Published configurations, then random ones: every random one has grouped-query attention (or
    one KV head for all), and they alternate tied and untied embeddings; one in three has a head_dim
    that is not hidden_size / num_attention_heads (as Qwen3's and Gemma's)."""
    found = [Case("Llama-3-8B", llama(4096, 32, 32, 8, 14336, 128256, False)),
             Case("SmolLM2-360M", llama(960, 32, 15, 5, 2560, 49152, True)),
             Case("Llama-2-7B (one KV head per attention head)", llama(4096, 32, 32, 32, 11008, 32000, False))]
    rng = random.Random(seed)
    for i in range(num_random):
        heads = rng.choice((4, 6, 8, 12, 16))
        kv_heads = rng.choice([d for d in range(1, heads) if heads % d == 0])
        head_dim = rng.choice((16, 32, 64))
        hidden = heads * head_dim if i % 3 else rng.choice((64, 96, 128))
        found.append(Case(f"random configuration {i + 1}", llama(
            hidden, rng.randint(1, 6), heads, kv_heads, rng.choice((2, 3, 4)) * hidden, rng.choice((256, 512, 1000)),
            tied=i % 2 == 0, head_dim=head_dim if hidden != heads * head_dim else None)))
    return found


def equal(got: object, expected: int) -> bool:
    try:
        return abs(float(got) - expected) <= 1e-12 * max(1, abs(expected))
    except (TypeError, ValueError):
        return False


def expect_number(got: object, name: str, where: str) -> None:
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        raise CheckFailed(f"{name} returned {type(got).__name__}; expected a number (a Python int)"
                          + (" : call .item() on a one-element tensor" if isinstance(got, torch.Tensor) else "")
                          + f"\n  on input: {where}")


def named_mistake(got: object, expected: int, mistakes: dict[str, float]) -> str | None:
    """The first mistake that gives the learner's answer, unless it also gives the right one."""
    return next((hint for hint, value in mistakes.items() if value != expected and equal(got, int(value))), None)


def fail(name: str, got: object, expected: int, where: str, mistake: str | None, breakdown: str) -> None:
    text = f"{name} returned {got:,}; expected {expected:,}\n  on input: {where}\n  expected = {breakdown}"
    if mistake:
        text += f"\n  your answer is what you get if {mistake}"
    raise CheckFailed(text)
