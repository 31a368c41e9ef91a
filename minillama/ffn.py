"""SwiGLU feed-forward: w2(silu(w1 x) · w3 x) (chapter 6).

Shazeer 2020, "GLU variants improve Transformer". Reproduces meta-llama/llama3 `llama/model.py`
193–219; the width (14,336 for the 8B) is `ModelArgs.ffn_hidden_dim`.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelArgs


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        hidden = args.ffn_hidden_dim
        self.w1 = nn.Linear(args.dim, hidden, bias=False)  # gate
        self.w2 = nn.Linear(hidden, args.dim, bias=False)  # down
        self.w3 = nn.Linear(args.dim, hidden, bias=False)  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))
