"""RMSNorm: y = x / sqrt(mean(x²) + eps) · gain (chapter 2).

Zhang & Sennrich 2019. Reproduces meta-llama/llama3 `llama/model.py` 35–46: the statistic is taken
in float32 and the result cast back to the input dtype before the learned gain is applied.
"""

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # float32 inside: in bf16 the mean of 4,096 squares loses most of its mantissa
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight
