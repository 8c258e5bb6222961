"""How many prompt tokens a step may carry while other requests decode (lifecycle step 5).

Every running request waits for the whole step, so a step that also computes a long prompt's
chunk stretches the gap between tokens of every decoding stream. A fixed per-prompt chunk
(``long_prefill_token_threshold``) is right for one machine and load only; the pacer instead
watches the engine's own forward times and keeps a cap on a step's prompt tokens near the
largest that keeps such a step within ``ratio`` times a decode-only step:

    decode-only forward 35 ms, ratio 2: target 70 ms
    a step with 128 prompt tokens took 140 ms  ->  cap 128 * 70 / 140 = 64
    a step with 64 prompt tokens took 60 ms    ->  cap 64 * 1.25 + 1 = 81   (room: grow slowly)

A mixed step is not linear in its prompt tokens (it leaves the fused decode path, and the GEMM
kernel changes with the row count), hence a controller on measured steps, not a cost model.
The cap never goes below ``floor``: where even that is over the target (a 5 ms single-stream
step) prompts still fill at a steady pace instead of starving. With nobody decoding there is
nothing to protect and a prompt gets the whole token budget.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shared.core.request import Request
    from shared.core.scheduler_output import SchedulerOutput

_ALPHA = 0.2        # weight of the newest decode-only step in their running average
_GROW = 1.25        # the cap's growth after a step at the cap that stayed under the target
# Default floor: as a fixed threshold, 64 held the long workload's ITL p99 within 2x on a
# 2-core AMX Xeon (p99 ratio 1.85x, long-prompt TTFT 1.8x).
DEFAULT_FLOOR = 64


@dataclass
class PrefillPacer:
    """The decode-only step time and the prompt-token cap it implies."""

    ratio: float            # 0: off, the cap is always ``ceiling``
    floor: int              # fewest prompt tokens a step may carry beside decodes
    ceiling: int            # the step's token budget
    # Requests of at most this many tokens (prompt, or prompt and output on a recompute) fill
    # whole, outside the cap: a chat turn's prompt is what a server's streams bring in all
    # the time, and cutting it only costs throughput; the long ones are what stall streams.
    threshold: int = 0
    decode_step: float | None = None   # seconds, a decode-only forward (running average)
    limit: int | None = None           # the cap learnt so far (None: the ceiling)

    @property
    def enabled(self) -> bool:
        return self.ratio > 0

    def step_cap(self, running: Sequence[Request]) -> int:
        """The cap for the next step over ``running`` (decoders are counted only when on)."""
        if not self.enabled:
            return self.ceiling
        return self.cap(sum(1 for r in running if r.num_tokens - r.num_computed_tokens == 1))

    def paces(self, request: Request) -> bool:
        """Whether ``request``'s prompt (or recompute) chunks count against the cap."""
        return self.enabled and request.num_tokens > self.threshold

    def observe_step(self, out: SchedulerOutput, seconds: float) -> None:
        """Learn from the forward of one scheduled step."""
        if not self.enabled:
            return
        num_decoding = sum(1 for s in out.scheduled if s.num_new_tokens == 1)
        chunks = [s for s in out.scheduled if s.num_new_tokens > 1]
        if any(not self.paces(s.request) for s in chunks):
            return      # a whole short prompt ran too: the step's time is not the cap's doing
        self.observe(num_decoding, sum(s.num_new_tokens for s in chunks), seconds)

    def cap(self, num_decoding: int) -> int:
        """Prompt tokens the next step may compute beside ``num_decoding`` decode rows."""
        if not self.enabled or num_decoding == 0 or self.limit is None:
            return self.ceiling
        return self.limit

    def observe(self, num_decoding: int, num_prompt_tokens: int, seconds: float) -> None:
        """Learn from one finished forward of ``num_decoding`` decode rows and prompt tokens."""
        if not self.enabled or num_decoding == 0:
            return      # a step without decode rows says nothing about what they wait for
        if num_prompt_tokens == 0:
            old = self.decode_step
            self.decode_step = seconds if old is None else (1 - _ALPHA) * old + _ALPHA * seconds
            return
        if self.decode_step is None:
            return
        target = self.ratio * self.decode_step
        limit = self.ceiling if self.limit is None else self.limit
        if seconds > target:        # too long: scale the chunk down to the target
            limit = min(limit, int(num_prompt_tokens * target / seconds))
        elif num_prompt_tokens >= limit:    # the cap held this step back and there was room
            limit = int(limit * _GROW) + 1
        self.limit = max(self.floor, min(self.ceiling, limit))
