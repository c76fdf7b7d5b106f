"""Turn each row of logits into one token, all rows in one pass (the runner groups them by sequence).

Each row carries its own SamplingParams (see sampling_params.py for the semantics). Sampling is
done with the exponential race: argmax(p / E) with E ~ Exp(1) independently per token picks token
i with probability p_i. Its appeal here is that each row's randomness is one block of noise drawn
from that request's own generator, so a seeded request samples the same tokens whatever else
shares the batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from minillm.sample.penalties import Penalties, apply_penalties
from minillm.sampling_params import GREEDY_EPS, SamplingParams
from minillm.utils.staging import host_tensor

# Where the top-p boundary falls exactly on the cumulative sum, float rounding of the softmax
# must not decide whether a token stays: mass within this tolerance counts as reaching top_p.
_TOP_P_TOLERANCE = 1e-6


# The SamplingParams fields that become one tensor each, one value per row.
_COLUMN_DTYPES = {"temperature": torch.float32, "top_k": torch.long, "top_p": torch.float32, "min_p": torch.float32}


def check_fits_tensors(params: SamplingParams) -> None:
    """ValueError naming the field when one of params' values cannot be put in the sampler's tensors.
    Checked as a request arrives, because a step that cannot build them fails every request in it."""
    for name, dtype in _COLUMN_DTYPES.items():
        value = getattr(params, name)
        try:
            torch.tensor([value], dtype=dtype)
        except (RuntimeError, OverflowError, TypeError, ValueError) as e:
            raise ValueError(f"{name}={value!r:.40} does not fit the sampler's {dtype} tensor: {e}") from e


@dataclass
class SamplerOutput:
    """One entry per row of logits sampled."""

    token_ids: list[int]
    # Only when some row asked for logprobs, and computed from the raw logits, as vLLM does:
    sampled_logprobs: list[float] | None = None
    sampled_ranks: list[int] | None = None
    top_token_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None

    def select(self, rows: list[int]) -> SamplerOutput:
        """The entries of `rows` only, in that order."""
        return SamplerOutput(*(None if values is None else [values[i] for i in rows]
                               for values in (self.token_ids, self.sampled_logprobs, self.sampled_ranks,
                                              self.top_token_ids, self.top_logprobs)))


@dataclass
class SamplingMetadata:
    # None when every row is greedy: nothing reads them then, and a greedy step copies nothing to the
    # device (a copy from pageable memory may wait for the device's queued work, which would stall
    # the draft model's steps queued back to back).
    temperature: torch.Tensor | None  # [B]
    top_k: torch.Tensor | None  # [B], 0 = off; None when no row uses it
    top_p: torch.Tensor | None  # [B]
    min_p: torch.Tensor | None  # [B]
    generators: list[torch.Generator | None]
    banned_token_ids: list[list[int]]
    num_logprobs: list[int | None]
    all_greedy: bool  # known on the host, so that a greedy step never waits on the device to decide
    penalties: Penalties | None = None  # None when no row has any

    @classmethod
    def from_seqs(cls, seqs, device: torch.device, offsets: list[int] | None = None,
                  drafts: list[list[int]] | None = None) -> SamplingMetadata:
        """A row per sequence; offsets: how many tokens past its end each row samples (speculation
        verifies several positions of one sequence, and min_tokens may end among them); drafts: the
        drafted tokens before each row's position, which its penalties count as output."""
        params = [s.params for s in seqs]
        offsets = offsets or [0] * len(seqs)
        drafts = drafts or [[] for _ in seqs]
        # A step where no row asks for a penalty skips them, without reading any sequence's tokens.
        penalties = Penalties.from_params(params, [s.prompt_token_ids for s in seqs],
                                          [s.output_token_ids + d for s, d in zip(seqs, drafts)],
                                          device) if any(p.has_penalties for p in params) else None

        all_greedy = all(p.greedy for p in params)

        def column(name: str, unused: float | None = None) -> torch.Tensor | None:
            values = [getattr(p, name) for p in params]
            if all_greedy or unused is not None and all(v == unused for v in values):
                return None
            # Queued behind the step's work (though from pageable memory the driver may wait for it:
            # only steps that sample pay that), read back with the tokens.
            return torch.tensor(values, dtype=_COLUMN_DTYPES[name]).to(device, non_blocking=True)

        return cls(
            temperature=column("temperature"),
            top_k=column("top_k", 0),
            top_p=column("top_p", 1.0),
            min_p=column("min_p", 0.0),
            generators=[s.generator for s in seqs],
            banned_token_ids=[s.banned_token_ids(o) for s, o in zip(seqs, offsets)],
            num_logprobs=[p.logprobs for p in params],
            all_greedy=all_greedy,
            penalties=penalties,
        )


