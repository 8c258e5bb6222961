"""Fixed-size KV blocks: a free list, ref counts and the prefix-cache hash map.

A block is in exactly one of three states:

    held       ref_count > 0        owned by one or more live requests
    free       ref_count == 0       never hashed (or its hash was dropped): reused first
    cached     ref_count == 0       still hashed: reusable by a prefix hit, evicted LRU

    allocate():  free  --pop left-->  held          (fresh blocks come from `free` first,
                 cached --evict LRU--> held          then the least recently freed cached one)
    touch():     cached --hit-->      held          (a prefix hit revives a free cached block)
    free():      held  --ref 0-->     free | cached (cached when it carries a hash)
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None   # set once the block is full and its tokens are computed


class BlockPool:
    """Owns every block of the KV cache; knows nothing about requests."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        self.num_blocks = num_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))
        # Insertion order is freeing order: the first key is the least recently freed.
        self._cached_free: OrderedDict[int, None] = OrderedDict()
        self._hash_to_block: dict[int, int] = {}

    # -- counts -----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks a fresh allocation may take: never-hashed ones plus evictable cached ones."""
        return len(self._free) + len(self._cached_free)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._cached_free)

    def ref_count(self, block_id: int) -> int:
        return self.blocks[block_id].ref_count

    # -- allocate / free --------------------------------------------------------------------
    def allocate(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` fresh blocks (ref count 1); evicts cached ones only if needed."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"need {num_blocks} blocks, only {self.num_free_blocks} free")
        ids = []
        for _ in range(num_blocks):
            if self._free:
                block_id = self._free.popleft()
            else:
                block_id, _ = self._cached_free.popitem(last=False)
                self._drop_hash(self.blocks[block_id])
            self.blocks[block_id].ref_count = 1
            ids.append(block_id)
        return ids

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference from each block, in order; the first freed is evicted first."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise ValueError(f"block {block_id} freed more often than taken")
            block.ref_count -= 1
            if block.ref_count > 0:
                continue
            if block.block_hash is None:
                self._free.append(block_id)
            else:
                self._cached_free[block_id] = None

    def touch(self, block_ids: list[int]) -> None:
        """Take one more reference on cached blocks (a prefix hit); revives free ones."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._cached_free[block_id]
            block.ref_count += 1

    # -- cache_block / get_cached_block -----------------------------------------------------
    def cache_block(self, block_id: int, block_hash: int) -> bool:
        """Publish a full, computed block under its chain hash; False if the hash is taken."""
        block = self.blocks[block_id]
        if block.block_hash is not None or block_hash in self._hash_to_block:
            return False    # an identical block is already cached: keep the first one
        block.block_hash = block_hash
        self._hash_to_block[block_hash] = block_id
        return True

    def get_cached_block(self, block_hash: int) -> int | None:
        return self._hash_to_block.get(block_hash)

    def is_cached(self, block_id: int) -> bool:
        return self.blocks[block_id].block_hash is not None

    def _drop_hash(self, block: Block) -> None:
        if block.block_hash is not None:
            del self._hash_to_block[block.block_hash]
            block.block_hash = None
