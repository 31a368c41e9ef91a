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
        # float32 inside: in bf16 the mean of 4,096 squares loses most of its mantissa. torch's rms_norm
        # is x * rsqrt(mean(x²) + eps) in one call (on a CPU bit for bit the reference's float32
        # arithmetic; the test checks); the gain is applied after the cast back, as in Meta's
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return normed.type_as(x) * self.weight
