"""The engine: requests in, tokens out, one scheduler step at a time (chapter 12).

    engine = Engine(model, block_size=16, max_batch=32, max_tokens_per_step=256)
    rid = engine.add_request(prompt_ids, SamplingParams(max_tokens=32))
    while engine.has_unfinished():
        for out in engine.step():  # StepOutput(request_id, token, finished, finish_reason)
            ...

A step asks the scheduler what to run, runs it on the paged cache, and for every sequence whose
chunk reached its end samples the next token with that request's own parameters (and its own seeded
generator). A request ends at a stop token (not returned: the output says token=None,
finish_reason="stop") or after `max_tokens` tokens ("length"), and its blocks are free for the next
step. Under greedy decoding every request gets exactly the tokens `ml.generate` gives it alone,
whatever else shares its steps; the tests check it under staggered arrivals, chunking, preemption
and shared prefixes. The rooms follow GeeeekExplorer/nano-vllm @ bb823b3 `nanovllm/engine/` (`sequence`,
`block_manager`, `scheduler`, `model_runner`, and `llm_engine.py` 43–55 for `add_request` / `step`);
nano-vllm adds CUDA graphs per batch size, flash-attn kernels that read the blocks in place, tensor
parallelism, and does not mix prefill and decode in one step.

Not thread-safe: one thread owns the engine (a server runs `step()` in a loop on its own thread).
"""

from __future__ import annotations

import itertools
import time

import torch

from ..model import Transformer
from ..sampling import argmax, sample
from .block_manager import BlockManager
from .runner import ModelRunner
from .scheduler import Scheduler
from .sequence import SamplingParams, Sequence, StepOutput

KV_BUDGET_BYTES = 256 * 2**20  # the default pool: 256 MiB of keys and values (see Engine)


