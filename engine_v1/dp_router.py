"""Which engine core takes a request when ``--data-parallel-size`` > 1: a pure policy.

Load of a core = requests the API side has sent it and not seen finish (``in_flight``), plus
the ones its latest stats say are waiting. ``in_flight`` already counts every request the
core's stats count (and those still on the wire, which the stats cannot see yet), so adding
``running`` too would count each request twice; ``waiting`` is added once more because a
queued request gets no service at all. KV-cache usage breaks ties, then a rotating turn.

Prefix affinity: the prompt's first full blocks are hashed as a chain (block k's key covers
blocks 0..k), and each key remembers the core that last served it. A request whose deepest
remembered key covers at least ``min_affinity_tokens`` goes to that core, where those blocks
are likely still cached, unless the core's load exceeds the least-loaded one's by more than
``margin``. Shorter matches are ignored: every chat shares its template's system prompt, and
following it would pile all chats on one core to save a block of prefill.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class EngineLoad:
    """What the router knows about one core."""

    in_flight: int = 0          # sent by the API side, not yet seen finished
    running: int = 0            # from the core's latest stats
    waiting: int = 0
    kv_usage: float = 0.0

    @property
    def score(self) -> int:
        return self.in_flight + self.waiting


class DPRouter:
    def __init__(self, num_engines: int, block_size: int, affinity: bool = True,
                 min_affinity_tokens: int = 64, max_affinity_blocks: int = 16, margin: int = 2,
                 table_size: int = 8192) -> None:
        if num_engines < 1:
            raise ValueError("num_engines must be >= 1")
        self.loads = [EngineLoad() for _ in range(num_engines)]
        self.block_size = block_size
        self.affinity = affinity
        self.min_affinity_blocks = max(1, -(-min_affinity_tokens // block_size))
        self.max_affinity_blocks = max(max_affinity_blocks, self.min_affinity_blocks)
        self.margin = margin
        self.table_size = table_size
        self._prefix_owner: OrderedDict[int, int] = OrderedDict()   # chained key -> core, LRU
        self._owner: dict[str, int] = {}                            # request id -> core
        self._turn = 0
        self.affinity_routed = 0    # requests sent where their prefix was (for /debug/stats)

    # -- what the cores report -------------------------------------------------------------
    def update_stats(self, engine: int, running: int, waiting: int, kv_usage: float) -> None:
        load = self.loads[engine]
        load.running, load.waiting, load.kv_usage = running, waiting, kv_usage

    # -- a request's life --------------------------------------------------------------------
    def route(self, request_id: str, prompt_token_ids: list[int],
              prefill_leader: str | None = None) -> int:
        """Pick the core for a new request and count it as in flight there. An n > 1 sibling
        goes where its prefill leader is, since only that core can fork the leader's KV."""
        leader_engine = self._owner.get(prefill_leader) if prefill_leader is not None else None
        if leader_engine is not None:
            self._owner[request_id] = leader_engine
            self.loads[leader_engine].in_flight += 1
            return leader_engine
        keys = self._prefix_keys(prompt_token_ids) if self.affinity else []
        least = self._least_loaded()
        engine = least
        preferred = self._preferred(keys)
        if preferred is not None and preferred != least and \
                self.loads[preferred].score - self.loads[least].score <= self.margin:
            engine = preferred
        if preferred == engine:
            self.affinity_routed += 1
        for key in keys:
            self._remember(key, engine)
        self._owner[request_id] = engine
        self.loads[engine].in_flight += 1
        return engine

    def owner(self, request_id: str) -> int | None:
        return self._owner.get(request_id)

    def finished(self, request_id: str) -> int | None:
        """The request ended (finished, aborted, refused); returns the core it was on."""
        engine = self._owner.pop(request_id, None)
        if engine is not None:
            self.loads[engine].in_flight -= 1
        return engine

    @property
    def num_tracked(self) -> int:
        return len(self._owner)

    # -- helpers -----------------------------------------------------------------------------
    def _least_loaded(self) -> int:
        n = len(self.loads)
        best = min(range(n), key=lambda i: (self.loads[i].score, self.loads[i].kv_usage,
                                            (i - self._turn) % n))
        self._turn = (best + 1) % n     # equal cores take turns instead of core 0 taking all
        return best

    def _prefix_keys(self, tokens: list[int]) -> list[int]:
        """Chained keys of the first full blocks, shallowest first; [] below the minimum."""
        bs = self.block_size
        depth = min(len(tokens) // bs, self.max_affinity_blocks)
        if depth < self.min_affinity_blocks:
            return []
        keys, key = [], 0
        for k in range(depth):
            key = hash((key, tuple(tokens[k * bs:(k + 1) * bs])))
            keys.append(key)
        return keys[self.min_affinity_blocks - 1:]

    def _preferred(self, keys: list[int]) -> int | None:
        for key in reversed(keys):      # the deepest shared prefix saves the most prefill
            engine = self._prefix_owner.get(key)
            if engine is not None:
                return engine
        return None

    def _remember(self, key: int, engine: int) -> None:
        self._prefix_owner[key] = engine
        self._prefix_owner.move_to_end(key)
        if len(self._prefix_owner) > self.table_size:
            self._prefix_owner.popitem(last=False)
