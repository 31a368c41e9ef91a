"""The Llama 3.1 transformer: blocks, final norm, output head (untied; tied for Llama 3.2 1B/3B) (chapter 6).

Reproduces meta-llama/llama3 `llama/model.py`: a block is h = x + attention(attention_norm(x)),
out = h + feed_forward(ffn_norm(h)) (222–248); the model embeds tokens, runs the blocks, normalises
and projects to float32 logits (251–302). Parameter names are Meta's, so Meta checkpoints load as
they are.

Two ways to call it:
- `model(tokens)`: a full causal forward over `[b, t]` tokens, no cache; autograd works (training).
- `model.setup_cache(batch_size, max_seq_len)` once, then `model(tokens, start_pos=p)`: writes
  cache rows p .. p+t-1 and attends to rows 0 .. p+t-1. `p` is an int, a 0-d integer tensor, or a
  `[b]` tensor of per-row starts (ragged batches). With a tensor nothing depends on Python-side
  positions, so a compiled decode step never recompiles as positions advance.
- `model(tokens, paged=view)` (chapter 12, `minillama.serving`): the keys and values live in a pool of
  fixed-size blocks installed as each attention's cache; `view` says at which positions the new tokens
  sit (`positions` `[b, t]`, for the rotation), where their keys and values go (`slots`), which blocks
  are read (`block_tables`) and which of those keys each query may see (`mask`). The model knows
  nothing of requests or scheduling; the cache object does the writing and the reading.
"""

import torch
from einops import repeat
from torch import nn

