"""Speculative decoding: a draft proposes k tokens, the target checks them in one forward (chapter 10).

At batch 1 a decode step reads every weight of the target to produce one token (chapter 7). A cheap
draft model proposes k tokens d_1..d_k, one small step each; the target then runs one cached forward
over the k + 1 positions [last, d_1, .., d_k] (one read of its weights) and gets its own distribution
p_i at every proposed position. Draft token d_i is kept with probability min(1, p_i(d_i) / q_i(d_i))
(q_i: the draft's distribution); at the first rejection the token is redrawn from
max(0, p_i - q_i), normalised, and the round ends; when all k survive, a bonus token comes from p_{k+1}.
Each round yields between 1 and k + 1 tokens, and every token is distributed exactly as the target
alone would draw it (Leviathan, Kalman and Matias 2023, "Fast Inference from Transformers via
Speculative Decoding", arXiv:2211.17192, Algorithm 1, with the proof; Chen et al. 2023,
arXiv:2302.01318). Greedy decoding is the limit where both distributions are one-hot: a draft token
is kept while it equals the target's argmax, so the output is the target's greedy output token for
token (up to float rounding of near-tied logits: the k + 1-position forward adds in another order
than a one-position step). With an acceptance rate α per token, a round yields on average
(1 - α^(k+1)) / (1 - α) tokens (Leviathan et al., section 3). The loop follows the shape of
pytorch-labs/gpt-fast `generate.py` `speculative_decode` (`minillama.sources` key "gpt-fast-speculative"), written
here for ragged batches.

The cache needs no rollback: positions a rejected draft token wrote (in the draft's and the target's
static cache) lie beyond the row's accepted length; the causal mask hides every position after a
query's own, and the next round writes those positions again before any query reaches them.

Ragged batches: every row has its own position `pos` `[b]` (the model takes per-row start positions)
and keeps as many tokens as it accepted. A row that has finished stops advancing and rewrites the
same cache rows until the whole batch is done.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .decode import prefill
from .model import Transformer
from .sampling import argmax, draw, probabilities


@dataclass
class SpeculativeStats:
    """What a speculative `generate` call did; pass one as `stats=` and read it afterwards.

    Counts are over rows still running in each round; `proposed`/`accepted` count draft tokens,
    `produced` the tokens rounds committed (accepted + one target token each, before the cut at
    max_new_tokens), `tokens` the new tokens returned (the prefill's first token included)."""

    k: int = 0
    rounds: int = 0  # target verify forwards (each one k + 1-position forward of the whole batch)
    row_rounds: int = 0  # rounds summed over the rows still running in them
    proposed: int = 0
    accepted: int = 0
    produced: int = 0
    tokens: int = 0
    seconds: float = 0.0
    accepted_hist: list[int] = field(default_factory=list)  # rounds (per row) that kept 0, 1, .., k drafts

    @property
    def acceptance_rate(self) -> float:
        """The share of proposed draft tokens the target kept."""
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def alpha(self) -> float:
        """The per-token acceptance probability α of Leviathan et al.: accepted draft tokens over the
        draft tokens the target examined (a round examines proposals up to its first rejection)."""
        examined = self.accepted + self.row_rounds - (self.accepted_hist[-1] if self.accepted_hist else 0)
        return self.accepted / examined if examined else float("nan")

    @property
    def tokens_per_forward(self) -> float:
        """Tokens a row gets per target forward (1 without speculation, at most k + 1)."""
        return self.produced / self.row_rounds if self.row_rounds else float("nan")

    @property
    def ms_per_token(self) -> float:
        """Wall time of the call (prefill included) per new token returned, in milliseconds."""
        return 1e3 * self.seconds / self.tokens if self.tokens else float("nan")

    def __str__(self) -> str:
        return (
            f"k={self.k}: {self.accepted}/{self.proposed} draft tokens accepted "
            f"({self.acceptance_rate:.1%}), {self.tokens_per_forward:.2f} tokens per target forward over "
            f"{self.rounds} verify forwards, {self.tokens} tokens in {self.seconds:.3f} s "
            f"({self.ms_per_token:.2f} ms per token)"
        )


def self_draft(model: Transformer, kind: str = "int8") -> Transformer:
    """A draft made of the target's own weights, stored smaller: "int8" quantises a bfloat16 copy
    weight-only to int8 (`ml.quantize`, chapter 9; a quarter of float32's bytes, and bfloat16
    activations, which CPU int8 kernels run far faster than float32 ones), "bf16" is a bfloat16 copy
    (half of float32's bytes). It predicts what the target predicts up to the rounding of its weights
    and activations, so most of its proposals are accepted even when the weights are random."""
    if kind not in ("bf16", "int8"):
        raise ValueError(f"kind={kind!r} is not a self-draft kind; use 'int8' or 'bf16'")
    caches = [layer.attention.cache for layer in model.layers]
    model.clear_cache()  # the copy should not carry the target's cache
    try:
        draft = copy.deepcopy(model)
    finally:
        for layer, cache in zip(model.layers, caches, strict=True):
            layer.attention.cache = cache
    draft = draft.to(torch.bfloat16)
    if kind == "int8":
        from .quantize import quantize

        quantize(draft, "int8")
    return draft


def check_draft(target: Transformer, draft: Transformer, k) -> None:
    """Raise a ValueError naming the problem when `draft` cannot draft for `target` with k tokens."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"speculate_k={k!r} must be an integer >= 1 (the draft tokens per round, e.g. 4)")
    if draft is target:
        raise ValueError(
            "draft is the target model itself; the two need separate caches: pass a smaller model or "
            "a copy, e.g. minillama.speculative.self_draft(model)"
        )
    if not isinstance(draft, Transformer):
        raise ValueError(f"draft must be a minillama Transformer; got {type(draft).__name__}")
    if draft.args.vocab_size != target.args.vocab_size:
        raise ValueError(
            f"the draft's vocabulary ({draft.args.vocab_size} tokens) differs from the target's "
            f"({target.args.vocab_size}); a draft must use the same tokenizer (e.g. Llama 3.2 1B for 3.1 8B)"
        )


def check_fit(model: Transformer, name: str, longest: int, max_new_tokens: int, k: int, max_seq_len) -> None:
    """A round writes k positions past the last accepted token: the cache must hold them."""
    needed = longest + max_new_tokens - 1 + k
    limit = max_seq_len if max_seq_len is not None else model.args.max_seq_len
    if needed > limit:
        raise ValueError(
            f"speculate_k={k} does not fit the {name}'s cache: a prompt of {longest} tokens + "
            f"{max_new_tokens} new tokens + {k} draft positions needs {needed} positions, more than "
            f"max_seq_len={limit}; lower speculate_k to {max(limit - longest - max_new_tokens + 1, 0)} "
            f"or max_new_tokens, or raise max_seq_len"
        )


def propose(
    draft, prev, last, pos, k, sampling, step, forward=None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The draft's k tokens `[b, k]` and, when sampling, their distributions q `[b, k, v]`.

    The first step feeds the last two committed tokens [prev, last] at positions pos - 1, pos: when the
    previous round accepted every draft token, the draft never saw its own last proposal, and writing
    position pos - 1 again mends that (for other rows it rewrites what is already there). `step` runs
    the other k - 1 one-token steps, `forward` (default `verify`) the first two-token one."""
    greedy = sampling["temperature"] == 0
    logits = (forward or verify)(draft, torch.stack((prev, last), dim=1), pos - 1)[:, -1]
    tokens, dists = [], []
    for i in range(k):
        if i == 0 and greedy:
            token = argmax(logits)
        elif i == 0:
            dists.append(probabilities(logits, **_dist(sampling)))
            token = draw(dists[-1], sampling["generator"])
        else:  # a decode step (compiled, when `step` is), which draws from q itself when sampling
            token, logits = step(draft, token[:, None], pos + i, **sampling)
            token = token[:, 0]
            if not greedy:
                dists.append(probabilities(logits, **_dist(sampling)))
        tokens.append(token)
    return torch.stack(tokens, dim=1), None if greedy else torch.stack(dists, dim=1)


def verify(model: Transformer, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """A cached forward over `tokens` `[b, t]` at positions pos .. pos + t - 1 (`pos` `[b]`): the logits
    `[b, t, v]` for the token after each. The verify pass is the target's, over [last, d_1, .., d_k];
    the draft's first step of a round is one too, over two positions. Compile it
    (`torch.compile(verify, fullgraph=True, dynamic=False)`) and pass it as `verify_step`."""
    return model(tokens, start_pos=pos)


def accept_greedy(drafts: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep draft tokens while they equal the target's argmax: (kept n `[b]`, the target's token after
    them `[b]`)."""
    b, k1, v = logits.shape
    best = argmax(logits.reshape(b * k1, v)).view(b, k1)
    n = (drafts == best[:, :-1]).cumprod(dim=1).sum(dim=1)
    return n, best.gather(1, n[:, None])[:, 0]


def accept_sampled(drafts, p, q, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rejection rule: draft token d_i (drawn from q_i) is kept with probability
    min(1, p_i(d_i) / q_i(d_i)); the first rejected position draws from max(0, p_i - q_i), normalised;
    when all k are kept the extra token draws from p_{k+1}. p `[b, k + 1, v]`, q `[b, k, v]`."""
    b, k = drafts.shape
    p_d = p[:, :k].gather(2, drafts[:, :, None])[:, :, 0]
    q_d = q.gather(2, drafts[:, :, None])[:, :, 0]
    u = torch.rand(b, k, generator=generator, device=p.device)
    n = (u * q_d < p_d).cumprod(dim=1).sum(dim=1)  # u < p/q, written without dividing by q
    rows = torch.arange(b, device=p.device)
    p_n = p[rows, n]
    q_n = torch.cat((q, torch.zeros_like(q[:, :1])), dim=1)[rows, n]  # q = 0 after the last draft: p itself
    residual = (p_n - q_n).clamp_min(0.0)
    # where p <= q everywhere up to rounding, no token can have been rejected in exact arithmetic
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p_n)
    return n, draw(residual, generator)  # draw needs weights, not a normalised distribution


def _dist(sampling: dict) -> dict:
    return {key: sampling[key] for key in ("temperature", "top_k", "top_p")}


@torch.inference_mode()
def rounds(
    target, draft, rows, max_new_tokens, stops, sampling, k, step, verify_step=None, stats=None
) -> Iterator[list[list[int]]]:
    """Prefill both models, then speculate: yields, per round, each row's newly committed tokens
    (a row's list ends at its first stop token, kept, and at max_new_tokens in all)."""
    verify_step = verify_step or verify
    stats = stats if stats is not None else SpeculativeStats()
    stats.k, stats.accepted_hist = k, [0] * (k + 1)
    begin = time.perf_counter()
    device = target.output.weight.device
    b, longest = len(rows), max(len(r) for r in rows)
    tokens = torch.zeros(b, longest, dtype=torch.long)
    for r, row in enumerate(rows):
        tokens[r, : len(row)] = torch.tensor(row)  # right-padded; pads are overwritten before being read
    tokens = tokens.to(device)
    lengths = torch.tensor([len(r) for r in rows], device=device)
    first, _ = prefill(target, tokens, lengths, **sampling)
    draft(tokens, start_pos=0, logits_at=lengths - 1)  # fills the draft's cache; its logits are not needed
    last, pos = first[:, 0], lengths.clone()
    prev = tokens.gather(1, (lengths - 1)[:, None])[:, 0]
    out = [[t] for t in last.tolist()]
    counts = [1] * b
    done = [t in stops or max_new_tokens == 1 for t in last.tolist()]
    stats.tokens += b
    stats.seconds = time.perf_counter() - begin
    yield out
    while not all(done):
        drafts, q = propose(draft, prev, last, pos, k, sampling, step, verify_step)
        seq = torch.cat((last[:, None], drafts), dim=1)  # [b, k + 1]
        logits = verify_step(target, seq, pos)
        if q is None:
            n, nxt = accept_greedy(drafts, logits)
        else:
            n, nxt = accept_sampled(
                drafts, probabilities(logits, **_dist(sampling)), q, sampling["generator"]
            )
        out, advance = _commit(
            drafts.tolist(), n.tolist(), nxt.tolist(), done, counts, max_new_tokens, stops, stats
        )
        stats.rounds += 1
        stats.seconds = time.perf_counter() - begin
        yield out
        advance = torch.tensor(advance, device=device)
        moving = advance > 0
        prev = torch.where(moving, seq.gather(1, n[:, None])[:, 0], prev)  # the token at the new pos - 1
        last = torch.where(moving, nxt, last)
        pos = pos + advance


def _commit(drafts, n, nxt, done, counts, max_new_tokens, stops, stats) -> tuple[list[list[int]], list[int]]:
    """Each running row's committed tokens (accepted drafts + the target's token), cut at a stop token
    and at max_new_tokens; how far each row's position advances (0 once it is done, so a finished
    row never writes past its cache). Updates `done`, `counts` and `stats` in place."""
    out, advance = [], []
    for r, row_n in enumerate(n):
        if done[r]:
            out.append([])
            advance.append(0)
            continue
        new = drafts[r][:row_n] + [nxt[r]]
        stats.row_rounds += 1
        stats.proposed += len(drafts[r])
        stats.accepted += row_n
        stats.produced += len(new)
        stats.accepted_hist[row_n] += 1
        new = new[: max_new_tokens - counts[r]]
        for i, t in enumerate(new):
            if t in stops:
                new, done[r] = new[: i + 1], True
                break
        counts[r] += len(new)
        stats.tokens += len(new)
        done[r] = done[r] or counts[r] >= max_new_tokens
        out.append(new)
        advance.append(0 if done[r] else row_n + 1)
    return out, advance
