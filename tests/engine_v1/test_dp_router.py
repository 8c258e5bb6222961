"""The data-parallel routing policy with fake stats: no processes, no model."""
from __future__ import annotations

import pytest

from engine_v1.dp_router import DPRouter

BS = 16


def _prompt(doc: int, question: int, doc_blocks: int = 8) -> list[int]:
    """A shared 'document' of doc_blocks full blocks, then a per-question tail."""
    return [1000 * doc + i for i in range(doc_blocks * BS)] + [50_000 + question] * 5


def test_new_requests_go_to_the_least_loaded_core() -> None:
    r = DPRouter(3, BS, affinity=False)
    r.update_stats(0, running=4, waiting=3, kv_usage=0.5)
    r.loads[0].in_flight = 7
    r.update_stats(1, running=1, waiting=0, kv_usage=0.1)
    r.loads[1].in_flight = 1
    r.update_stats(2, running=0, waiting=0, kv_usage=0.3)   # long-lived cached blocks, idle
    assert r.route("a", [1, 2, 3]) == 2            # idle
    assert r.route("b", [1, 2, 3]) == 1            # 1 in flight each: kv usage breaks the tie
    assert [load.in_flight for load in r.loads] == [7, 2, 1]


def test_waiting_requests_weigh_on_top_of_in_flight() -> None:
    r = DPRouter(2, BS, affinity=False)
    r.loads[0].in_flight, r.loads[1].in_flight = 4, 5
    r.update_stats(0, running=0, waiting=4, kv_usage=0.0)   # all queued: worse than 5 running
    r.update_stats(1, running=5, waiting=0, kv_usage=0.0)
    assert r.route("x", []) == 1


def test_equal_cores_take_turns_and_finish_releases_load() -> None:
    r = DPRouter(2, BS, affinity=False)
    picks = [r.route(f"r{i}", [7]) for i in range(4)]
    assert sorted(picks) == [0, 0, 1, 1]
    assert r.finished("r0") == picks[0] and r.finished("r0") is None   # once only
    assert r.owner("r1") == picks[1] and r.num_tracked == 3
    for rid in ("r1", "r2", "r3"):
        r.finished(rid)
    assert [load.in_flight for load in r.loads] == [0, 0] and r.num_tracked == 0


def test_shared_prefix_follows_the_core_that_served_it() -> None:
    r = DPRouter(2, BS, margin=2)
    first = {d: r.route(f"d{d}-q0", _prompt(d, 0)) for d in range(4)}
    assert set(first.values()) == {0, 1}           # documents spread while loads are equal
    for q in range(1, 4):
        for d in range(4):
            rid = f"d{d}-q{q}"
            assert r.route(rid, _prompt(d, q)) == first[d]
            r.finished(rid)                          # keep loads level so affinity always wins


def test_affinity_yields_when_the_preferred_core_is_too_busy() -> None:
    r = DPRouter(2, BS, margin=2)
    home = r.route("d0", _prompt(0, 0))
    r.loads[home].in_flight += 3                   # now 4 ahead of the other core: beyond margin
    assert r.route("d0-again", _prompt(0, 1)) == 1 - home
    # ...and the prefix now lives there too: the next one follows the newer copy.
    r.loads[home].in_flight -= 4
    assert r.route("d0-third", _prompt(0, 2)) == 1 - home


def test_short_shared_prefixes_do_not_attract() -> None:
    """A match under min_affinity_tokens (e.g. the chat template's system prompt) is ignored."""
    r = DPRouter(2, BS, min_affinity_tokens=64)
    system = list(range(3 * BS))                   # 48 shared tokens, then different text
    a = r.route("a", system + [1] * (5 * BS))
    assert r.route("b", system + [2] * (5 * BS)) == 1 - a    # plain least-loaded
    assert r.affinity_routed == 0
    with pytest.raises(ValueError):
        DPRouter(0, BS)


def test_an_n_sibling_follows_its_prefill_leader_whatever_the_load() -> None:
    r = DPRouter(2, BS, affinity=False)
    leader = r.route("p-0", [7])
    r.loads[leader].in_flight += 50             # the leader's core is now far busier
    assert [r.route(f"p-{i}", [7], prefill_leader="p-0") for i in (1, 2)] == [leader, leader]
    assert r.route("q", [7], prefill_leader="gone") != leader    # unknown leader: by load


def test_cores_split_the_cpus_unless_threads_are_given() -> None:
    import os

    from engine_v1.launcher import core_config
    from shared.config import EngineConfig, ModelConfig

    cpus = len(os.sched_getaffinity(0))
    assert core_config(EngineConfig(), 2).model.num_threads == max(1, cpus // 2)
    assert core_config(EngineConfig(), 4 * cpus).model.num_threads == 1      # never zero
    assert core_config(EngineConfig(), 1).model.num_threads is None           # torch's default
    given = EngineConfig(model=ModelConfig(num_threads=3))
    assert core_config(given, 2).model.num_threads == 3
