"""The scheduler with constrained requests, fed by a fake model (no grammar library needed):
waiting for a compile, failing one, and stopping where the grammar ends."""
from __future__ import annotations

from dataclasses import dataclass, field

from shared.core.request import RequestStatus
from tests.shared.factories import FakeModel, RunLog, make_request, make_scheduler, run_step


@dataclass
class FakeGrammar:
    """Ready when told; accepts any token; stops after ``stop_after`` tokens."""

    is_ready: bool = False
    error: str | None = None
    stop_after: int | None = None
    forbidden: set[int] = field(default_factory=set)
    seen: list[int] = field(default_factory=list)
    matcher: object = None

    def ready(self) -> bool:
        return self.is_ready

    def accept(self, token_id: int) -> bool:
        if token_id in self.forbidden:
            self.error = f"token {token_id} is forbidden"
            return False
        self.seen.append(token_id)
        return True

    @property
    def is_stopped(self) -> bool:
        return self.stop_after is not None and len(self.seen) >= self.stop_after


def test_a_compiling_request_waits_while_the_ones_behind_it_run() -> None:
    sched, model, log = make_scheduler(), FakeModel(4), RunLog()
    slow = make_request("slow", 5, max_tokens=4)
    slow.grammar = FakeGrammar()
    sched.add_request(slow)
    sched.add_request(make_request("free", 5, max_tokens=4))
    for _ in range(3):
        run_step(sched, model, log)
    assert [s.request.request_id for s in log.steps[0].scheduled] == ["free"]
    assert slow.status is RequestStatus.WAITING and slow.num_computed_tokens == 0
    slow.grammar.is_ready = True
    run_step(sched, model, log)
    assert "slow" in [s.request.request_id for s in log.steps[-1].scheduled]


def test_the_grammar_sees_every_token_and_ends_the_request_with_stop() -> None:
    sched, model, log = make_scheduler(), FakeModel(4), RunLog()
    req = make_request("r", 6, max_tokens=10)
    req.grammar = FakeGrammar(is_ready=True, stop_after=3)
    sched.add_request(req)
    while sched.has_unfinished_requests():
        run_step(sched, model, log)
    assert req.grammar.seen == log.outputs["r"] and len(log.outputs["r"]) == 3
    assert log.finish_reasons["r"] == "stop"
    # The grammar ending on the last allowed token is still "stop", not "length".
    req2 = make_request("r2", 6, max_tokens=3)
    req2.grammar = FakeGrammar(is_ready=True, stop_after=3)
    sched.add_request(req2)
    while sched.has_unfinished_requests():
        run_step(sched, model, log)
    assert log.finish_reasons["r2"] == "stop"


def test_a_failed_compile_finishes_the_request_and_reports_it() -> None:
    sched, model, log = make_scheduler(), FakeModel(4), RunLog()
    bad = make_request("bad", 5)
    bad.grammar = FakeGrammar(is_ready=True, error="unsupported")
    sched.add_request(bad)
    sched.add_request(make_request("ok", 5, max_tokens=2))
    run_step(sched, model, log)
    assert log.finish_reasons["bad"] == "abort"
    out = next(o for o in log.core_outputs[0] if o.request_id == "bad")
    assert out.new_token_ids == [] and "unsupported" in out.error
    assert sched.kv_cache_manager.get_block_ids("bad") == []
    while sched.has_unfinished_requests():
        run_step(sched, model, log)
    assert len(log.outputs["ok"]) == 2


def test_a_token_the_grammar_rejects_aborts_instead_of_running_unconstrained() -> None:
    sched, model, log = make_scheduler(), FakeModel(4, token_fn=lambda h: 7), RunLog()
    req = make_request("r", 4, max_tokens=10)
    req.grammar = FakeGrammar(is_ready=True, forbidden={7})
    sched.add_request(req)
    while sched.has_unfinished_requests():
        run_step(sched, model, log)
    out = [o for step in log.core_outputs for o in step if o.request_id == "r"][-1]
    assert log.finish_reasons["r"] == "abort" and "forbidden" in out.error


def test_preemption_keeps_the_matcher_state() -> None:
    """Recompute replays known tokens through the model, not through the grammar."""
    sched, model, log = make_scheduler(num_blocks=8, max_num_batched_tokens=16), FakeModel(4), RunLog()
    reqs = [make_request(f"r{i}", 6, max_tokens=12) for i in range(3)]
    for r in reqs:
        r.grammar = FakeGrammar(is_ready=True)
        sched.add_request(r)
    while sched.has_unfinished_requests():
        run_step(sched, model, log)
    assert sched.get_stats().num_preemptions > 0
    for r in reqs:
        assert r.grammar.seen == log.outputs[r.request_id]


def test_a_fault_in_one_requests_work_fails_only_that_request() -> None:
    """A grammar that raises (a bug, not a refusal) ends its request with an error; the other
    requests of the same batch finish normally."""
    class Exploding(FakeGrammar):
        def accept(self, token_id: int) -> bool:
            raise KeyError("matcher state lost")

    sched, model, log = make_scheduler(), FakeModel(4), RunLog()
    bad = make_request("bad", 5, max_tokens=4)
    bad.grammar = Exploding(is_ready=True)
    sched.add_request(bad)
    sched.add_request(make_request("ok", 5, max_tokens=4))
    while sched.has_unfinished_requests():
        run_step(sched, model, log)
    err = [o for step in log.core_outputs for o in step if o.request_id == "bad"][-1].error
    assert "matcher state lost" in err and log.finish_reasons["bad"] == "abort"
    assert len(log.outputs["ok"]) == 4 and log.finish_reasons["ok"] == "length"
    assert sched.kv_cache_manager.num_free_blocks == sched.kv_cache_manager.num_blocks
