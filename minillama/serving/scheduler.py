"""Continuous batching: which sequences run in the next step, and how many of their tokens (chapter 12).

A static batch starts together and ends with its longest member; here requests join and leave at
every step (Yu et al. 2022, "Orca", iteration-level scheduling). Each step has a budget of tokens
(`max_tokens_per_step`) that it hands out in this order:

1. every running sequence that is decoding gets its one token, oldest first;
2. running sequences still prefilling get the next chunk of their prompt, as much as the budget left
   allows: a long prompt is cut into chunks over several steps instead of stalling everybody's decode
   for one long step (Agrawal et al. 2024, "Sarathi-Serve", chunked prefill);
3. waiting sequences are admitted, first come first served, while the budget, `max_batch` and the
   free blocks allow (a new sequence first takes whatever prefix of its prompt the pool already holds).

A sequence whose next tokens need a block when none is free preempts the youngest running sequence:
the victim gives all its blocks back and waits at the head of the queue, to be recomputed from its
prompt and the tokens it already produced (vLLM's "recompute" preemption; nano-vllm's
`Scheduler.preempt`, GeeeekExplorer/nano-vllm @ bb823b3 `nanovllm/engine/scheduler.py` 75–79). Nothing
ever fails for lack of memory; it only waits. nano-vllm's `schedule` (25–73) runs a step of prefills or a
step of decodes, never both, and chunks only the first waiting prompt; here decode tokens and prefill
chunks share every step, as in Sarathi-Serve and vLLM's current scheduler.
"""

from __future__ import annotations

from collections import deque

from .block_manager import BlockManager
from .sequence import Sequence, Status


class Scheduler:
    def __init__(self, blocks: BlockManager, max_batch: int, max_tokens_per_step: int, prefix_sharing: bool):
        self.blocks, self.max_batch, self.budget = blocks, max_batch, max_tokens_per_step
        self.prefix_sharing = prefix_sharing
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self.saved = 0  # prompt tokens not computed because their blocks were already in the pool
        self.preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> list[tuple[Sequence, int]]:
        """The next step's work: (sequence, number of its uncomputed tokens to feed), with the blocks
        for those tokens already taken."""
        batch: dict[Sequence, int] = {}
        left, preempted = self.budget, self.preemptions
        decoding = [s for s in self.running if s.remaining == 1]
        prefilling = [s for s in self.running if s.remaining > 1]
        for seq in decoding + prefilling:
            if left == 0:
                break
            if seq.status is not Status.RUNNING:  # preempted by an older sequence of this step
                continue
            n = min(seq.remaining, left)
            if not self._grow(seq, seq.computed + n, batch):
                continue  # it was the youngest: preempted itself
            batch[seq] = n
            left = self.budget - sum(batch.values())  # recounted: _grow may have preempted an earlier entry
        # admit nobody in a step that had to preempt: memory is short, and the victim would come straight back
        while (
            self.waiting and left > 0 and len(self.running) < self.max_batch and self.preemptions == preempted
        ):
            seq = self.waiting[0]
            if not self._admit(seq):
                break  # first come, first served: nobody overtakes the head of the queue
            self.waiting.popleft()
            n = min(seq.remaining, left)
            self._grow(seq, seq.computed + n, batch)  # _admit checked the blocks are free
            batch[seq] = n
            left -= n
        return list(batch.items())

    def _admit(self, seq: Sequence) -> bool:
        """Take the cached prefix and check that the rest of the prompt and the first new token fit in
        the free blocks; on success the sequence runs."""
        if self.prefix_sharing and not seq.table:
            seq.table = self.blocks.match_prefix(seq.tokens)
            seq.computed, seq.sealed = len(seq.table) * self.blocks.block_size, len(seq.table)
        needed = self.blocks.blocks_for(len(seq) + 1) - len(seq.table)
        if needed > self.blocks.num_free:
            self.blocks.release(seq.table)  # give the prefix back; it stays cached for the next try
            seq.computed = seq.sealed = 0
            return False
        self.saved += seq.computed
        seq.status = Status.RUNNING
        self.running.append(seq)
        return True

    def _grow(self, seq: Sequence, positions: int, batch: dict[Sequence, int]) -> bool:
        """Give `seq` blocks for `positions` positions, preempting the youngest running sequences while
        none are free; False when `seq` itself was the youngest and was preempted."""
        needed = self.blocks.blocks_for(positions) - len(seq.table)
        while needed > self.blocks.num_free:
            victim = max(self.running, key=lambda s: s.arrival)
            self.preempt(victim)
            batch.pop(victim, None)
            if victim is seq:
                return False
        seq.table.extend(self.blocks.take() for _ in range(needed))
        return True

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.release(seq.table)
        seq.computed = seq.sealed = 0
        seq.status = Status.WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        """A finished or aborted sequence leaves at once and its blocks are free for the next step."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
        self.blocks.release(seq.table)
        seq.status = Status.FINISHED
