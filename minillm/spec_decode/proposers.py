"""The proposer an engine speculates with, built from its `speculative_config`."""

from __future__ import annotations

import torch

from minillm.attention.paged import PagedAttention
from minillm.config.model import ModelConfig
from minillm.config.speculative import SpeculativeConfig
from minillm.engine.input_buffers import InputBuffers
from minillm.kernels.ops import KernelOps
from minillm.kv.cache_manager import KVCacheManager
from minillm.kv.pool import KVPool
from minillm.models.interface import CausalLM
from minillm.models.loader import load_model, load_tokenizer, resolve_model_path
from minillm.models.registry import read_model_config
from minillm.spec_decode.draft_model import DraftModelProposer
from minillm.spec_decode.ngram import NgramProposer
from minillm.spec_decode.proposer import Proposer

KEY = "speculative_config['model']"


def load_draft_model(config: SpeculativeConfig, target: ModelConfig, tokenizer, dtype: torch.dtype,
                     device: torch.device, ops: KernelOps, max_model_len: int) -> tuple[CausalLM, ModelConfig]:
    """The draft model, checked against the target: the same vocabulary (token ids mean the same
    text in both) and room for every position the target may reach."""
    try:
        path = resolve_model_path(config.model)
        draft = read_model_config(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"{KEY}={config.model!r} could not be loaded: {e}") from None
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"{KEY}={config.model!r} has a vocabulary of {draft.vocab_size} tokens, the target "
                         f"{target.vocab_size}: a draft must share the target's tokenizer")
    if tokenizer is not None:
        try:
            same = load_tokenizer(path).get_vocab() == tokenizer.get_vocab()
        except ValueError:
            same = True  # a draft folder without a tokenizer: its vocabulary size is all there is to check
        if not same:
            raise ValueError(f"{KEY}={config.model!r} has a different tokenizer from the target's (same size, "
                             "different tokens): its token ids would mean other text")
    if draft.max_position_embeddings < max_model_len:
        raise ValueError(f"{KEY}={config.model!r} supports {draft.max_position_embeddings} positions, fewer than "
                         f"max_model_len={max_model_len}; lower max_model_len")
    return load_model(path, draft, dtype, device, ops), draft


def create_proposer(config: SpeculativeConfig, draft: tuple[CausalLM, ModelConfig] | None,
                    kv_cache_manager: KVCacheManager, target_attn: PagedAttention, buffers: InputBuffers,
                    generator: torch.Generator, kv_cache_dtype: str) -> Proposer:
    """draft: from load_draft_model, for method "draft_model". Its pool has as many blocks as the
    target's, in the target's dtype, and is read through the target's block tables by an attention
    backend of its own, sized as the target's, on the draft model's kernels (the engine's); buffers: the
    runner's, whose arena stages the draft's inputs too."""
    if config.method == "ngram":
        return NgramProposer(config)
    model, model_config = draft
    target_pool = kv_cache_manager.storage
    dtype = next(model.parameters()).dtype
    pool = KVPool(model_config, kv_cache_manager.num_blocks, kv_cache_manager.block_size, dtype,
                  target_pool.kv_caches[0].device, kv_cache_dtype)
    # Token ids and positions of its own, beside its metadata in the runner's arena: what a draft step
    # stages lies together, and goes over in one copy.
    draft_buffers = InputBuffers(target_attn.max_num_tokens, buffers.arena)
    attn = PagedAttention(pool, model.ops, model_config.head_dim, target_attn.max_num_tokens, target_attn.max_num_seqs,
                          target_attn.max_model_len, buffers.arena)
    return DraftModelProposer(model, attn, draft_buffers, generator)
