"""RMSNorm: y = x / sqrt(mean(x²) + eps) · gain (chapter 2).

Zhang & Sennrich 2019. Reproduces meta-llama/llama3 `llama/model.py` 35–46: the statistic is taken
in float32 and the result cast back to the input dtype before the learned gain is applied.
"""

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # float32 inside, as in Meta's reference. In bf16 the per-position scale 1/sqrt(mean(x²) + eps)
        # is rounded to 8 bits and multiplies every channel alike (chapter 2 measures about 1.5x the
        # error of rounding the exact result once), a bf16 running sum of the squares stalls once it is
        # large, and float16 overflows when any |x| reaches 256 (x² > 65,504). torch's rms_norm computes
        # x * rsqrt(mean(x²) + eps) in one call, on a CPU bit for bit the reference's float32 arithmetic
        # (tests/test_norm.py checks). The gain multiplies after the cast back, as in Meta's code.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return normed.type_as(x) * self.weight
