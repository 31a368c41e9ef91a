import torch
from conftest import CONFIGS

import minillama as ml


def reference_attention(attn, args, x, repeat_kv):
    """Attention as Meta's reference computes it, with its repeat_kv (llama-models), no RoPE."""
    b, t, _ = x.shape
    q = attn.wq(x).view(b, t, args.n_heads, args.head_dim)
    k = repeat_kv(attn.wk(x).view(b, t, args.n_kv_heads, args.head_dim), args.n_rep)
    v = repeat_kv(attn.wv(x).view(b, t, args.n_kv_heads, args.head_dim), args.n_rep)
    q, k, v = (z.transpose(1, 2) for z in (q, k, v))
    scores = q @ k.transpose(2, 3) / args.head_dim**0.5
    scores = scores + torch.full((t, t), float("-inf")).triu(1)
    out = torch.softmax(scores.float(), -1) @ v
    return attn.wo(out.transpose(1, 2).reshape(b, t, -1))


def test_head_order_is_metas_repeat_kv():
    from llama_models.llama3.model import repeat_kv

    args = CONFIGS["gqa4"]
    torch.manual_seed(0)
    attn = ml.Attention(args)
    x = torch.randn(2, 9, args.dim)
    t = x.shape[1]
    ones = torch.ones(1, t, args.head_dim // 2)  # cos = 1, sin = 0: no rotation
    mask = torch.ones(t, t, dtype=torch.bool).tril()[None, None].repeat(1, 1, args.n_rep, 1)
    with torch.no_grad():
        ours = attn(x, ones, 0 * ones, mask)
        theirs = reference_attention(attn, args, x, repeat_kv)
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)

        # a (g kv) split would pair query head i with KV head i % kv: a different answer
        def wrong(z, n):  # tiles heads instead of repeating each
            return z.repeat(1, 1, n, 1)

        assert (reference_attention(attn, args, x, wrong) - theirs).abs().max() > 1e-2


def test_no_key_value_repeat_in_memory():
    # the KV projections stay kv heads wide: only wq has h heads
    args = ml.MODELS["llama-3.1-8b"]
    with torch.device("meta"):
        attn = ml.Attention(args)
    assert attn.wk.weight.shape == (8 * 128, 4096) and attn.wq.weight.shape == (4096, 4096)
