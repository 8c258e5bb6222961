from __future__ import annotations

import random

import pytest

from shared.core.kv_cache import KVCacheManager
from shared.core.request import Request
from shared.errors import RequestTooLongError
from tests.shared.factories import make_request, make_scheduler

BS = 4


def compute(kv: KVCacheManager, req: Request, num_new: int, hits: list[int] | None = None,
            num_hit: int = 0) -> None:
    """What the scheduler does for one chunk: allocate, 'run' it, publish full blocks."""
    assert kv.allocate_slots(req, num_new, hits)
    req.num_computed_tokens += num_hit + num_new
    kv.cache_blocks(req)


def prefill(kv: KVCacheManager, req: Request) -> int:
    """Admit a request the way the scheduler does; returns the prefix-hit tokens."""
    hits, num_hit = kv.get_computed_blocks(req)
    compute(kv, req, req.num_tokens - num_hit, hits, num_hit)
    return num_hit


def check_ref_counts(kv: KVCacheManager, live: list[Request]) -> None:
    holders = [0] * kv.num_blocks
    for req in live:
        for b in kv.get_block_ids(req.request_id):
            holders[b] += 1
    assert [kv.pool.ref_count(b) for b in range(kv.num_blocks)] == holders
    assert kv.num_free_blocks == holders.count(0)


def test_random_allocate_free_never_leaks() -> None:
    rng = random.Random(0)
    kv = KVCacheManager(num_blocks=40, block_size=BS)
    system = [rng.randrange(1, 50) for _ in range(9)]   # shared prefix: hits and shared blocks
    live: list[Request] = []
    for i in range(400):
        if live and rng.random() < 0.4:
            req = live.pop(rng.randrange(len(live)))
            kv.free(req)
        else:
            tail = [rng.randrange(1, 50) for _ in range(rng.randrange(1, 12))]
            req = make_request(f"r{i}", system + tail if rng.random() < 0.5 else tail)
            hits, num_hit = kv.get_computed_blocks(req)
            if kv.allocate_slots(req, req.num_tokens - num_hit, hits):
                req.num_computed_tokens = req.num_tokens
                kv.cache_blocks(req)
                live.append(req)
                for _ in range(rng.randrange(0, 6)):   # decode a few tokens when blocks allow
                    req.append_output_token(rng.randrange(1, 50))
                    if not kv.allocate_slots(req, 1):
                        break
                    req.num_computed_tokens += 1
                    kv.cache_blocks(req)
        check_ref_counts(kv, live)
    for req in live:
        kv.free(req)
    assert kv.num_free_blocks == kv.num_blocks
    assert kv.usage == 0.0
    assert kv.prefix_cache_hits > 0   # the shared prefix really was reused on the way


def test_prefix_hit_shares_system_prompt_blocks() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    system = list(range(100, 108))             # two full blocks
    a = make_request("a", system + [1, 2, 3])
    b = make_request("b", system + [7, 8])
    assert prefill(kv, a) == 0
    assert prefill(kv, b) == 8                 # only the 2-token tail is computed
    ta, tb = kv.get_block_ids("a"), kv.get_block_ids("b")
    assert tb[:2] == ta[:2] and tb[2] != ta[2]
    assert [kv.pool.ref_count(x) for x in tb] == [2, 2, 1]
    assert kv.num_free_blocks == 16 - 4
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (11 + 10, 8)
    kv.free(a)
    assert [kv.pool.ref_count(x) for x in tb] == [1, 1, 1]


def test_prefix_hit_never_covers_the_whole_prompt() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    prompt = list(range(8))
    prefill(kv, make_request("a", prompt))
    blocks, num_hit = kv.get_computed_blocks(make_request("b", prompt))
    assert num_hit == 4 and len(blocks) == 1   # block 2 would leave nothing to compute


def test_only_computed_blocks_are_hashed() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    a = make_request("a", list(range(12)))
    compute(kv, a, 6)                          # a chunk: block 0 full, block 1 half done
    assert kv.get_computed_blocks(make_request("b", list(range(12))))[1] == 4
    compute(kv, a, 6)
    assert kv.get_computed_blocks(make_request("c", list(range(12))))[1] == 8


