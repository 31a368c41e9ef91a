"""Serving many users: a paged KV cache, prefix sharing, continuous batching, the engine (chapter 12).

One concept per module: `paged_cache` (the pool of blocks and the view a forward reads it through),
`block_manager` (free list, reference counts, prefix hashes), `sequence` (a request's state and its
sampling parameters), `scheduler` (who runs in the next step, chunked prefill, preemption), `runner`
(a step's batch as tensors through the model), `engine` (add_request / step / abort / generate).
Imports run one way: this package uses `model` and `sampling`; nothing below imports it.
"""

from .block_manager import BlockManager, block_hash
from .engine import Engine
from .paged_cache import PagedKVCache, PagedView
from .scheduler import Scheduler
from .sequence import SamplingParams, Sequence, StepOutput

__all__ = [
    "BlockManager",
    "Engine",
    "PagedKVCache",
    "PagedView",
    "SamplingParams",
    "Scheduler",
    "Sequence",
    "StepOutput",
    "block_hash",
]
