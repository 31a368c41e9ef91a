"""Looking inside a forward pass: the residual stream after every block, and one layer's attention
probabilities (chapters 2, 3, 4, 6).

Both run the model's own forward on one sequence and read what its modules compute through forward
hooks, so they see exactly the model's path (its dtype, its rotary tables, its mask), not a copy of it:

    stream = residual_stream(model, tokens)       # [layers + 1, t, d]: row 0 the embeddings, row i the
                                                  # output of block i - 1; the last row, through
                                                  # model.norm and model.output, gives the logits
    probs = attention_probs(model, tokens, layer)  # [h, t, s]: softmax(q·k / sqrt(hd) + causal mask)
                                                  # of every query head, rows sum to 1
    scores = attention_scores(model, tokens, layer)  # [h, t, s]: q·k / sqrt(hd), -inf where masked

`tokens` is one sequence: `[t]` or `[1, t]` integer ids. Both are full causal forwards without a cache
(a cache set up on the model is left untouched).
"""

import math

import torch
from einops import einsum, rearrange
from torch import nn

from .rope import apply_rotary


class _Stop(Exception):
    """Raised by a hook once it has what it needs, so the rest of the forward is not computed."""


def _one_sequence(model: nn.Module, tokens) -> torch.Tensor:
    tokens = torch.as_tensor(tokens)
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2 or tokens.shape[0] != 1:
        raise ValueError(
            f"tokens must be one sequence, [t] or [1, t]; got shape {tuple(tokens.shape)} "
            "(inspect a batch one row at a time)"
        )
    if tokens.shape[1] == 0:
        raise ValueError("tokens is empty: pass at least one token id")
    return tokens.to(model.tok_embeddings.weight.device)


@torch.no_grad()
def residual_stream(model: nn.Module, tokens) -> torch.Tensor:
    """The residual stream of one sequence: `[n_layers + 1, t, d]` in the model's dtype. Row 0 is the
    token embeddings, row i the output of block i - 1 (its input plus attention plus feed-forward)."""
    tokens = _one_sequence(model, tokens)
    rows: list[torch.Tensor] = []

    def keep(module, inputs, output):
        rows.append(output[0].detach())

    handles = [model.tok_embeddings.register_forward_hook(keep)]
    handles += [layer.register_forward_hook(keep) for layer in model.layers]
    try:
        model(tokens, logits_at=-1)  # the head on one position only: its logits are not kept
    finally:
        for handle in handles:
            handle.remove()
    return torch.stack(rows)


@torch.no_grad()
def attention_probs(model: nn.Module, tokens, layer: int) -> torch.Tensor:
    """Attention probabilities of block `layer` on one sequence: `[h, t, s]` float32 (s = t keys), for
    every query head in Meta's order (head i reads KV head i // g): the softmax over the keys of
    `attention_scores`, so a query's row sums to 1 and a key it may not read gets 0."""
    return attention_scores(model, tokens, layer).softmax(dim=-1)


@torch.no_grad()
def attention_scores(model: nn.Module, tokens, layer: int) -> torch.Tensor:
    """Attention scores of block `layer` on one sequence before the softmax: `[h, t, s]` float32,
    q·k / sqrt(hd) where the causal mask lets a query read a key and -inf elsewhere, from the queries
    and keys the block's own wq and wk compute, rotated by the model's own rotary tables; the forward
    stops after that block's wk."""
    n_layers = len(model.layers)
    if not -n_layers <= layer < n_layers:
        raise ValueError(
            f"layer={layer} is out of range: the model has {n_layers} blocks (0..{n_layers - 1})"
        )
    tokens = _one_sequence(model, tokens)
    attention = model.layers[layer].attention
    seen: dict[str, torch.Tensor] = {}

    def inputs(module, args):
        _, seen["cos"], seen["sin"], seen["mask"] = args[:4]

    def output_of(name):
        def hook(module, args, output):
            seen[name] = output.detach()
            if name == "k":  # wq ran first: everything needed is here
                raise _Stop

        return hook

    handles = [
        attention.register_forward_pre_hook(inputs),
        attention.wq.register_forward_hook(output_of("q")),
        attention.wk.register_forward_hook(output_of("k")),
    ]
    try:
        model(tokens)
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    hd, g = attention.head_dim, attention.n_rep
    cos, sin = seen["cos"][:, :, None], seen["sin"][:, :, None]
    q = apply_rotary(rearrange(seen["q"], "b t (h hd) -> b t h hd", hd=hd), cos, sin)
    k = apply_rotary(rearrange(seen["k"], "b t (kv hd) -> b t kv hd", hd=hd), cos, sin)
    # the block's layout: query heads (kv g) folded into the query axis as (g t), where the mask lives
    q = rearrange(q, "b t (kv g) hd -> b kv (g t) hd", g=g)
    scores = einsum(q.float(), k.float(), "b kv gt hd, b s kv hd -> b kv gt s") / math.sqrt(hd)
    scores = scores.masked_fill(~seen["mask"], float("-inf"))
    return rearrange(scores, "1 kv (g t) s -> (kv g) t s", g=g)