from .attention import Attention
from .config import ModelArgs
from .ffn import FeedForward
from .kv_cache import KVCache
from .norm import RMSNorm
from .rope import RotaryEmbedding


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args)
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x, cos, sin, mask, positions=None, end=None):
        h = x + self.attention(self.attention_norm(x), cos, sin, mask, positions, end)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:  # Llama 3.2 1B/3B: one v × d matrix embeds the ids and scores the vocabulary
            self.output.weight = self.tok_embeddings.weight
        self.rope = RotaryEmbedding(args)

    @property
    def cache_shape(self) -> tuple[int, int] | None:
        """(batch_size, max_seq_len) of the cache, or None when there is none."""
        cache = self.layers[0].attention.cache
        return None if cache is None else (cache.batch_size, cache.max_seq_len)

    def setup_cache(self, batch_size: int, max_seq_len: int | None = None) -> None:
        """Preallocate a static KV cache on the model's device and dtype."""
        max_seq_len = self.args.max_seq_len if max_seq_len is None else max_seq_len
        if not 0 < max_seq_len <= self.args.max_seq_len:
            raise ValueError(
                f"max_seq_len={max_seq_len} must be in 1..{self.args.max_seq_len} (the model's "
                f"max_seq_len, which sizes the rotary tables); raise ModelArgs.max_seq_len to go further"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1")
        # the cache holds activations: their dtype is the embedding's (a quantised head holds int codes)
        w = self.tok_embeddings.weight
        for layer in self.layers:
            layer.attention.cache = KVCache(
                batch_size,
                max_seq_len,
                layer.attention.local_kv_heads,  # a rank caches only its own heads under TP
                self.args.head_dim,
                device=w.device,
                dtype=w.dtype,
            )

    def clear_cache(self) -> None:
        for layer in self.layers:
            layer.attention.cache = None

    def reset_cache(self) -> None:
        for layer in self.layers:
            layer.attention.cache.reset()

    def forward(self, tokens: torch.Tensor, start_pos=None, logits_at=None, paged=None) -> torch.Tensor:
        """tokens `[b, t]` -> float32 logits `[b, t, v]`. `logits_at`: None for every position, an
        int (e.g. -1) or a `[b]` tensor of per-row indices into t for one position per row
        (`[b, 1, v]`): prefill needs only the next-token logits, and the head is the largest matrix;
        a `[b, k]` tensor gives k positions per row (`[b, k, v]`). `paged`: a paged cache view
        (`minillama.serving.PagedView`) instead of `start_pos`; it brings its own mask."""
        if paged is None:
            self._check(tokens, start_pos)
        b, t = tokens.shape
        steps = torch.arange(t, device=tokens.device)
        end = None
        if (
            paged is not None
        ):  # positions and mask come with the view, which travels to each attention's cache
            positions, cached, mask = paged.positions, paged, paged.mask
        else:
            if start_pos is None:  # full causal forward over the tokens alone
                positions, cached, keys = steps[None], None, steps
            else:
                if isinstance(start_pos, int):
                    end = start_pos + t  # eager: read only the rows written so far
                start = torch.as_tensor(start_pos, device=tokens.device)
                positions = start.reshape(-1, 1) + steps  # [b or 1, t]
                cached = positions
                keys = torch.arange(end or self.cache_shape[1], device=tokens.device)
            # the causal mask from positions: a query at position i reads keys at positions 0..i
            mask = keys <= positions[:, :, None]  # [b or 1, t, s]
        # the query axis is (g t): one row per head of a group; a single position broadcasts over g
        mask = repeat(mask, "b t s -> b 1 (g t) s", g=self.args.n_rep) if t > 1 else mask[:, None]
        cos, sin = self.rope(positions)
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin, mask, cached, end)
        if logits_at is not None:
            index, rows = torch.as_tensor(logits_at, device=h.device), torch.arange(b, device=h.device)
            if index.ndim < 2:  # one position per row
                h = h[rows, index.expand(b) % t][:, None]
            else:  # k positions per row
                h = h[rows[:, None], index % t]
        return self.output(self.norm(h)).float()

    def _check(self, tokens: torch.Tensor, start_pos) -> None:
        if torch.compiler.is_compiling():
            return
        if tokens.ndim != 2 or tokens.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"tokens must be an integer tensor [batch, positions]; got {tuple(tokens.shape)} {tokens.dtype}"
            )
        b, t = tokens.shape
        # a value check reads the tokens back; skip it only for single-token steps on an accelerator
        if (tokens.device.type == "cpu" or t > 1) and not tokens.is_meta and tokens.numel():
            lo, hi = (int(v) for v in torch.aminmax(tokens))
            if lo < 0 or hi >= self.args.vocab_size:
                raise ValueError(
                    f"token ids must be in 0..{self.args.vocab_size - 1}; got ids from {lo} to {hi}"
                )
        if start_pos is None:
            if t > self.args.max_seq_len:
                raise ValueError(f"{t} positions exceed max_seq_len={self.args.max_seq_len}")
            return
        if self.cache_shape is None:
            raise ValueError(
                "start_pos needs a KV cache: call model.setup_cache(batch_size, max_seq_len) first"
            )
        cache_b, cache_s = self.cache_shape
        if b > cache_b:
            raise ValueError(
                f"batch of {b} sequences is larger than the cache's batch_size={cache_b}; call setup_cache again"
            )
        if isinstance(start_pos, torch.Tensor):
            if start_pos.ndim > 1 or (start_pos.ndim == 1 and start_pos.shape[0] != b):
                raise ValueError(
                    f"start_pos tensor must be 0-d or [{b}] (one start per row); got {tuple(start_pos.shape)}"
                )
            if start_pos.device.type != "cpu":
                return  # reading it back would synchronise every decode step
            first, last = (int(v) for v in torch.aminmax(start_pos))
        else:
            first = last = start_pos
        if first < 0 or last + t > cache_s:
            raise ValueError(
                f"positions {first}..{last + t - 1} do not fit the cache of max_seq_len={cache_s} "
                f"(a prompt of {t} tokens at start_pos {last}); call setup_cache with a larger max_seq_len"
            )


def random_model(args: ModelArgs, device="cpu", dtype=torch.float32, seed: int = 0) -> Transformer:
    """A model of `args`'s shape with random weights (N(0, 0.02), norm gains 1), made on `device`
    without first building it anywhere else."""
    with torch.device("meta"):
        model = Transformer(args)
    model = model.to_empty(device=device).to(dtype)
    if args.tie_embeddings:  # to_empty gives every parameter its own storage: share the head again
        model.output.weight = model.tok_embeddings.weight
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=generator)
    return model.eval()
