from __future__ import annotations

import random

import pytest

from shared.core.request import Request, RequestStatus
from shared.core.scheduler import Scheduler
from shared.messages import TokenLogprobs
from tests.shared.factories import (
    FakeModel,
    RunLog,
    make_request,
    make_scheduler,
    run_step,
    run_until_done,
    runner_output,
)

EOS = 2


def scripted(prompt_len: int, script: list[int]) -> FakeModel:
    """A fake model whose k-th output token is script[k] (one request per scheduler)."""
    return FakeModel(4, token_fn=lambda history: script[len(history) - prompt_len])


def assert_all_blocks_free(sched: Scheduler) -> None:
    stats = sched.get_stats()
    assert stats.kv_cache_usage == 0.0
    assert stats.num_free_blocks == stats.num_total_blocks
    assert (stats.num_running, stats.num_waiting) == (0, 0)


def test_random_workload_respects_budget_and_max_num_seqs() -> None:
    rng = random.Random(1)
    sched = make_scheduler(num_blocks=48, max_num_seqs=5, max_num_batched_tokens=24)
    model, log = FakeModel(4), RunLog()
    pending = [make_request(f"r{i}", rng.randrange(1, 60), max_tokens=rng.randrange(1, 20))
               for i in range(40)]
    expected = {r.request_id: r.sampling_params.max_tokens for r in pending}
    for _ in range(2000):
        if not pending and not sched.has_unfinished_requests():
            break
        for _ in range(rng.randrange(0, 3)):
            if pending:
                sched.add_request(pending.pop(0))
        run_step(sched, model, log)
        out = log.steps[-1]
        assert out.num_scheduled_tokens == sum(s.num_new_tokens for s in out.scheduled) <= 24
        assert len(out.scheduled) <= 5 and sched.num_running <= 5
        assert all(s.num_new_tokens > 0 for s in out.scheduled)
        assert len({s.request.request_id for s in out.scheduled}) == len(out.scheduled)
    assert {rid: len(toks) for rid, toks in log.outputs.items()} == expected
    assert set(log.finish_reasons.values()) == {"length"}
    assert max(o.num_scheduled_tokens for o in log.steps) == 24   # the budget was the limit
    assert_all_blocks_free(sched)


def test_long_prompt_is_chunked_while_others_decode() -> None:
    sched = make_scheduler(max_num_batched_tokens=8)
    model, log = FakeModel(4), RunLog()
    for rid in ("a", "b"):
        sched.add_request(make_request(rid, 3, max_tokens=50))
    run_step(sched, model, log)                      # both prefill: 6 tokens
    sched.add_request(make_request("long", 30, max_tokens=5))
    for step in range(5):
        run_step(sched, model, log)
        by_id = {s.request.request_id: s for s in log.steps[-1].scheduled}
        assert (by_id["a"].num_new_tokens, by_id["b"].num_new_tokens) == (1, 1)
        assert (by_id["long"].start, by_id["long"].num_new_tokens) == (6 * step, 6)
        emitted = {o.request_id for o in log.core_outputs[-1]}
        assert emitted == ({"a", "b", "long"} if step == 4 else {"a", "b"})
    assert len(log.outputs["long"]) == 1 and len(log.outputs["a"]) == 6


def test_long_prefill_threshold_caps_each_prompts_chunk() -> None:
    """Two prompts arrive together under a roomy budget: each computes at most 4 tokens a step
    (both in one step), while the decoding request goes on one token a step."""
    sched = make_scheduler(max_num_batched_tokens=64, long_prefill_token_threshold=4)
    model, log = FakeModel(4), RunLog()
    sched.add_request(make_request("d", 3, max_tokens=50))
    run_step(sched, model, log)
    for rid in ("p", "q"):
        sched.add_request(make_request(rid, 10, max_tokens=2))
    chunks: dict[str, list[int]] = {"d": [], "p": [], "q": []}
    for _ in range(3):
        run_step(sched, model, log)
        for s in log.steps[-1].scheduled:
            chunks[s.request.request_id].append(s.num_new_tokens)
    assert chunks == {"d": [1, 1, 1], "p": [4, 4, 2], "q": [4, 4, 2]}
    assert len(log.outputs["p"]) == len(log.outputs["q"]) == 1      # sampled after the last chunk
    with pytest.raises(ValueError, match="long_prefill_token_threshold"):
        make_scheduler(long_prefill_token_threshold=-1)


def workload(system: list[int]) -> list[Request]:
    rng = random.Random(7)
    reqs = []
    for i in range(8):
        prompt = [rng.randrange(3, 900) for _ in range(rng.randrange(6, 16))]
        reqs.append(make_request(f"r{i}", system + prompt if i % 2 else prompt,
                                 max_tokens=rng.randrange(15, 30)))
    return reqs


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_preemption_under_a_tiny_cache_gives_the_same_tokens(prefix_caching: bool) -> None:
    system = list(range(500, 508))
    logs, preemptions = [], []
    for num_blocks in (400, 16):
        sched = make_scheduler(num_blocks=num_blocks, max_num_seqs=8, max_num_batched_tokens=32,
                               enable_prefix_caching=prefix_caching)
        for req in workload(system):
            sched.add_request(req)
        logs.append(run_until_done(sched))
        preemptions.append(sched.get_stats().num_preemptions)
        assert_all_blocks_free(sched)
    assert preemptions[0] == 0 and preemptions[1] > 0
    assert any(step.preempted_ids for step in logs[1].steps)
    assert logs[1].outputs == logs[0].outputs
    assert {len(v) for v in logs[0].outputs.values()} != {0}


def test_preemption_takes_the_newest_and_requeues_it_first() -> None:
    # 6 blocks of 4 tokens; three 4-token prompts each need a 3rd block at token 8.
    sched = make_scheduler(num_blocks=6, max_num_seqs=3)
    model, log = FakeModel(4), RunLog()
    for rid in "abcd":
        sched.add_request(make_request(rid, 4, max_tokens=20))
    while not log.steps or not log.steps[-1].preempted_ids:
        run_step(sched, model, log)
    out = log.steps[-1]
    assert out.preempted_ids == ["c"]
    assert [s.request.request_id for s in out.scheduled] == ["a", "b"]   # d not admitted
    c = sched.waiting[0]
    assert [r.request_id for r in sched.waiting] == ["c", "d"]
    assert (c.status, c.num_computed_tokens, c.num_output_tokens) == (RequestStatus.PREEMPTED, 0, 5)
    assert sched.kv_cache_manager.get_block_ids("c") == []
    run_until_done(sched, model, log=log)
    assert all(len(log.outputs[rid]) == 20 for rid in "abcd")


def test_a_request_that_is_itself_the_newest_preempts_itself() -> None:
    sched = make_scheduler(num_blocks=3)
    model, log = FakeModel(4), RunLog()
    sched.add_request(make_request("a", 4, max_tokens=8))
    sched.add_request(make_request("b", 4, max_tokens=8))
    run_step(sched, model, log)                      # 2 blocks used, both need a 2nd next
    run_step(sched, model, log)
    out = log.steps[-1]
    assert out.preempted_ids == ["b"] and [s.request.request_id for s in out.scheduled] == ["a"]
    run_until_done(sched, model, log=log)
    assert log.finish_order == ["a", "b"]


def test_fcfs_admission_and_completion_order() -> None:
    sched = make_scheduler(max_num_seqs=2)
    log = RunLog()
    for i in range(5):
        sched.add_request(make_request(f"r{i}", 6, max_tokens=4))
    run_until_done(sched, log=log)
    first_step = {}
    for n, step in enumerate(log.steps):
        for s in step.scheduled:
            first_step.setdefault(s.request.request_id, n)
    assert sorted(first_step, key=lambda rid: first_step[rid]) == [f"r{i}" for i in range(5)]
    assert list(first_step.values()) == sorted(first_step.values())
    assert log.finish_order == [f"r{i}" for i in range(5)]


def test_waiting_head_that_does_not_fit_is_not_overtaken() -> None:
    sched = make_scheduler(num_blocks=8)
    model, log = FakeModel(4), RunLog()
    sched.add_request(make_request("a", 20, max_tokens=3))    # 5 blocks, 6 once decoding
    run_step(sched, model, log)
    sched.add_request(make_request("b", 16, max_tokens=3))    # needs 4 blocks: only 3 free
    sched.add_request(make_request("c", 2, max_tokens=3))     # would fit, must wait its turn
    run_step(sched, model, log)
    assert [s.request.request_id for s in log.steps[-1].scheduled] == ["a"]
    assert [r.request_id for r in sched.waiting] == ["b", "c"]
    run_until_done(sched, model, log=log)
    assert log.finish_order == ["a", "b", "c"]


@pytest.mark.parametrize("params, script, expected, reason, stop_reason", [
    ({}, [5, EOS, 7], [5, EOS], "stop", None),
    ({"ignore_eos": True, "max_tokens": 4}, [5, EOS, 7, 8, 9], [5, EOS, 7, 8], "length", None),
    ({"stop_token_ids": [7]}, [5, 7, 8], [5, 7], "stop", 7),
    ({"max_tokens": 3}, [5, 6, 7, 8], [5, 6, 7], "length", None),
    ({"max_tokens": 2}, [5, EOS], [5, EOS], "stop", None),             # EOS wins over length
    ({"min_tokens": 3}, [EOS, EOS, EOS, 9], [EOS, EOS, EOS], "stop", None),
    ({"min_tokens": 3, "stop_token_ids": [7]}, [7, 7, 5, 7], [7, 7, 5, 7], "stop", 7),
])
def test_finish_conditions(params: dict, script: list[int], expected: list[int], reason: str,
                           stop_reason: int | None) -> None:
    sched = make_scheduler()
    params.setdefault("max_tokens", 10)
    req = make_request("r", 5, eos_token_id=EOS, **params)
    sched.add_request(req)
    log = run_until_done(sched, scripted(5, script))
    assert log.outputs["r"] == expected
    assert log.finish_reasons["r"] == reason
    assert req.stop_reason == stop_reason and log.core_outputs[-1][-1].stop_reason == stop_reason
    assert_all_blocks_free(sched)


@pytest.mark.parametrize("max_tokens", [None, 100])
def test_finish_at_max_model_len(max_tokens: int | None) -> None:
    sched = make_scheduler(max_model_len=10)
    req = make_request("r", 6, max_tokens=max_tokens)
    sched.add_request(req)
    assert req.max_output_tokens == 4
    log = run_until_done(sched, scripted(6, [5] * 10))
    assert log.finish_reasons["r"] == "length" and req.num_tokens == 10


def test_output_tokens_are_capped_by_the_whole_cache() -> None:
    sched = make_scheduler(num_blocks=3, max_model_len=100)   # 12 token slots
    req = make_request("r", 8, max_tokens=None)
    sched.add_request(req)
    assert req.max_output_tokens == 5                          # 8 + 5 - 1 = 12 slots
    log = run_until_done(sched)
    assert len(log.outputs["r"]) == 5 and log.finish_reasons["r"] == "length"


def test_abort_frees_blocks_at_once() -> None:
    sched = make_scheduler(num_blocks=20, max_num_seqs=1)
    model, log = FakeModel(4), RunLog()
    for rid in ("a", "b", "c"):
        sched.add_request(make_request(rid, 10))
    run_step(sched, model, log)
    assert sched.get_stats().num_free_blocks == 17
    aborted = sched.abort_requests(["a", "zzz", "c"])
    assert [r.request_id for r in aborted] == ["a", "c"]
    assert all(r.status is RequestStatus.FINISHED_ABORTED for r in aborted)
    assert sched.get_stats().num_free_blocks == 20 and sched.num_running == 0
    assert [r.request_id for r in sched.waiting] == ["b"]
    out = sched.schedule()
    assert sorted(out.finished_ids) == ["a", "c"]
    assert sched.abort_requests(["b"])              # aborted between schedule and update
    assert sched.update_from_output(out, model.execute(out)) == []
    assert sched.schedule().finished_ids == ["b"]   # nothing ran: ids kept for the runner
    assert_all_blocks_free(sched)
    assert not sched.has_unfinished_requests()