def sampling_probs(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """The distribution each row samples from, after temperature, min_p, top_k and top_p: [B, vocab].
    Greedy rows get a near one-hot; callers take their argmax instead."""
    x = logits / meta.temperature.clamp(min=GREEDY_EPS)[:, None]
    if meta.min_p is not None:
        x = apply_min_p(x, meta.min_p)
    if meta.top_k is not None or meta.top_p is not None:
        x = apply_top_k_top_p(x, meta.top_k, meta.top_p)
    return x.softmax(dim=-1)


def ban_tokens(logits: torch.Tensor, banned_token_ids: list[list[int]]) -> None:
    vocab = logits.shape[-1]
    for row, banned in enumerate(banned_token_ids):
        # A stop token id past the vocabulary can never be sampled, so there is nothing to ban.
        if banned := [i for i in banned if i < vocab]:
            logits[row, banned] = -math.inf


def restrict(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """What every row samples from before temperature and the filters: banned tokens out (in place),
    then the penalties. Logprobs are read before it, from the model's own logits, as vLLM does."""
    ban_tokens(logits, meta.banned_token_ids)
    return logits if meta.penalties is None else apply_penalties(logits, meta.penalties)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    # p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p); compared in logit space so
    # the boundary is exact. log(0) = -inf keeps everything.
    threshold = logits.amax(dim=-1, keepdim=True) + torch.log(min_p)[:, None]
    return logits.masked_fill(logits < threshold, -math.inf)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1)  # ascending
    if top_k is not None:
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
        kth_largest = sorted_logits.gather(1, (vocab - k)[:, None])
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_largest, -math.inf)
    if top_p is not None:
        # Drop a token when it and every less likely token together hold at most 1 - top_p:
        # what remains is the smallest most-likely set with mass >= top_p.
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        limit = torch.where(top_p < 1, 1 - top_p + _TOP_P_TOLERANCE, -1.0)
        drop = cumulative <= limit[:, None]
        drop[:, -1] = False  # the most likely token always stays
        sorted_logits = sorted_logits.masked_fill(drop, -math.inf)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


