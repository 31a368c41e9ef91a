import torch

import minillama as ml


def hf_inv_freq(args):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=args.dim,
        num_attention_heads=args.n_heads,
        max_position_embeddings=args.max_seq_len,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": args.rope_theta,
            "factor": args.rope_scale_factor,
            "low_freq_factor": args.rope_low_freq_factor,
            "high_freq_factor": args.rope_high_freq_factor,
            "original_max_position_embeddings": args.rope_original_max_seq_len,
        },
    )
    return ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")[0]


def test_scaled_frequencies_match_hugging_face_and_meta():
    from llama_models.llama3.model import apply_scaling

    for name in ["llama-3.1-8b", "tiny"]:
        args = ml.MODELS[name]
        ours = ml.inv_freq(args)
        torch.testing.assert_close(ours, hf_inv_freq(args), rtol=0, atol=0)
        torch.testing.assert_close(
            ours, apply_scaling(ml.inv_freq(args.replace(use_scaled_rope=False))), rtol=0, atol=0
        )


def test_scaling_changes_exactly_the_long_wavelengths():
    args = ml.MODELS["llama-3.1-8b"]
    plain, scaled = ml.inv_freq(args.replace(use_scaled_rope=False)), ml.inv_freq(args)
    wavelen = 2 * torch.pi / plain
    short, long = wavelen < 2048, wavelen > 8192
    assert torch.equal(scaled[short], plain[short])
    torch.testing.assert_close(scaled[long], plain[long] / 8)
    middle = ~short & ~long
    assert middle.any() and ((scaled[middle] < plain[middle]) & (scaled[middle] > plain[middle] / 8)).all()


def test_rotation_matches_meta_reference_complex_form():
    from llama_models.llama3.model import apply_rotary_emb, precompute_freqs_cis

    args = ml.MODELS["tiny"]
    rope = ml.RotaryEmbedding(args)
    g = torch.Generator().manual_seed(0)
    xq, xk = torch.randn(2, 10, 8, 32, generator=g), torch.randn(2, 10, 2, 32, generator=g)
    positions = torch.arange(100, 110)[None]
    cos, sin = rope(positions)  # [1, t, p]
    freqs_cis = precompute_freqs_cis(32, 2048, args.rope_theta, True)[100:110]
    ref_q, ref_k = apply_rotary_emb(xq, xk, freqs_cis)
    # ours works on [..., t, hd]: move heads in front of positions
    ours_q = ml.apply_rotary(xq.transpose(1, 2), cos[:, None], sin[:, None]).transpose(1, 2)
    ours_k = ml.apply_rotary(xk.transpose(1, 2), cos[:, None], sin[:, None]).transpose(1, 2)
    torch.testing.assert_close(ours_q, ref_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours_k, ref_k, rtol=1e-6, atol=1e-6)


def test_scores_depend_only_on_distance():
    args = ml.MODELS["tiny"]
    rope = ml.RotaryEmbedding(args)
    g = torch.Generator().manual_seed(1)
    q, k = (
        torch.randn(32, generator=g, dtype=torch.float64),
        torch.randn(32, generator=g, dtype=torch.float64),
    )

    def score(m, n):
        cos, sin = rope(torch.tensor([[m, n]]))
        rq = ml.apply_rotary(q[None], cos[0, :1].double(), sin[0, :1].double())
        rk = ml.apply_rotary(k[None], cos[0, 1:].double(), sin[0, 1:].double())
        return (rq * rk).sum().item()

    for shift in [1, 37, 1500]:
        assert abs(score(10 + shift, 3 + shift) - score(10, 3)) < 1e-4


def test_tables_stay_float32_and_follow_the_device():
    rope = ml.RotaryEmbedding(ml.MODELS["tiny"])
    before = rope.cos.clone()
    rope.to(torch.bfloat16)
    assert rope.cos.dtype == torch.float32 and torch.equal(rope.cos, before)
    assert "cos" not in rope.state_dict()
    with torch.device("meta"):
        m = ml.RotaryEmbedding(ml.MODELS["llama-3.1-405b"])
    assert m.cos.is_meta and tuple(m.cos.shape) == (131_072, 64)
