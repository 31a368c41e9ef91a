import torch

import minillama as ml


def test_matches_meta_reference():
    from llama_models.llama3.model import RMSNorm as MetaRMSNorm

    torch.manual_seed(0)
    ours, theirs = ml.RMSNorm(64, eps=1e-5), MetaRMSNorm(64, eps=1e-5)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        theirs.weight.copy_(ours.weight)
    x = torch.randn(3, 5, 64) * 7
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
    xb = x.bfloat16()
    torch.testing.assert_close(ours.bfloat16()(xb), theirs.bfloat16()(xb), rtol=0, atol=0)


def test_float32_inside_returns_input_dtype_and_beats_bf16_arithmetic():
    torch.manual_seed(1)
    x = (torch.randn(64, 4096) * 3).bfloat16()
    norm = ml.RMSNorm(4096).bfloat16()  # a bf16 model: gain in bf16 too
    y = norm(x)
    assert y.dtype == torch.bfloat16
    exact = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)
    in_bf16 = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)  # no upcast
    assert (y.double() - exact).abs().max() < (in_bf16.double() - exact).abs().max()


def test_unit_rms_with_unit_gain():
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(2)) * 10
    y = ml.RMSNorm(256, eps=0.0)(x)
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(4))