class Sampler:
    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator  # for requests without a seed of their own

    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        """logits: [B, vocab] float32 -> one token per row."""
        return self.sample_on_device(logits, meta).read()

    def sample_on_device(self, logits: torch.Tensor, meta: SamplingMetadata) -> SampledTokens:
        """One token per row of logits [B, vocab] (float32), queued on the device and on its way to the host."""
        want_logprobs = any(n is not None for n in meta.num_logprobs)
        raw_logprobs = logits.log_softmax(dim=-1) if want_logprobs else None
        logits = restrict(logits, meta)
        tokens = logits.argmax(dim=-1) if meta.all_greedy else self._sample(logits, meta)
        return SampledTokens(tokens, None if raw_logprobs is None else
                             logprob_tensors(raw_logprobs, tokens, max(n or 0 for n in meta.num_logprobs)))

    def _sample(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        greedy_rows = meta.temperature < GREEDY_EPS
        probs = sampling_probs(logits, meta)
        sampled = probs.div_(self._exponential_noise(probs, meta.generators)).argmax(dim=-1)
        return torch.where(greedy_rows, logits.argmax(dim=-1), sampled)

    def _exponential_noise(self, probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
        return per_row_random(probs.shape, generators, self.generator, torch.Tensor.exponential_)


def per_row_random(shape: tuple[int, ...], generators: list[torch.Generator | None], shared: torch.Generator,
                   fill: Callable[..., torch.Tensor]) -> torch.Tensor:
    """Random values [rows, ...] filled in place by `fill` (e.g. Tensor.exponential_): a row with a
    generator of its own draws from it alone, so a seeded request gets the same numbers in any batch;
    the other rows draw together from `shared`."""
    device = shared.device
    out = torch.empty(shape, device=device)
    rows = [i for i, g in enumerate(generators) if g is None]
    if rows:
        out[rows] = fill(torch.empty((len(rows), *shape[1:]), device=device), generator=shared)
    for row, gen in enumerate(generators):
        if gen is not None:
            fill(out[row], generator=gen)
    return out


def logprob_tensors(raw: torch.Tensor, tokens: torch.Tensor, top_n: int) -> dict[str, torch.Tensor]:
    """The chosen tokens' logprobs and ranks under raw (log_softmax of the unfiltered logits), and the
    top_n most likely tokens of each row: SamplerOutput's fields, as tensors on raw's device."""
    chosen = raw.gather(1, tokens[:, None])
    found = {"sampled_logprobs": chosen[:, 0], "sampled_ranks": (raw > chosen).sum(dim=-1) + 1}
    if top_n:
        found["top_logprobs"], found["top_token_ids"] = raw.topk(top_n, dim=-1)
    return found


def fill_logprobs(out: SamplerOutput, raw: torch.Tensor, tokens: torch.Tensor, top_n: int) -> None:
    """out's logprob fields (`logprob_tensors`), read now."""
    for name, values in logprob_tensors(raw, tokens, top_n).items():
        setattr(out, name, values.tolist())


class SampledTokens:
    """A step's sampled tokens [rows] on the device, and their logprobs where a row asked, already on
    their way to the host: copied into pinned memory behind the step's kernels, so that the host goes
    on (the engine prepares and queues the next step) while the device computes, and waits only in
    `read`. `token_ids` stays on the device, where the next step can take its inputs from it."""

    def __init__(self, token_ids: torch.Tensor, logprobs: dict[str, torch.Tensor] | None = None) -> None:
        self.token_ids = token_ids
        values = {"token_ids": token_ids, **(logprobs or {})}
        self._copied = None
        if token_ids.is_cuda:
            self._host = {}
            for name, tensor in values.items():
                host, pinned = host_tensor(tensor, pin=True)  # pageable where no memory can be locked: still right
                self._host[name] = host.copy_(tensor, non_blocking=pinned)
            self._copied = torch.cuda.Event()
            self._copied.record(torch.cuda.current_stream(token_ids.device))
        else:  # a CPU computed them already; any other device is read in one synchronous copy each
            self._host = {name: tensor.cpu() for name, tensor in values.items()}

    def read(self) -> SamplerOutput:
        """The tokens and logprobs on the host, once the device has produced them."""
        if self._copied is not None:
            self._copied.synchronize()
        out = SamplerOutput(token_ids=[])
        for name, values in self._host.items():
            setattr(out, name, values.tolist())
        return out


def score_tokens(logits: torch.Tensor, token_ids: list[int], top_n: int) -> SamplerOutput:
    """How likely each row's logits [rows, vocab] make the given token (logprob and rank) and the
    row's top_n most likely tokens, from the raw logits: a prompt's scores (prompt_logprobs)."""
    out = SamplerOutput(token_ids=list(token_ids))
    fill_logprobs(out, logits.log_softmax(dim=-1), torch.tensor(token_ids, device=logits.device), top_n)
    return out
