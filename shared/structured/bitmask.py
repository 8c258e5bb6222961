"""The grammar constraint in the sampler: every constrained row's token bitmask, applied at once."""
from __future__ import annotations

import llguidance
import numpy as np
import torch


class GrammarMasker:
    """Fills the bitmasks of a batch's constrained rows in one llguidance call (it drops the
    GIL and spreads rows over its threads), then masks their logits in one indexed write."""

    def __init__(self) -> None:
        self._executor: llguidance.LLExecutor | None = None

    def apply(self, logits: torch.Tensor, rows: list[int],
              matchers: list[llguidance.LLMatcher]) -> torch.Tensor:
        """``logits`` with every token that ``matchers[j]`` forbids at -inf in row ``rows[j]``."""
        if not rows:
            return logits
        allowed = self.allowed(matchers, logits.shape[-1]).to(logits.device)
        logits = logits.clone()
        index = torch.tensor(rows, device=logits.device)
        logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
        return logits

    def apply_safely(self, logits: torch.Tensor, rows: list[int], matchers: list[llguidance.LLMatcher]
                     ) -> tuple[torch.Tensor, dict[int, str]]:
        """``apply``, or when the batched call fails, row by row: a row whose own mask fails is
        reported (its request fails alone) and the others are still masked."""
        try:
            return self.apply(logits, rows, matchers), {}
        except Exception:  # noqa: BLE001 - find the row at fault
            failed: dict[int, str] = {}
            for row, matcher in zip(rows, matchers):
                try:
                    logits = self.apply(logits, [row], [matcher])
                except Exception as exc:  # noqa: BLE001 - attributed to this row's request
                    failed[row] = f"grammar mask failed: {type(exc).__name__}: {exc}"
            return logits, failed

    def allowed(self, matchers: list[llguidance.LLMatcher], vocab_size: int) -> torch.Tensor:
        """[len(matchers), vocab_size] bool: the tokens each matcher allows next."""
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        words = (vocab_size + 31) // 32
        bits = np.empty((len(matchers), words), dtype=np.int32)
        self._executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)],
                                               bits.ctypes.data, words * 4, len(matchers))
        unpacked = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :vocab_size]
        return torch.from_numpy(unpacked.view(np.bool_))