def test_chain_hash_needs_the_same_prefix() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    prefill(kv, make_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    # Block 1 matches a's block 1 token for token, but its parent block differs.
    assert kv.get_computed_blocks(make_request("b", [0, 2, 3, 4, 5, 6, 7, 8, 9])) == ([], 0)
    # Same tokens as a's block 1, but at position 0: its K/V would be wrong there.
    assert kv.get_computed_blocks(make_request("c", [5, 6, 7, 8, 9])) == ([], 0)


def test_colliding_python_hashes_never_share_a_block(monkeypatch: pytest.MonkeyPatch) -> None:
    # Force every Python hash() in the cache module to collide (what a crafted prompt could do to
    # hash() of a tuple): different blocks must still never resolve to each other's KV.
    import shared.core.kv_cache as kv_cache

    monkeypatch.setattr(kv_cache, "hash", lambda _: 0, raising=False)
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    prefill(kv, make_request("victim", [11, 12, 13, 14, 15, 16, 17, 18, 19]))
    assert kv.get_computed_blocks(make_request("attacker", [91, 92, 93, 94, 95, 96, 97, 98, 99])) == ([], 0)
    assert kv.get_computed_blocks(make_request("same", [11, 12, 13, 14, 15]))[1] == 4   # real hits stay
    # Distinct chains, distinct 128-bit keys; equal inputs, equal keys.
    assert kv_cache.chain_hash(1, [1, 2]) != kv_cache.chain_hash(1, [2, 1]) != kv_cache.chain_hash(2, [1, 2])
    assert kv_cache.chain_hash(7, [3, 4]) == kv_cache.chain_hash(7, [3, 4])


def test_eviction_is_least_recently_freed_first_and_hits_revive() -> None:
    kv = KVCacheManager(num_blocks=6, block_size=BS)
    reqs = {n: make_request(n, [base + i for i in range(5)]) for n, base in
            [("a", 10), ("b", 20), ("c", 30)]}
    for req in reqs.values():
        prefill(kv, req)                       # block 0 full and cached, block 1 partial
    for n in "abc":
        kv.free(reqs[n])
    assert kv.num_free_blocks == 6 and kv.pool.num_cached_free_blocks == 3

    def hit(name: str) -> int:
        return kv.get_computed_blocks(make_request(name + "?", reqs[name].prompt_token_ids))[1]

    prefill(kv, make_request("d", list(range(500, 513))))   # 4 blocks: 3 uncached + 1 eviction
    assert (hit("a"), hit("b"), hit("c")) == (0, 4, 4)      # a was freed first
    e = make_request("e", reqs["b"].prompt_token_ids)
    assert prefill(kv, e) == 4                  # revives b's block, takes c's for its tail
    assert kv.pool.ref_count(kv.get_block_ids("e")[0]) == 1
    assert hit("b") == 4 and hit("c") == 0
    assert kv.num_free_blocks == 0


def test_uncached_free_blocks_are_used_before_evicting() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    a = make_request("a", list(range(9)))      # 2 cached blocks + 1 partial
    prefill(kv, a)
    x = make_request("x", list(range(100, 120)))
    assert kv.allocate_slots(x, 20)            # 5 blocks, never computed: never hashed
    kv.free(a)                                 # a's cached blocks are freed before x's
    kv.free(x)
    prefill(kv, make_request("b", list(range(200, 224))))   # 6 blocks: exactly the uncached ones
    assert kv.get_computed_blocks(make_request("c", list(range(9))))[1] == 8


def test_a_freed_prefix_loses_its_tail_blocks_first() -> None:
    kv = KVCacheManager(num_blocks=3, block_size=BS)
    a = make_request("a", list(range(9)))      # blocks: [0..3] [4..7] cached, [8] partial
    prefill(kv, a)
    kv.free(a)
    prefill(kv, make_request("b", list(range(100, 106))))   # 2 blocks: the partial + 1 eviction
    assert kv.get_computed_blocks(make_request("c", list(range(9))))[1] == 4


def test_failed_allocation_has_no_side_effects() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=BS)
    a = make_request("a", list(range(9)))
    prefill(kv, a)
    kv.free(a)                                 # 2 cached free blocks, 2 plain free
    b = make_request("b", list(range(30)))     # hit 8 tokens, but 8 blocks needed
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 8
    assert not kv.allocate_slots(b, b.num_tokens - num_hit, hits)
    assert kv.get_block_ids("b") == [] and kv.num_free_blocks == 4
    assert all(kv.pool.ref_count(x) == 0 for x in hits)
    assert kv.prefix_cache_queries == 9        # only a's admission counted


def test_prefix_caching_disabled_gives_no_hits() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_prefix_caching=False)
    prompt = list(range(13))
    prefill(kv, make_request("a", prompt))
    assert prefill(kv, make_request("b", prompt)) == 0
    assert kv.pool.num_cached_free_blocks == 0 and not any(kv.pool.is_cached(x) for x in range(16))
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (0, 0)


def test_usage_counts_only_blocks_held_by_live_requests() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=BS)
    a = make_request("a", list(range(9)))
    prefill(kv, a)
    assert kv.usage == pytest.approx(0.3)
    kv.free(a)
    assert kv.usage == 0.0 and kv.pool.num_cached_free_blocks == 2


def test_scheduler_refuses_requests_longer_than_the_cache() -> None:
    sched = make_scheduler(num_blocks=4, block_size=4, max_model_len=100)   # 16 token slots
    with pytest.raises(RequestTooLongError, match=r"16 tokens.*5 KV-cache blocks.*holds 4 blocks"):
        sched.add_request(make_request("big", 16))
    sched.add_request(make_request("ok", 15))
    with pytest.raises(RequestTooLongError, match=r"100 tokens.*context length is 100"):
        make_scheduler(max_model_len=100).add_request(make_request("ctx", 100))
    assert sched.num_waiting == 1
