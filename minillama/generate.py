"""Text generation: prefill the prompt, then decode one token at a time from the KV cache (chapter 7).

Autoregressive decoding: x_{n+1} ~ softmax(logits(x_1..x_n) / temperature), restricted to the top-k
tokens and/or the smallest set whose probability reaches top_p (Holtzman et al. 2019, "nucleus
sampling"), or argmax when temperature is 0 (`minillama.sampling`). Meta's loop (meta-llama/llama3 `llama/generation.py`)
recomputes nothing: `prefill` runs the whole prompt once and fills the cache, then `decode_one_token`
feeds one token per row per step. The two are separate functions, as in pytorch-labs/gpt-fast, so the
small, shape-static decode step is what chapter 8 compiles: its position is a tensor, so
`torch.compile(decode_one_token, fullgraph=True)` never recompiles as positions advance. Both live in
`minillama.decode`, below this loop, `speculative` and `serving` (imports run one way; the names stay
importable from here).

Ragged batches: prompts of different lengths are right-padded into one `[b, t]` tensor; prefill reads
each row's logits at its own last prompt position, and decode feeds row r at position len_r + i. A
row never reads a padded cache row: decode overwrites position len_r before any query attends to
it, and the causal mask hides everything beyond. So each row gets what it gets alone (the test checks it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from . import speculative
from .decode import decode_one_token, prefill
from .model import Transformer
from .sampling import argmax, draw, probabilities, sample

__all__ = ["argmax", "decode_one_token", "draw", "generate", "prefill", "probabilities", "sample"]


def _prompt_ids(prompts, tokenizer) -> list[list[int]]:
    if isinstance(prompts, (str, torch.Tensor)) or (
        isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int)
    ):
        raise ValueError(
            "prompts must be a list of prompts, e.g. [ids] or ['text']; wrap a single prompt in a list"
        )
    if not prompts:
        raise ValueError("prompts is empty; pass at least one prompt")
    rows = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if tokenizer is None:
                raise ValueError(f"prompt {i} is text; pass tokenizer= to encode it (or pass token ids)")
            prompt = tokenizer.encode(prompt, bos=True)
        prompt = prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
        if not prompt:
            raise ValueError(
                f"prompt {i} is empty; a prompt needs at least one token (e.g. <|begin_of_text|>)"
            )
        rows.append([int(t) for t in prompt])
    return rows


def _check_sampling(temperature, top_k, top_p, max_new_tokens):
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be at least 1")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 is greedy)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k} must be at least 1 (or None for no top-k cut)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1] (1 keeps every token)")


def context_overflow(prompt_len: int, max_new_tokens: int, limit: int, names=("max_new_tokens", "max_seq_len")):
    """None when a prompt of `prompt_len` tokens and `max_new_tokens` new ones fit `limit` cache positions,
    else the message: how many positions they need, how many prompt tokens to cut, and the largest
    `max_new_tokens` that fits when one does. `names`: how the caller spells the two settings (the CLI
    says --max-new-tokens)."""
    needed = prompt_len + max_new_tokens - 1  # the last new token is never fed back, so never cached
    if needed <= limit:
        return None
    new, cap = names
    cut = needed - limit
    fix = f"cut the prompt by {cut} token{'s' if cut > 1 else ''} (to {limit - max_new_tokens + 1})"
    if prompt_len <= limit:  # the prompt alone fits: fewer new tokens is the other way
        fix += f", or lower {new} to {limit - prompt_len + 1}"
    return (
        f"a prompt of {prompt_len} tokens + {max_new_tokens} new tokens needs {needed} cache positions, more "
        f"than {cap}={limit} (the last new token is never cached: {prompt_len} + {max_new_tokens} - 1); {fix}"
    )


def _setup(model: Transformer, rows: list[list[int]], max_new_tokens: int, max_seq_len: int | None) -> None:
    """Check that the prompts and new tokens fit, and give the model a cache that holds them."""
    b, longest = len(rows), max(len(r) for r in rows)
    needed = longest + max_new_tokens - 1  # the last new token is never fed back
    limit = max_seq_len if max_seq_len is not None else model.args.max_seq_len
    if message := context_overflow(longest, max_new_tokens, limit):
        if max_seq_len is not None and max_seq_len < model.args.max_seq_len:
            message += f", or pass a larger max_seq_len (up to the model's {model.args.max_seq_len})"
        raise ValueError(message)
    vocab = model.args.vocab_size
    for i, row in enumerate(rows):
        if min(row) < 0 or max(row) >= vocab:
            raise ValueError(f"prompt {i} has token ids outside 0..{vocab - 1} (the model's vocab_size)")
    shape = model.cache_shape
    if max_seq_len is not None:
        if shape is None or shape[0] < b or shape[1] != max_seq_len:
            model.setup_cache(b, max_seq_len)
    elif shape is None or shape[0] < b or shape[1] < needed:
        model.setup_cache(b, needed)


@torch.inference_mode()
def _steps(model: Transformer, rows, max_new_tokens, stops, sampling, step) -> Iterator[torch.Tensor]:
    """Prefill, then decode; yields each step's new tokens `[b]` (on the model's device) until every
    row has produced a stop token or `max_new_tokens` tokens."""
    device = model.output.weight.device
    b, longest = len(rows), max(len(r) for r in rows)
    tokens = torch.zeros(b, longest, dtype=torch.long)
    for r, row in enumerate(rows):
        tokens[r, : len(row)] = torch.tensor(row)  # right-padded with 0; the pads are never attended to
    tokens = tokens.to(device)
    lengths = torch.tensor([len(r) for r in rows], device=device)
    stop_ids = torch.tensor(sorted(stops), dtype=torch.long, device=device)
    # the stop check reads a flag back to the host: free on a CPU, a sync per step on an accelerator,
    # so there it runs every few steps (tokens after a row's stop are dropped anyway); with no stop
    # tokens there is nothing to check
    check_every = (1 if device.type == "cpu" else 8) if stops else max_new_tokens

    token, _ = prefill(model, tokens, lengths, **sampling)
    done = torch.isin(token[:, 0], stop_ids)
    yield token[:, 0]
    pos = lengths.clone()
    for i in range(1, max_new_tokens):
        if i % check_every == 0 and bool(done.all()):
            return
        token, _ = step(model, token, pos, **sampling)
        pos += 1
        if stops:
            done |= torch.isin(token[:, 0], stop_ids)
        yield token[:, 0]


def _trim(ids: list[int], stops: set[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in stops:
            return ids[:i]
    return ids


def generate(
    model: Transformer,
    prompts,
    max_new_tokens: int = 32,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int | None = None,
    seed: int | None = 0,
    stop_tokens: Sequence[int] | None = None,
    stream: bool = False,
    tokenizer=None,
    max_seq_len: int | None = None,
    decode_step=None,
    draft: Transformer | None = None,
    speculate_k: int = 4,
    verify_step=None,
    stats=None,
    compile=False,
):
    """Continue each prompt by up to `max_new_tokens` tokens.

    `prompts`: a list of token-id lists, or of strings when `tokenizer` is given (encoded with
    `<|begin_of_text|>`). Greedy when `temperature` is 0; otherwise sampled with a generator seeded by
    `seed` (the same seed gives the same tokens; a batch draws from one generator, so a sampled row
    need not match its unbatched run, while greedy rows always do). `seed=None` draws from torch's
    global generator instead (`torch.manual_seed`), which a `torch.compile(fullgraph=True)` step
    accepts where it rejects a `torch.Generator` argument. A row ends at its first stop
    token (default: the tokenizer's `stop_tokens`, eos 128001, eom 128008, eot 128009; none without a
    tokenizer); the stop token is not returned. The cache is set up for the longest prompt + the new
    tokens unless the model's cache already fits (`max_seq_len` forces its length). `decode_step`
    replaces `decode_one_token`, e.g. with `torch.compile(decode_one_token, fullgraph=True)` (chapter 8).

    `compile=True` decodes with the model's compiled step (`minillama.compiled.compile_decode`: on a
    CPU, frozen weights with Inductor's C++ GEMM template or oneDNN per weight format, the settings
    chapter 8 measures), compiled
    on the first call and cached on the model, so later calls reuse it (until the weights change);
    `compile=` a dict passes those Inductor options instead. The prefill stays eager. The first call
    pays the compilation (`ml.compile_decode(model).compile_s` says how long); nothing recompiles as
    positions advance.

    Speculative decoding (chapter 10, `minillama.speculative`): with `draft=` a smaller model of the
    same vocabulary, the draft proposes `speculate_k` tokens per round and the target checks them in
    one forward; greedy output equals the output without a draft, sampled output follows the target's
    distribution. `decode_step` then runs the draft's one-token steps and `verify_step` (default
    `speculative.verify`) the cached multi-position forwards: the target's k + 1-position verify pass
    and the draft's two-position first step of each round; a `speculative.SpeculativeStats` passed
    as `stats` records acceptance, tokens per target forward and time per token.

    Returns a list with each row's new token ids; with `stream=True` (one prompt) an iterator of text
    pieces as they decode (UTF-8 safe: no piece ends inside a character) when a tokenizer is given,
    else of token ids.
    """
    _check_sampling(temperature, top_k, top_p, max_new_tokens)
    rows = _prompt_ids(prompts, tokenizer)
    if stop_tokens is None:
        stop_tokens = tokenizer.stop_tokens if tokenizer is not None else ()
    stops = {int(t) for t in stop_tokens}
    device = model.output.weight.device
    generator = None
    if temperature > 0 and seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "generator": generator}
    if stream and len(rows) != 1:
        raise ValueError(
            f"stream=True decodes one prompt; got {len(rows)} (call once per prompt, or stream=False)"
        )
    if compile is not False and compile is not None:
        decode_step = _compiled_step(model, compile, decode_step, draft)
    if draft is not None:
        return _speculate(
            model,
            draft,
            rows,
            max_new_tokens,
            stops,
            sampling,
            stream,
            tokenizer,
            max_seq_len,
            speculate_k,
            decode_step,
            verify_step,
            stats,
        )
    _setup(model, rows, max_new_tokens, max_seq_len)  # before any generator starts: errors raise here
    steps = _steps(model, rows, max_new_tokens, stops, sampling, decode_step or decode_one_token)
    if stream:
        return _stream(steps, stops, tokenizer)
    out = torch.stack(list(steps), dim=1)
    return [_trim(row, stops) for row in out.tolist()]


def _compiled_step(model, compile, decode_step, draft):
    """The cached compiled step that `compile=` asks for; a combination it cannot serve is an error."""
    from .compiled import compile_decode

    if draft is not None:
        raise ValueError(
            "compile=True compiles the plain decode step and does not cover speculative decoding (draft=); "
            "compile the draft's step and the verify pass yourself as chapter 10 does (decode_step=, "
            "verify_step=), or leave out draft="
        )
    if decode_step is not None:
        raise ValueError("pass either decode_step= or compile=, not both (compile= builds the decode step)")
    if compile is True:
        return compile_decode(model)
    if isinstance(compile, dict):
        return compile_decode(model, compile)
    raise ValueError(
        f"compile={compile!r}: pass True (the settings of minillama.compiled.options_for the device), "
        "False, or a dict of torch._inductor.config options"
    )


def _speculate(
    model,
    draft,
    rows,
    max_new_tokens,
    stops,
    sampling,
    stream,
    tokenizer,
    max_seq_len,
    k,
    decode_step,
    verify_step,
    stats,
):
    speculative.check_draft(model, draft, k)
    longest = max(len(r) for r in rows)
    for name, net in (("target", model), ("draft", draft)):
        speculative.check_fit(net, name, longest, max_new_tokens, k, max_seq_len)
        _setup(net, rows, max_new_tokens + k, max_seq_len)
    rounds = speculative.rounds(
        model,
        draft,
        rows,
        max_new_tokens,
        stops,
        sampling,
        k,
        decode_step or decode_one_token,
        verify_step,
        stats,
    )
    if stream:  # one row: its tokens one at a time, as each round accepts them
        return _stream((torch.tensor([t]) for out in rounds for t in out[0]), stops, tokenizer)
    out = [[] for _ in rows]
    for new in rounds:
        for row, tokens in zip(out, new, strict=True):
            row.extend(tokens)
    return [_trim(row, stops) for row in out]


def _stream(steps: Iterator[torch.Tensor], stops: set[int], tokenizer) -> Iterator[str] | Iterator[int]:
    decoder = None
    if tokenizer is not None:
        from .tokenizer import StreamDecoder

        decoder = StreamDecoder(tokenizer)
    for token in steps:
        t = int(token[0])
        if t in stops:
            break
        if decoder is None:
            yield t
        elif piece := decoder.push(t):
            yield piece
    if decoder is not None and (rest := decoder.flush()):
        yield rest
