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
