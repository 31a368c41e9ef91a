"""Grouped-query attention (chapter 4).

Ainslie et al. 2023. h query heads share kv key/value heads in groups of g = h // kv; query head i
reads KV head i // g, Meta's order (meta-llama/llama3 `llama/model.py` 78–87 `repeat_kv`, 93–98),
so heads split as `(kv g)`. The reference copies each KV head g times; here the group is folded into
the query axis instead, `b kv (g t) hd`, so one attention call per KV head serves all g query heads
and nothing is repeated in memory. Scores are q·k / sqrt(hd), masked, softmaxed over keys
(184–190); `scaled_dot_product_attention` accumulates the softmax in float32 whatever the input dtype.

Shapes: x `[b, t, d]`; queries and keys rotated together as `[b, t, h + kv, hd]`; q `[b, kv, (g t), hd]`;
k, v `[b, kv, s, hd]`, s = keys read; mask `[b or 1, 1, (g t) or 1, s]`, True where a query may read a key.
Under tensor parallelism h and kv are a rank's local counts (h / N, kv / N; `minillama.distributed`).
"""

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .config import ModelArgs
from .kv_cache import KVCache
from .rope import apply_rotary


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_kv_heads, self.n_rep, self.head_dim = args.n_kv_heads, args.n_rep, args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        self.cache: KVCache | None = None

    @property
    def local_kv_heads(self) -> int:
        """KV heads this module holds: all n_kv_heads on one device, n_kv_heads / N on each of N
        tensor-parallel ranks (there wk's weight is a DTensor whose local part holds the rank's rows)."""
        w = self.wk.weight
        return (w.to_local() if hasattr(w, "to_local") else w).shape[0] // self.head_dim

    def forward(self, x, cos, sin, mask, positions=None, end=None):
        """`positions` `[b or 1, t]`: write the new keys and values into the cache at these rows and
        attend over the cache (its first `end` rows when given); None: attend over x alone."""
        g, hd = self.n_rep, self.head_dim
        q, k = self.wq(x), self.wk(x)
        # head counts come from the projections' widths, not the config: under tensor parallelism
        # (chapter 11) a rank's wq and wk hold only its own h / N and kv / N heads; g stays the same
        h_local, kv = q.shape[-1] // hd, k.shape[-1] // hd
        # queries and keys turn by the same angles: rotate all h + kv of their heads in one call
        qk = rearrange(torch.cat((q, k), dim=-1), "b t (heads hd) -> b t heads hd", hd=hd)
        qk = apply_rotary(qk, cos[:, :, None], sin[:, :, None])
        q = rearrange(qk[:, :, :h_local], "b t (kv g) hd -> b kv (g t) hd", kv=kv, g=g)
        k = rearrange(qk[:, :, h_local:], "b t kv hd -> b kv t hd")
        v = rearrange(self.wv(x), "b t (kv hd) -> b kv t hd", kv=kv)
        if positions is not None:
            k, v = self.cache.update(positions, k, v)
            if end is not None:
                k, v = k[:, :, :end], v[:, :, :end]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(rearrange(out, "b kv (g t) hd -> b t (kv g hd)", g=g))
