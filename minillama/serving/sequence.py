"""A request's state: its tokens, how many of them the cache holds, its blocks (chapter 12).

A sequence is its prompt followed by the tokens generated so far. `computed` counts the positions whose
keys and values sit in the cache; the positions `computed ..` are what the next step feeds the model.
A prompt being prefilled has many such positions, a decoding sequence one (its last token), and a
sequence preempted and put back to wait has all of them again: the engine treats the three alike, in
chunks of uncomputed tokens, and samples a new token whenever a chunk reaches the end of the sequence.
Compare GeeeekExplorer/nano-vllm @ bb823b3 `nanovllm/engine/sequence.py` (`num_cached_tokens`, `block_table`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How one request is continued: greedy when temperature is 0, else sampled (top_k, top_p) with a
    generator seeded by `seed`; at most `max_tokens` new tokens; a token in `stop_tokens` ends the request
    and is not returned."""

    max_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = 0
    stop_tokens: tuple[int, ...] | None = (
        None  # None: the engine's tokenizer's stop tokens (none without one)
    )

    def __post_init__(self):
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens!r} must be an integer >= 1")
        if not self.temperature >= 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 is greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1] (1 keeps every token)")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k={self.top_k!r} must be an integer >= 1 (or None for no top-k cut)")
        if self.stop_tokens is not None:
            object.__setattr__(self, "stop_tokens", tuple(int(t) for t in self.stop_tokens))


@dataclass(frozen=True)
class StepOutput:
    """One request's news from one engine step: a new token (None when the request ended without one:
    a stop token, which is not returned, or an abort), and whether it finished and why."""

    request_id: int
    token: int | None
    finished: bool
    finish_reason: str | None = None  # "stop", "length", "abort"


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: int
    prompt: list[int]
    params: SamplingParams
    arrival: int  # admission order: the youngest running sequence is preempted first
    output: list[int] = field(default_factory=list)
    table: list[int] = field(default_factory=list)  # block ids, position p in table[p // block_size]
    computed: int = 0  # positions whose keys and values are in the cache
    sealed: int = 0  # full blocks of the table registered for prefix sharing
    status: Status = Status.WAITING
    generator: torch.Generator | None = None
    preemptions: int = 0

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    def __len__(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def remaining(self) -> int:
        """Positions not yet in the cache: the prompt (or what is left of it) while prefilling, 1 while decoding."""
        return len(self) - self.computed