def test_finished_ids_reach_the_runner_once() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("r", 3, max_tokens=1))
    out = sched.schedule()
    outs = sched.update_from_output(out, runner_output(out, {"r": 9}))
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in outs] == [("r", [9], "length")]
    empty = sched.schedule()
    assert empty.is_empty and empty.finished_ids == ["r"]
    sched.add_request(make_request("s", 3, max_tokens=2))
    out = sched.schedule()                     # the first step the runner sees since r ended
    assert out.finished_ids == ["r"] and not out.is_empty
    sched.update_from_output(out, runner_output(out, {"s": 9}))
    assert sched.schedule().finished_ids == []


def test_prefix_hits_logprobs_and_stats() -> None:
    sched = make_scheduler()
    model = FakeModel(4)
    system = list(range(100, 108))
    a = make_request("a", system + [1, 2], max_tokens=3)
    sched.add_request(a)
    run_until_done(sched, model)
    b = make_request("b", system + [3], max_tokens=2)
    sched.add_request(b)
    out = sched.schedule()
    assert (out.scheduled[0].start, out.scheduled[0].num_new_tokens) == (8, 1)
    assert sched.get_stats().kv_cache_usage == pytest.approx(3 / 64)
    lp = TokenLogprobs(token_id=9, logprob=-0.5, rank=1, top_ids=[9], top_logprobs=[-0.5])
    runner_out = model.execute(out)
    runner_out.logprobs["b"] = lp
    (o,) = sched.update_from_output(out, runner_out)
    assert (o.num_cached_tokens, o.new_logprobs) == (8, [lp]) and b.output_logprobs == [lp]
    run_until_done(sched, model)
    stats = sched.get_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (10 + 9, 8)
    assert_all_blocks_free(sched)


def test_add_request_sets_limits_and_rejects_duplicates() -> None:
    sched = make_scheduler(max_model_len=50)
    req = make_request("r", 20, max_tokens=None)
    sched.add_request(req)
    assert req.max_output_tokens == 30 and req.status is RequestStatus.WAITING
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request(make_request("r", 3))
    assert sched.num_waiting == 1


class _Clock:
    """Stands in for the ``time`` module: ``monotonic()`` returns what the test set."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def test_first_output_carries_queue_and_prefill_times(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    for module in ("shared.core.request", "shared.core.scheduler"):
        monkeypatch.setattr(f"{module}.time", clock)
    # One sequence at a time and a budget of 4: each 6-token prompt takes two steps, and b
    # waits until a is done.
    sched = make_scheduler(max_num_seqs=1, max_num_batched_tokens=4)
    sched.add_request(make_request("a", 6, max_tokens=2))
    sched.add_request(make_request("b", 6, max_tokens=2))   # both queued at t=0
    log, model = RunLog(), FakeModel(4)
    while sched.has_unfinished_requests():
        clock.now += 1.0
        run_step(sched, model, log)
    outs = [o for step in log.core_outputs for o in step]
    times = {o.request_id: o.times for o in outs if o.times is not None}
    assert len(times) == 2 and sum(o.times is None for o in outs) == 2   # first tokens only
    # a: scheduled at t=1, first token at t=2; b: scheduled at t=4 (a finished at t=3), token at 5
    assert (times["a"].queued, times["a"].prefill) == (1.0, 1.0)
    assert (times["b"].queued, times["b"].prefill) == (4.0, 1.0)
