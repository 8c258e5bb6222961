"""n > 1 runs one prefill: siblings fork their leader's prompt KV (fake model outputs).

The fake model writes (position, token) into each KV slot and reads the whole sequence back
through the block table, so a sibling whose shared or copied blocks were wrong would fail its
read or sample differently from the leader.
"""
from __future__ import annotations

import pytest

from shared.core.scheduler import Scheduler
from tests.shared.factories import FakeModel, RunLog, make_request, make_scheduler, run_step, run_until_done

PROMPT = [(i * 37) % 500 + 3 for i in range(10)]     # 10 tokens: blocks of 4 hold 4 + 4 + 2


def _group(n: int, prompt: list[int] = PROMPT, fork: bool = True, max_tokens: int = 6) -> list:
    leader = make_request("c-0", prompt, max_tokens=max_tokens)
    return [leader] + [make_request(f"c-{i}", prompt, max_tokens=max_tokens,
                                    prefill_leader="c-0" if fork else None) for i in range(1, n)]


def _prompt_tokens_computed(log: RunLog) -> int:
    return sum(min(s.start + s.num_new_tokens, s.request.num_prompt_tokens) - s.start
               for step in log.steps for s in step.scheduled if s.start < s.request.num_prompt_tokens)


def _run(sched: Scheduler, reqs: list) -> tuple[RunLog, int]:
    for r in reqs:
        sched.add_request(r)
    model, log, peak = FakeModel(4), RunLog(), 0
    while sched.has_unfinished_requests():
        run_step(sched, model, log)
        peak = max(peak, sched.kv_cache_manager.num_blocks - sched.kv_cache_manager.num_free_blocks)
    return log, peak


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_eight_choices_prefill_once_and_share_blocks(prefix_caching: bool) -> None:
    def sched() -> Scheduler:   # the budget fits all eight prompts in one step
        return make_scheduler(enable_prefix_caching=prefix_caching, max_num_batched_tokens=256)
    forked, peak_forked = _run(sched(), _group(8))
    apart, peak_apart = _run(sched(), _group(8, fork=False))
    # The leader computes the prompt; each sibling only its last token. Apart, all eight
    # prefill together, so even the prefix cache finds nothing to share.
    assert _prompt_tokens_computed(forked) == len(PROMPT) + 7
    assert _prompt_tokens_computed(apart) == 8 * len(PROMPT)
    # 2 full prompt blocks shared by all eight, instead of one copy each.
    assert peak_apart - peak_forked == 7 * 2
    # Same history, same (deterministic) tokens: the forked KV read back right.
    want = apart.outputs["c-0"]
    assert all(forked.outputs[f"c-{i}"] == want for i in range(8))


def test_the_partial_block_is_copied_and_siblings_wait_for_the_prefill() -> None:
    sched = make_scheduler()
    for r in _group(3):
        sched.add_request(r)
    model, log = FakeModel(4), RunLog()
    run_step(sched, model, log)
    assert [s.request.request_id for s in log.steps[0].scheduled] == ["c-0"]
    run_step(sched, model, log)
    step = log.steps[1]
    leader_table = sched.kv_cache_manager.get_block_ids("c-0")
    assert [(s.request.request_id, s.start, s.num_new_tokens) for s in step.scheduled] == [
        ("c-0", 10, 1), ("c-1", 9, 1), ("c-2", 9, 1)]
    copies = step.block_copies
    assert [src for src, _ in copies] == [leader_table[2]] * 2
    for s in step.scheduled[1:]:
        assert s.block_ids[:2] == leader_table[:2] and s.block_ids[2] != leader_table[2]
    assert sorted(d for _, d in copies) == sorted(s.block_ids[2] for s in step.scheduled[1:])
    assert sched.get_stats().num_forked_tokens == 2 * 9


def test_no_copy_when_the_last_prompt_token_starts_a_block() -> None:
    prompt = PROMPT[:9]                 # tokens 0..7 fill two blocks; token 8 is alone in the third
    log, _ = _run(make_scheduler(), _group(4, prompt))
    assert all(not step.block_copies for step in log.steps)
    assert _prompt_tokens_computed(log) == 9 + 3
    assert len({tuple(v) for v in log.outputs.values()}) == 1


def test_siblings_of_an_aborted_leader_run_on_their_own() -> None:
    sched = make_scheduler()
    reqs = _group(3)
    for r in reqs:
        sched.add_request(r)
    sched.abort_requests(["c-0"])
    log = run_until_done(sched)
    assert set(log.outputs) == {"c-1", "c-2"} and log.outputs["c-1"] == log.outputs["c-2"]
    assert all(r.prefill_leader is None for r in reqs[1:])
    assert sched.kv_cache_manager.num_free_blocks == sched.kv_cache_manager.num_blocks


def test_a_different_prompt_is_not_forked() -> None:
    leader = make_request("c-0", PROMPT)
    other = make_request("c-1", PROMPT[::-1], prefill_leader="c-0")
    sched = make_scheduler()
    log, _ = _run(sched, [leader, other])
    assert _prompt_tokens_computed(log) == 2 * len(PROMPT)
    assert sched.get_stats().num_forked_tokens == 0


def test_forks_under_kv_pressure_finish_and_free_everything() -> None:
    # 8 blocks: the leader holds 3, forks need 1 each plus decode growth, so some get preempted.
    sched = make_scheduler(num_blocks=8)
    log, _ = _run(sched, _group(5, max_tokens=8))
    assert len(log.outputs) == 5 and len({tuple(v) for v in log.outputs.values()}) == 1
    assert sched.kv_cache_manager.num_free_blocks == 8
    assert sched.num_preemptions > 0
