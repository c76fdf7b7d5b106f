"""Train the shipped `tiny` and `tiny-draft` models on the interpreter's standard library.

    python scripts/train_tiny_models.py                 # full run (under 45 minutes on 2 CPU cores)
    python scripts/train_tiny_models.py --smoke --out /tmp/tiny   # a one-minute dry run
    python scripts/train_tiny_models.py --draft-only    # keep the target, retrain only the draft

Steps: a byte-level BPE tokenizer (shared by both models); the target, trained on the training
split; the draft, two of the target's layers distilled from the target (forward KL on its logits,
which is what makes a draft agree with its target); held-out perplexity for both, and the draft's
greedy acceptance rate measured by minillm itself. Everything is seeded; the same interpreter,
torch version and CPU give the same weights. Models are written with `save_pretrained` in
bfloat16 (and evaluated as such), so they load through the same code as any Hugging Face
checkpoint. Run it on an otherwise idle machine: two training threads that must wait for a third
process slow down far more than their share.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minillm.eval.corpus import corpus_fingerprint, read_texts, stdlib_files  # noqa: E402

EOS = "<|endoftext|>"
VOCAB_SIZE = 4096
CONTEXT = 512
TARGET = dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=768)
# The draft has the target's shape with two of its layers, and starts from the target's own
# embeddings, first and last layer and final norm: it begins close to the target's predictions,
# and distillation then teaches the two layers to do the work of six.
DRAFT_LAYERS = (0, 5)


def train_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[EOS], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS,
                                   pad_token=EOS, model_max_length=2048)


def encode(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """One token stream: every file followed by the end-of-text token."""
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def make_model(shape: dict, eos_id: int) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=VOCAB_SIZE, max_position_embeddings=2048, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, bos_token_id=eos_id, eos_token_id=eos_id,
                         pad_token_id=eos_id, rope_parameters={"rope_type": "default",
                                                                "rope_theta": 10000.0},
                         **shape)
    return LlamaForCausalLM(config)


def make_draft(target: LlamaForCausalLM, eos_id: int) -> LlamaForCausalLM:
    draft = make_model({**TARGET, "num_hidden_layers": len(DRAFT_LAYERS)}, eos_id)
    renames = {f"model.layers.{src}.": f"model.layers.{dst}." for dst, src in enumerate(DRAFT_LAYERS)}
    state = {}
    for name, tensor in target.state_dict().items():
        if name.startswith("model.layers."):
            prefix = ".".join(name.split(".")[:3]) + "."
            if prefix not in renames:
                continue
            name = renames[prefix] + name[len(prefix):]
        state[name] = tensor.detach().clone()
    draft.load_state_dict(state)
    return draft.to(next(target.parameters()).device)


def batches(stream: torch.Tensor, steps: int, batch: int, gen: torch.Generator):
    for _ in range(steps):
        starts = torch.randint(0, len(stream) - CONTEXT - 1, (batch,), generator=gen)
        yield torch.stack([stream[s:s + CONTEXT] for s in starts.tolist()])


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def autocast():
    # bfloat16 autocast is twice as fast where the CPU has AMX/AVX512-BF16 (or on a GPU);
    # elsewhere it would be slower than fp32, so it is used only where supported.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    enabled = device == "cuda" or torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return torch.autocast(device, dtype=torch.bfloat16, enabled=enabled)


def train(model, batch_source, steps, peak_lr, teacher=None, desc="train") -> float:
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    loss_ema = float("nan")
    bar = tqdm(batch_source, total=steps, desc=desc, mininterval=10)
    for step, x in enumerate(bar):
        x = x.to(device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr, warmup=max(1, steps // 15))
        with autocast():
            logits = model(input_ids=x).logits[:, :-1].float()
            if teacher is None:
                loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), x[:, 1:].reshape(-1))
            else:
                with torch.no_grad():
                    target = teacher(input_ids=x).logits[:, :-1].float()
                loss = F.kl_div(F.log_softmax(logits, -1).reshape(-1, VOCAB_SIZE),
                                F.log_softmax(target, -1).reshape(-1, VOCAB_SIZE),
                                log_target=True, reduction="batchmean")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_ema = loss.item() if math.isnan(loss_ema) else 0.98 * loss_ema + 0.02 * loss.item()
        bar.set_postfix(loss=f"{loss_ema:.3f}", refresh=False)
    model.eval()
    return loss_ema


@torch.no_grad()
def evaluate(model, stream: torch.Tensor, teacher=None) -> dict:
    """Perplexity over non-overlapping CONTEXT-token windows; top-1 agreement with a teacher."""
    device = next(model.parameters()).device
    nll, count, agree = 0.0, 0, 0
    for start in range(0, len(stream) - 1, CONTEXT):
        x = stream[start:start + CONTEXT + 1].to(device)
        logits = model(input_ids=x[None, :-1]).logits[0].float()
        nll += F.cross_entropy(logits, x[1:], reduction="sum").item()
        count += len(x) - 1
        if teacher is not None:
            agree += (teacher(input_ids=x[None, :-1]).logits[0].argmax(-1)
                      == logits.argmax(-1)).sum().item()
    out = {"heldout_tokens": count, "heldout_perplexity": round(math.exp(nll / count), 3)}
    if teacher is not None:
        out["top1_agreement_with_target"] = round(agree / count, 4)
    return out


# tiny writes Python, so a conversation is written as comments and the reply is what follows them.
CHAT_TEMPLATE = ("{%- for message in messages %}# {{ message['role'] }}: "
                 "{{ message['content'] | replace('\\n', '\\n# ') }}\n{% endfor %}"
                 "{%- if add_generation_prompt %}# assistant:\n{% endif %}")


def _add_transformers4_keys(out: Path) -> None:
    """transformers 5 writes `rope_parameters`, `dtype` and its own tokenizer class name; Colab's
    transformers 4 reads `rope_theta`, `torch_dtype` and `PreTrainedTokenizerFast`. Write both."""
    config = json.loads((out / "config.json").read_text())
    config.setdefault("rope_theta", config.get("rope_parameters", {}).get("rope_theta", 10000.0))
    config.setdefault("torch_dtype", config.get("dtype", "bfloat16"))
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_config["chat_template"] = CHAT_TEMPLATE  # in the config, where transformers 4 and 5 both read it
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")


def save_model(model, tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out)
    model.float()
    tokenizer.save_pretrained(out)
    _add_transformers4_keys(out)


def write_card(out: Path, name: str, params: int, info: dict) -> None:
    (out / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
    (out / "README.md").write_text(
        f"# minillm `{name}`\n\nA {params / 1e6:.1f}M-parameter Llama-architecture model trained "
        "by `scripts/train_tiny_models.py` on the Python standard library's source code, shipped "
        "with minillm so that the course and the tests run offline. It writes text that looks "
        "like Python; it is not useful for anything else.\n\n```json\n"
        + json.dumps(info, indent=2) + "\n```\n")


def measure_acceptance(out: Path, smoke: bool) -> dict:
    """Greedy acceptance of the saved draft against the saved target, measured by minillm itself
    with the defaults of `minillm eval acceptance`, so the figure can be reproduced from the CLI."""
    from minillm import LLM
    from minillm.eval.acceptance import greedy_acceptance, sample_prompts
    from minillm.eval.heldout import eval_token_ids

    target, draft = LLM(str(out / "tiny")), LLM(str(out / "tiny-draft"))
    prompts = sample_prompts(eval_token_ids(target.get_tokenizer()), 4 if smoke else 32, 64, seed=0)
    result = greedy_acceptance(target, draft, prompts, num_tokens=16 if smoke else 64, k=4)
    return {"greedy_acceptance_rate_k4": round(result["acceptance_rate"], 4),
            "greedy_accepted_per_proposed_k4": round(result["accepted_per_proposed"], 4),
            "tokens_per_target_call_k4": round(result["tokens_per_target_call"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "minillm" / "assets")
    ap.add_argument("--target-steps", type=int, default=1150)
    ap.add_argument("--draft-steps", type=int, default=650)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="a few steps only, to check the pipeline")
    ap.add_argument("--draft-only", action="store_true",
                    help="keep the target in --out/tiny and train only the draft (to try draft recipes)")
    args = ap.parse_args()
    if args.smoke:
        args.target_steps, args.draft_steps = 4, 4
    torch.manual_seed(args.seed)
    torch.set_num_threads(os.cpu_count() or 1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()

    train_files, heldout_files = stdlib_files("train"), stdlib_files("heldout")
    train_texts = read_texts(train_files)
    tokenizer = (PreTrainedTokenizerFast.from_pretrained(args.out / "tiny") if args.draft_only
                 else train_tokenizer(train_texts))
    train_stream = encode(tokenizer, train_texts)
    heldout_stream = encode(tokenizer, read_texts(heldout_files))
    if args.smoke:
        heldout_stream = heldout_stream[: 4 * CONTEXT]
    t_tok = time.perf_counter() - t0
    print(f"tokenizer + corpus: {len(train_files)} train files, {len(train_stream)} tokens; "
          f"{len(heldout_files)} held-out files, {len(heldout_stream)} tokens ({t_tok:.0f}s)")

    eos = tokenizer.eos_token_id
    common = {
        "corpus": f"Python {platform.python_version()} standard library (minillm/eval/corpus.py)",
        "corpus_fingerprint": corpus_fingerprint(train_files + heldout_files),
        "train_tokens_in_corpus": len(train_stream),
        "context": CONTEXT, "batch": args.batch, "seed": args.seed,
        "torch": torch.__version__, "device": device,
        "cpu_threads": torch.get_num_threads(),
    }
    if args.draft_only:
        target = LlamaForCausalLM.from_pretrained(args.out / "tiny", dtype=torch.float32).to(device).eval()
    else:
        target = make_model(TARGET, eos).to(device)
        t1 = time.perf_counter()
        target_loss = train(target, batches(train_stream, args.target_steps, args.batch,
                                            torch.Generator().manual_seed(args.seed)),
                            args.target_steps, 2e-3, desc="target")
        t_target = time.perf_counter() - t1
        # From here on the target is exactly the weights that ship (rounded to bfloat16): the draft
        # is distilled from them, and they are what is evaluated.
        target.to(torch.bfloat16).float()
        target_info = {**common, "role": "target", "steps": args.target_steps,
                       "tokens_seen": args.target_steps * args.batch * CONTEXT,
                       "final_train_loss": round(target_loss, 4), "train_seconds": round(t_target),
                       **evaluate(target, heldout_stream)}
        save_model(target, tokenizer, args.out / "tiny")
        write_card(args.out / "tiny", "tiny", sum(p.numel() for p in target.parameters()), target_info)

    draft = make_draft(target, eos)
    t2 = time.perf_counter()
    draft_loss = train(draft, batches(train_stream, args.draft_steps, args.batch,
                                      torch.Generator().manual_seed(args.seed + 1)),
                       args.draft_steps, 1e-3, teacher=target, desc="draft (distilled)")
    t_draft = time.perf_counter() - t2
    draft.to(torch.bfloat16).float()
    draft_info = {**common, "role": f"draft, target layers {list(DRAFT_LAYERS)} distilled from tiny",
                  "steps": args.draft_steps, "tokens_seen": args.draft_steps * args.batch * CONTEXT,
                  "final_distill_kl": round(draft_loss, 4), "train_seconds": round(t_draft),
                  **evaluate(draft, heldout_stream, teacher=target)}
    save_model(draft, tokenizer, args.out / "tiny-draft")
    draft_info.update(measure_acceptance(args.out, args.smoke))
    draft_info["total_pipeline_seconds"] = round(time.perf_counter() - t0)
    write_card(args.out / "tiny-draft", "tiny-draft", sum(p.numel() for p in draft.parameters()), draft_info)
    print(json.dumps(draft_info, indent=2))


if __name__ == "__main__":
    main()
