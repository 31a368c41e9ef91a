"""Blocks: a free list, reference counts and prefix sharing by content hash (chapter 12).

The block manager owns the bookkeeping of the pool, not its tensors: which blocks are free (a FIFO
list), how many sequences hold each block (its reference count), and, for every full block, a hash of
its tokens and of everything before them. A new sequence whose prompt starts with blocks already in
the pool (a shared system prompt, a conversation's earlier turns) takes those blocks instead of
computing them again, and its prefill starts after them.

The hash of block i chains the hash of block i - 1 with block i's tokens, so equal hashes mean an
equal whole prefix, not just equal blocks; a hit is also checked against the block's stored tokens.
Only full blocks are shared, and a full block is never written again: a sequence writes only past
its own length, into its last, partial block, which is never shared. So no copy-on-write is needed.
A freed block keeps its hash until the block is handed out again, so a prefix stays reusable after the
request that computed it finished (the oldest freed block is reused first).
Follows the shape of GeeeekExplorer/nano-vllm @ bb823b3 `nanovllm/engine/block_manager.py` (the
chained `compute_hash` 35–41, a reused block forgetting its key in `_allocate_block` 43–51, the prefix
walk of `can_allocate` 58–74), written here without a Block class; SGLang's RadixAttention (Zheng et al.
2024) keeps the same information in a radix tree of tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


def block_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """The key of a full block: its tokens and the key of the block before it (None for the first)."""
    return hash((parent, tuple(tokens)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free: deque[int] = deque(range(num_blocks))
        self.refs = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks  # a full block's key, None while partial
        self.tokens_of: list[tuple[int, ...] | None] = [None] * num_blocks
        self.by_hash: dict[int, int] = {}  # key -> block id, for every full block still in the pool

    @property
    def num_free(self) -> int:
        return len(self.free)

    def blocks_for(self, positions: int) -> int:
        return -(-positions // self.block_size)

    def take(self) -> int:
        """A free block for one sequence; whatever prefix it held is forgotten."""
        block = self.free.popleft()
        if (key := self.hash_of[block]) is not None and self.by_hash.get(key) == block:
            del self.by_hash[key]
        self.hash_of[block] = self.tokens_of[block] = None
        self.refs[block] = 1
        return block

    def release(self, table: list[int]) -> None:
        """Drop one reference to each block of a table; a block nobody holds goes back to the free list."""
        for block in reversed(table):  # the tail first: the start of a prefix stays cached longest
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.append(block)
        table.clear()

    def match_prefix(self, tokens: Sequence[int]) -> list[int]:
        """Take a reference to each cached full block that starts `tokens`, in order; stop at the first miss.
        The last token is never covered: its logits are what the prefill must compute."""
        table, parent, bs = [], None, self.block_size
        for start in range(0, len(tokens) - 1 - bs + 1, bs):
            chunk = tuple(tokens[start : start + bs])
            key = block_hash(parent, chunk)
            block = self.by_hash.get(key)
            if block is None or self.tokens_of[block] != chunk:
                break
            if self.refs[block] == 0:
                self.free.remove(block)  # revived from the free list, prefix intact
            self.refs[block] += 1
            table.append(block)
            parent = key
        return table

    def seal(self, table: list[int], tokens: Sequence[int], computed: int, sealed: int) -> int:
        """Register the blocks of `table` that became full (positions < computed) since `sealed` full
        blocks were registered; returns the new count of registered blocks."""
        bs = self.block_size
        parent = self.hash_of[table[sealed - 1]] if sealed else None
        for i in range(sealed, computed // bs):
            block, chunk = table[i], tuple(tokens[i * bs : (i + 1) * bs])
            key = block_hash(parent, chunk)
            if self.hash_of[block] is None:
                self.hash_of[block], self.tokens_of[block] = key, chunk
                self.by_hash.setdefault(key, block)  # a block with the same prefix may be cached already
            parent = key
        return max(sealed, computed // bs)
