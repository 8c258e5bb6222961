"""--scheduling-policy priority: admission by (priority, arrival), the lowest priority preempted."""
from __future__ import annotations

import random

import msgspec
import pytest

from shared.core.request import Request, RequestStatus
from shared.core.scheduler import Scheduler
from shared.errors import ParamError
from shared.messages import EngineCoreRequest, SamplingParams
from tests.shared.factories import FakeModel, RunLog, make_request, make_scheduler, run_step, run_until_done


def admitted_order(sched: Scheduler) -> list[str]:
    """Run to the end; the order in which requests were first scheduled."""
    order: list[str] = []
    for step in run_until_done(sched).steps:
        order += [s.request.request_id for s in step.scheduled if s.request.request_id not in order]
    return order


def test_waiting_requests_are_admitted_lowest_priority_value_first() -> None:
    sched = make_scheduler(max_num_seqs=1, scheduling_policy="priority")
    for rid, prio in (("a", 5), ("b", 0), ("c", -2), ("d", 2)):
        sched.add_request(make_request(rid, 4, max_tokens=3, priority=prio))
    assert [r.request_id for r in sched.waiting] == ["c", "b", "d", "a"]
    assert admitted_order(sched) == ["c", "b", "d", "a"]


def test_equal_priorities_go_by_arrival_time_then_by_insertion() -> None:
    sched = make_scheduler(max_num_seqs=1, scheduling_policy="priority")
    for rid, prio, arrival in (("late", 1, 3.0), ("early", 1, 1.0), ("early2", 1, 1.0),
                               ("urgent", 0, 9.0)):
        sched.add_request(make_request(rid, 4, max_tokens=2, priority=prio, arrival_time=arrival))
    assert admitted_order(sched) == ["urgent", "early", "early2", "late"]


def test_a_new_urgent_request_overtakes_those_already_waiting() -> None:
    sched = make_scheduler(max_num_seqs=1, scheduling_policy="priority")
    model, log = FakeModel(4), RunLog()
    for rid in ("a", "b"):
        sched.add_request(make_request(rid, 4, max_tokens=3, priority=1))
    run_step(sched, model, log)                     # a runs, b waits
    sched.add_request(make_request("now", 4, max_tokens=3, priority=-1))
    run_until_done(sched, model, log=log)
    assert log.finish_order == ["a", "now", "b"]    # no preemption for a free seat: a finishes


def test_preemption_takes_the_lowest_priority_running_request_not_the_newest() -> None:
    # 6 blocks of 4 tokens; 4-token prompts need a 2nd block at token 5 and a 3rd at token 9.
    sched = make_scheduler(num_blocks=6, max_num_seqs=3, scheduling_policy="priority")
    model, log = FakeModel(4), RunLog()
    sched.add_request(make_request("low", 4, max_tokens=20, priority=2))
    run_step(sched, model, log)                     # the oldest runs alone for a step
    for rid, prio in (("high", 0), ("mid", 1), ("mid2", 1)):
        sched.add_request(make_request(rid, 4, max_tokens=20, priority=prio))
    while not log.steps[-1].preempted_ids:
        run_step(sched, model, log)
    out = log.steps[-1]
    assert out.preempted_ids == ["low"]             # fcfs would take "mid", the newest
    assert [s.request.request_id for s in out.scheduled] == ["high", "mid"]
    assert [r.request_id for r in sched.running] == ["high", "mid"]
    # Back in its sorted place, behind mid2 (priority 1), not at the head as under fcfs.
    assert [r.request_id for r in sched.waiting] == ["mid2", "low"]
    low = sched.waiting[1]
    assert (low.status, low.num_computed_tokens) == (RequestStatus.PREEMPTED, 0)
    run_until_done(sched, model, log=log)
    assert {rid: len(toks) for rid, toks in log.outputs.items()} == dict.fromkeys(
        ("low", "high", "mid", "mid2"), 20)


def test_running_requests_get_the_token_budget_in_priority_order() -> None:
    sched = make_scheduler(max_num_batched_tokens=10, scheduling_policy="priority")
    model, log = FakeModel(4), RunLog()
    sched.add_request(make_request("low", 4, max_tokens=20, priority=3))
    run_step(sched, model, log)
    sched.add_request(make_request("high", 30, max_tokens=2, priority=0))
    run_step(sched, model, log)                     # low decodes (1), high prefills 9
    run_step(sched, model, log)
    assert [(s.request.request_id, s.num_new_tokens) for s in log.steps[-1].scheduled] == [
        ("high", 10)]                               # high is first in running now


def test_priority_zero_everywhere_schedules_exactly_as_fcfs() -> None:
    """With one priority and one arrival time, the priority policy is fcfs, preemptions too."""
    rng = random.Random(3)
    specs = [(f"r{i}", rng.randrange(1, 30), rng.randrange(1, 25)) for i in range(24)]
    runs = []
    for policy in ("fcfs", "priority"):
        sched = make_scheduler(num_blocks=20, max_num_seqs=6, max_num_batched_tokens=16,
                               scheduling_policy=policy)
        for rid, n, max_tokens in specs:
            sched.add_request(make_request(rid, n, max_tokens=max_tokens))
        log = run_until_done(sched)
        runs.append([([(s.request.request_id, s.start, s.num_new_tokens) for s in o.scheduled],
                      o.preempted_ids) for o in log.steps])
        assert sched.num_preemptions > 0
    assert runs[0] == runs[1]


def test_fcfs_refuses_a_priority_and_keeps_no_state() -> None:
    sched = make_scheduler()
    with pytest.raises(ParamError) as exc:
        sched.add_request(make_request("p", 4, priority=1))
    assert exc.value.param == "priority"
    assert not sched.requests and not sched.waiting
    sched.add_request(make_request("zero", 4, priority=0))     # 0 is every request's default
    assert [r.request_id for r in sched.waiting] == ["zero"]


def test_unknown_policy_is_refused_by_the_config() -> None:
    with pytest.raises(ValueError, match="scheduling_policy"):
        make_scheduler(scheduling_policy="lifo")


def test_new_fields_ride_last_on_the_wire_and_old_encodings_still_decode() -> None:
    req = EngineCoreRequest("r", [1, 2], SamplingParams(), None, 1.5, priority=-7,
                            prefill_leader="q")
    wire = msgspec.msgpack.encode(req)
    assert msgspec.msgpack.decode(wire, type=list)[-2:] == [-7, "q"]
    back = Request.from_core_request(msgspec.msgpack.decode(wire, type=EngineCoreRequest))
    assert back.priority == -7 and back.prefill_leader == "q"
    old = msgspec.msgpack.encode(["r", [1, 2], {}, None, 1.5])     # before the field existed
    assert msgspec.msgpack.decode(old, type=EngineCoreRequest).priority == 0