class Engine:
    """Continuous batching over a paged KV cache for one model.

    `block_size` positions per block; `num_blocks` blocks in the pool (None: as many as fit in 256 MiB,
    never fewer than one sequence of `max_seq_len` needs, never more than `max_batch` such sequences);
    at most `max_batch` sequences run at once and a step feeds at most `max_tokens_per_step` tokens
    (prefill chunks and decode tokens together); `prefix_sharing` reuses cached full blocks of equal
    prompt prefixes. `tokenizer` (optional) lets `add_request` take text and supplies the default stop
    tokens. `engine.trace`, when set to a list, receives one record per step: `rows` (request id, first
    position fed, tokens fed) for each sequence that ran, `blocks_used`, and the step's wall and CPU seconds."""

    def __init__(
        self,
        model: Transformer,
        tokenizer=None,
        *,
        block_size: int = 16,
        num_blocks: int | None = None,
        max_batch: int = 32,
        max_tokens_per_step: int = 256,
        prefix_sharing: bool = True,
    ):
        for name, value in (("block_size", block_size), ("max_batch", max_batch),
                            ("max_tokens_per_step", max_tokens_per_step)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer >= 1")
        self.model, self.tokenizer = model, tokenizer
        self.block_size, self.max_seq_len = block_size, model.args.max_seq_len
        per_sequence = -(-self.max_seq_len // block_size)
        if num_blocks is None:
            probe = ModelRunner(model, 1, block_size)
            num_blocks = min(
                max_batch * per_sequence, max(per_sequence, KV_BUDGET_BYTES // probe.bytes_per_block)
            )
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(
                f"num_blocks={num_blocks!r} must be an integer >= 1 (or None for a 256 MiB pool)"
            )
        self.num_blocks = num_blocks
        self.blocks = BlockManager(num_blocks, block_size)
        self.runner = ModelRunner(model, num_blocks, block_size)
        self.scheduler = Scheduler(self.blocks, max_batch, max_tokens_per_step, prefix_sharing)
        self.max_batch, self.max_tokens_per_step = max_batch, max_tokens_per_step
        self.prefix_sharing = prefix_sharing
        self.requests: dict[int, Sequence] = {}
        self._ids = itertools.count()
        self._arrivals = itertools.count()
        self._aborted: list[StepOutput] = []
        self.steps = 0
        self.computed_tokens = 0  # tokens fed to the model (prefill chunks and decode tokens)
        self.trace: list | None = None

    # ------------------------------------------------------------------------------------------------
    # requests

    def add_request(self, prompt, params: SamplingParams | None = None) -> int:
        """Queue a prompt (token ids, or text when the engine has a tokenizer); returns its request id."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams; got {type(params).__name__}")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("the prompt is text; pass tokenizer= to Engine (or pass token ids)")
            prompt = self.tokenizer.encode(prompt, bos=True)
        prompt = prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
        if not prompt:
            raise ValueError(
                "the prompt is empty; a prompt needs at least one token (e.g. <|begin_of_text|>)"
            )
        vocab = self.model.args.vocab_size
        if not all(isinstance(t, int) and 0 <= t < vocab for t in prompt):
            raise ValueError(f"the prompt has token ids outside 0..{vocab - 1} (the model's vocab_size)")
        needed = len(prompt) + params.max_tokens
        if needed > self.max_seq_len:
            raise ValueError(
                f"a prompt of {len(prompt)} tokens + max_tokens={params.max_tokens} needs {needed} positions, "
                f"more than the engine's max_seq_len={self.max_seq_len}; shorten the prompt or lower max_tokens "
                f"to {max(self.max_seq_len - len(prompt), 0)}"
            )
        if self.blocks.blocks_for(needed) > self.num_blocks:
            raise ValueError(
                f"a prompt of {len(prompt)} tokens + max_tokens={params.max_tokens} needs "
                f"{self.blocks.blocks_for(needed)} blocks of {self.block_size} positions, more than the pool's "
                f"num_blocks={self.num_blocks}; lower max_tokens or build the Engine with more num_blocks"
            )
        if params.stop_tokens is None and self.tokenizer is not None:
            params = SamplingParams(**{**params.__dict__, "stop_tokens": tuple(self.tokenizer.stop_tokens)})
        rid = next(self._ids)
        seq = Sequence(rid, [int(t) for t in prompt], params, next(self._arrivals))
        if params.temperature > 0 and params.seed is not None:
            seq.generator = torch.Generator(device=self.runner.device).manual_seed(params.seed)
        self.requests[rid] = seq
        self.scheduler.add(seq)
        return rid

    def abort(self, request_id: int) -> None:
        """Stop a request now and free its blocks; the next `step()` reports it as finished ("abort").
        A no-op for an unknown or finished request."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return
        self.scheduler.finish(seq)
        self._aborted.append(StepOutput(request_id, None, True, "abort"))

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running or self._aborted)

    @property
    def free_blocks(self) -> int:
        return self.blocks.num_free

    def stats(self) -> dict:
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "blocks_used": self.num_blocks - self.blocks.num_free,
            "blocks_free": self.blocks.num_free,
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "kv_bytes_allocated": self.num_blocks * self.runner.bytes_per_block,
            "prefill_tokens_saved": self.scheduler.saved,
            "computed_tokens": self.computed_tokens,
            "preemptions": self.scheduler.preemptions,
            "steps": self.steps,
        }

    # ------------------------------------------------------------------------------------------------
    # the loop

    def step(self) -> list[StepOutput]:
        """One scheduler iteration: run the scheduled chunks, sample where a chunk ended a sequence,
        finish what is done. Returns the news of this step (one entry per new token or finish)."""
        outputs, self._aborted = self._aborted, []
        batch = self.scheduler.schedule()
        if not batch:
            return outputs
        begin, begin_cpu = time.perf_counter(), time.process_time()
        # (request, first position fed, tokens fed) for the trace, before the positions advance
        rows = [(seq.request_id, seq.computed, n) for seq, n in batch]
        logits = self.runner.run(batch)
        self.steps += 1
        self.computed_tokens += sum(n for _, n in batch)
        ready = []
        for i, (seq, n) in enumerate(batch):
            seq.computed += n
            if self.prefix_sharing:
                seq.sealed = self.blocks.seal(seq.table, seq.tokens, seq.computed, seq.sealed)
            if seq.computed == len(seq):
                ready.append((seq, i))
        for seq, token in zip((s for s, _ in ready), self._sample(ready, logits), strict=True):
            outputs.append(self._append(seq, token))
        if self.trace is not None:
            self.trace.append({"step": self.steps, "rows": rows, "blocks_used": self.num_blocks - self.blocks.num_free,
                               "seconds": time.perf_counter() - begin,  # wall time
                               "cpu_seconds": time.process_time() - begin_cpu})  # fmt: skip
        return outputs

    def _sample(self, ready: list[tuple[Sequence, int]], logits: torch.Tensor) -> list[int]:
        """The next token of each ready sequence from its row of `logits` `[len(batch), v]`."""
        if not ready:
            return []
        greedy = [i for i, (seq, _) in enumerate(ready) if seq.params.temperature == 0]
        tokens = [0] * len(ready)
        if greedy:  # one argmax over every greedy row (no copy when that is every row of the step)
            rows = [ready[i][1] for i in greedy]
            picked = logits if rows == list(range(len(logits))) else logits[rows]
            for i, t in zip(greedy, argmax(picked).tolist(), strict=True):
                tokens[i] = t
        for i, (seq, row) in enumerate(ready):
            p = seq.params
            if (
                p.temperature > 0
            ):  # each request draws from its own generator: its tokens do not depend on the batch
                tokens[i] = int(sample(logits[row][None], p.temperature, p.top_k, p.top_p, seq.generator)[0])
        return tokens

    def _append(self, seq: Sequence, token: int) -> StepOutput:
        if token in (seq.params.stop_tokens or ()):
            self._finish(seq)
            return StepOutput(seq.request_id, None, True, "stop")
        seq.output.append(token)
        if len(seq.output) >= seq.params.max_tokens:
            self._finish(seq)
            return StepOutput(seq.request_id, token, True, "length")
        return StepOutput(seq.request_id, token, False, None)

    def _finish(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)
        self.requests.pop(seq.request_id, None)

    def generate(self, prompts, params: SamplingParams | None = None) -> list[list[int]]:
        """Run the prompts to completion (with whatever is already queued); each prompt's new tokens."""
        ids = [self.add_request(p, params) for p in prompts]
        out: dict[int, list[int]] = {rid: [] for rid in ids}
        while self.has_unfinished():
            for o in self.step():
                if o.request_id in out and o.token is not None:
                    out[o.request_id].append(o.token)
        return [out[rid] for rid in ids]
