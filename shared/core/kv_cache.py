"""Paged KV cache bookkeeping: each request's block table and hash-chained prefix caching.

Token ``t`` of a request lives in slot ``t % block_size`` of block ``table[t // block_size]``:

    tokens   0 1 2 3 | 4 5 6 7 | 8 9        block_size = 4, 10 tokens
    table    [  7    ,    2    ,  5  ]      3 blocks; block 5 has 2 free slots

A full block's hash chains its parent's hash with its own tokens, so equal hashes mean equal
prefixes, not just equal blocks:

    h0 = H(ROOT, (t0..t3))   h1 = H(h0, (t4..t7))   block 5 is not full: no hash

H is SHA-256 (truncated to 128 bits) of the parent and the token ids: a prefix hit reuses
another request's KV, so a hash one could collide on purpose (Python's ``hash`` of a tuple) would
let crafted prompts read other users' blocks (the class of vLLM's CVE-2025-25183).
"""
from __future__ import annotations

import hashlib
from array import array

from shared.core.block_pool import BlockPool
from shared.core.request import Request

_ROOT_HASH = int.from_bytes(hashlib.sha256(b"twinserve prefix cache v1").digest()[:16], "little")


def chain_hash(parent: int, tokens: list[int]) -> int:
    """128 bits of SHA-256 over the parent's hash and the block's token ids."""
    digest = hashlib.sha256(parent.to_bytes(16, "little") + array("q", tokens).tobytes()).digest()
    return int.from_bytes(digest[:16], "little")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Maps requests to blocks of a BlockPool and reuses computed prefixes across requests."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self._tables: dict[str, list[int]] = {}
        self._hashes: dict[str, list[int]] = {}        # chain hashes of full blocks, grown lazily
        self._num_hashed: dict[str, int] = {}          # table entries already published
        self.prefix_cache_queries = 0                  # tokens looked up on admission
        self.prefix_cache_hits = 0                     # tokens found cached

    # -- counts -----------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks available to new allocations (cached-but-free blocks count as free)."""
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Share of blocks held by live requests, in [0, 1]."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table (a copy); empty when it holds none."""
        return list(self._tables.get(request_id, ()))

    # -- get_computed_blocks / allocate_slots / free ----------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Cached blocks matching the request's leading full blocks, and the tokens they hold.

        Takes no references; pass the blocks to ``allocate_slots``. At least one token is left
        to compute so that the step that finishes the prompt samples a token. A request that
        asks for prompt logprobs gets no hits: cached positions would have no logits.
        """
        if not self.enable_prefix_caching or request.request_id in self._tables:
            return [], 0
        if request.sampling_params.prompt_logprobs is not None:
            return [], 0        # every prompt position must be computed to be scored
        num_full = (request.num_tokens - 1) // self.block_size
        hits: list[int] = []
        for block_hash in self._block_hashes(request, num_full):
            block_id = self.pool.get_cached_block(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits, len(hits) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed_blocks: list[int] | None = None) -> bool:
        """Grow the request's table to cover its computed tokens, the prefix-hit blocks and
        ``num_new_tokens`` more. Returns False, changing nothing, if the blocks are not free.

        ``computed_blocks`` (from ``get_computed_blocks``) is only given on admission, when the
        request holds no blocks and ``request.num_computed_tokens`` is 0.
        """
        rid = request.request_id
        hits = computed_blocks or []
        table = self._tables.get(rid, [])
        if hits and table:
            raise ValueError(f"request {rid} already holds blocks; prefix hits apply on admission")
        num_tokens = request.num_computed_tokens + len(hits) * self.block_size + num_new_tokens
        num_new_blocks = self.num_blocks_for(num_tokens) - len(table) - len(hits)
        # Hit blocks sitting in the free list stop being allocatable once we touch them.
        num_revived = sum(1 for b in hits if self.pool.ref_count(b) == 0)
        if num_new_blocks > self.num_free_blocks - num_revived:
            return False
        if rid not in self._tables:
            self._start_table(request, hits)
            table = self._tables[rid]
        if num_new_blocks > 0:
            table.extend(self.pool.allocate(num_new_blocks))
        return True

    def fork(self, child: Request, parent: Request, num_tokens: int) -> list[tuple[int, int]] | None:
        """Give ``child`` the KV of ``parent``'s first ``num_tokens`` tokens (equal prompts).

        The full blocks are shared (one more reference each); the block holding token
        ``num_tokens`` is fresh, and when it holds some of those tokens the returned
        (parent block, child block) pair must be copied before the next forward:

            parent  [ A | B | C. ]      num_tokens = 10, block_size = 4: A, B shared,
            child   [ A | B | C' ]      C' = copy of C (tokens 8, 9), token 10 computed next

        None, changing nothing, if no block is free or the parent lacks the tokens.
        """
        table = self._tables.get(parent.request_id, [])
        num_shared = num_tokens // self.block_size
        if child.request_id in self._tables or len(table) <= num_shared or self.num_free_blocks < 1:
            return None
        shared = table[:num_shared]
        self.pool.touch(shared)
        self._tables[child.request_id] = [*shared, *self.pool.allocate(1)]
        self._num_hashed[child.request_id] = num_shared
        if num_tokens % self.block_size == 0:
            return []
        return [(table[num_shared], self._tables[child.request_id][-1])]

    def free(self, request: Request) -> None:
        """Return the request's blocks; cached ones stay hashed until evicted. Idempotent."""
        rid = request.request_id
        table = self._tables.pop(rid, [])
        self._hashes.pop(rid, None)
        self._num_hashed.pop(rid, None)
        # Tail first: a prefix's later blocks are useless without its first ones, so the
        # first blocks should be the last to be evicted.
        self.pool.free(table[::-1])

    # -- cache_blocks -----------------------------------------------------------------------
    def cache_blocks(self, request: Request) -> None:
        """Publish the request's blocks that are full of computed tokens to the prefix cache."""
        rid = request.request_id
        if not self.enable_prefix_caching or rid not in self._tables:
            return
        num_full = min(request.num_computed_tokens // self.block_size, len(self._tables[rid]))
        start = self._num_hashed[rid]
        if num_full <= start:
            return
        hashes = self._block_hashes(request, num_full)
        table = self._tables[rid]
        for i in range(start, num_full):
            self.pool.cache_block(table[i], hashes[i])
        self._num_hashed[rid] = num_full

    # -- helpers ----------------------------------------------------------------------------
    def _start_table(self, request: Request, hits: list[int]) -> None:
        self.pool.touch(hits)
        self._tables[request.request_id] = list(hits)
        self._num_hashed[request.request_id] = len(hits)
        if self.enable_prefix_caching:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += len(hits) * self.block_size

    def _block_hashes(self, request: Request, num_full: int) -> list[int]:
        """Chain hashes of the request's first ``num_full`` blocks (computed once each)."""
        hashes = self._hashes.setdefault(request.request_id, [])
        bs, tokens = self.block_size, request.all_token_ids
        while len(hashes) < num_full:
            i = len(hashes)
            parent = hashes[-1] if hashes else _ROOT_HASH
            hashes.append(chain_hash(parent, tokens[i * bs:(i + 1) * bs]))
        return hashes[:num_full]
