"""A static, preallocated KV cache (chapter 5).

Each layer keeps keys and values for every position it may ever attend to, `[b, kv, s, hd]`, and a
call writes the rows of its new positions by index. Nothing is concatenated or resized, so a decode
step has the same shapes at position 10 as at position 10,000 (what `torch.compile` and CUDA graphs
need). Meta's reference keeps the same buffers as `[b, s, kv, hd]` (meta-llama/llama3
`llama/model.py` 129–144, written and read at 165–169); head-first suits the attention kernel.
"""

import torch
from torch import nn


class KVCache(nn.Module):
    def __init__(
        self, batch_size: int, max_seq_len: int, n_kv_heads: int, head_dim: int, device=None, dtype=None
    ):
        super().__init__()
        shape = (batch_size, n_kv_heads, max_seq_len, head_dim)
        # persistent=False: the cache is state of a generation, not of the model, so it stays out of state_dict
        self.register_buffer("k", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, device=device, dtype=dtype), persistent=False)

    @property
    def batch_size(self) -> int:
        return self.k.shape[0]

    @property
    def max_seq_len(self) -> int:
        return self.k.shape[2]

    def reset(self) -> None:
        self.k.zero_()
        self.v.zero_()

    def update(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Write `k`, `v` `[b, kv, t, hd]` at `positions` `[b or 1, t]`; return the whole cache of
        the batch's rows, `[b, kv, s, hd]` (the caller masks positions not yet written)."""
        b = k.shape[0]
        if positions.shape[0] == 1:  # every row writes the same positions: one copy along s
            index = positions[0].long()
            self.k[:b].index_copy_(2, index, k)
            self.v[:b].index_copy_(2, index, v)
        else:  # row r writes its own positions
            rows = torch.arange(b, device=k.device)[:, None]
            # advanced indices on dims 0 and 2 put (b, t) first: the values are laid out as b t kv hd
            self.k[rows, :, positions] = k.transpose(1, 2)
            self.v[rows, :, positions] = v.transpose(1, 2)
        return self.k[:b], self.v[:b]
