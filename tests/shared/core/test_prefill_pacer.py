"""The prefill pacer: prompt tokens per step from the engine's own step times."""
from __future__ import annotations

import pytest

from shared.config import SchedulerConfig
from shared.core.prefill_pacer import PrefillPacer
from shared.core.scheduler import Scheduler
from shared.core.scheduler_output import SchedulerOutput
from tests.shared.factories import FakeModel, RunLog, make_request, make_scheduler, run_step


def test_cap_is_the_budget_until_a_step_beside_decodes_ran_over() -> None:
    p = PrefillPacer(ratio=2.0, floor=16, ceiling=1024)
    assert p.cap(16) == 1024
    p.observe(16, 0, 0.035)              # a decode-only step: 35 ms, target 70
    p.observe(16, 100, 0.060)            # under the target and below the cap: nothing learnt
    assert p.cap(16) == 1024
    p.observe(16, 128, 0.140)            # twice the target: half the tokens
    assert p.cap(16) == 64
    assert p.cap(0) == 1024              # nobody decoding: nothing to protect
    p.observe(16, 64, 0.050)             # at the cap with room: grow
    assert p.cap(16) == 81


def test_cap_stays_between_floor_and_ceiling_and_ignores_steps_without_decodes() -> None:
    p = PrefillPacer(ratio=2.0, floor=16, ceiling=100)
    p.observe(0, 500, 9.0)               # a prefill alone says nothing about decode steps
    p.observe(4, 50, 9.0)                # nor a mixed step before any decode-only one
    assert (p.decode_step, p.limit) == (None, None)
    p.observe(4, 0, 0.010)
    p.observe(4, 100, 10.0)              # far over: down to the floor, not below
    assert p.cap(4) == 16
    for _ in range(20):
        p.observe(4, p.cap(4), 0.011)    # cheap again: back up to the budget, not past it
    assert p.cap(4) == 100


def test_off_keeps_the_budget() -> None:
    p = PrefillPacer(ratio=0.0, floor=16, ceiling=512)
    p.observe(16, 0, 0.035)
    p.observe(16, 100, 1.0)
    assert p.cap(16) == 512
    with pytest.raises(ValueError, match="prefill_step_ratio"):
        SchedulerConfig(prefill_step_ratio=0.5)


def fake_ms(out: SchedulerOutput, mixed_ms: float) -> float:
    """A fake forward: 2 ms fixed, 2 ms per decode row, 0.1 ms per prompt token and
    ``mixed_ms`` more when it carries prompt tokens (a mixed step leaves the fused decode)."""
    decode = sum(1 for s in out.scheduled if s.num_new_tokens == 1)
    prompt = out.num_scheduled_tokens - decode
    return 2.0 + 2.0 * decode + (mixed_ms + 0.1 * prompt if prompt else 0.0)


def paced_run(mixed_ms: float, long_len: int) -> tuple[Scheduler, RunLog, list[tuple[int, float]]]:
    """Four streams decode; a 200-token prompt, then a long one arrive. (chunk, ms) per step."""
    sched = make_scheduler(num_blocks=1024, max_num_batched_tokens=1024, max_model_len=4096)
    model, log = FakeModel(4), RunLog()

    def step() -> float:
        run_step(sched, model, log)
        ms = fake_ms(log.steps[-1], mixed_ms)
        sched.observe_step(log.steps[-1], ms / 1e3)
        return ms

    for i in range(4):
        sched.add_request(make_request(f"d{i}", 3, max_tokens=500))
    for _ in range(4):
        step()                                      # four prefills alone, then 10 ms decodes
    sched.add_request(make_request("warm", 200, max_tokens=1))
    step()
    sched.add_request(make_request("long", long_len, max_tokens=1))
    steps = []
    while "long" not in log.outputs:
        ms = step()
        steps += [(s.num_new_tokens, ms) for s in log.steps[-1].scheduled if s.request.request_id == "long"]
    assert all(len(log.outputs[f"d{i}"]) == 3 + len(steps) + 1 + 1 for i in range(4))
    return sched, log, steps


def test_a_long_prompt_fills_in_chunks_near_the_target_step_time() -> None:
    # Target 2 * 10 ms; 10 + 3 + 0.1 P <= 20 holds up to P = 70.
    sched, _, steps = paced_run(mixed_ms=3.0, long_len=2000)
    assert sched.pacer.decode_step == pytest.approx(0.010)
    settled = steps[5:]
    assert all(ms <= 20.0 * 1.1 for _, ms in settled)       # around the target, not far past
    mean_chunk = sum(c for c, _ in settled) / len(settled)
    assert 64 <= mean_chunk <= 80                            # and as large as it allows
    assert sum(c for c, _ in steps) == 2000


def test_where_no_chunk_meets_the_target_prompts_still_fill_at_the_floor() -> None:
    _, _, steps = paced_run(mixed_ms=30.0, long_len=640)   # every mixed step is over 20 ms
    chunks = [c for c, _ in steps]
    assert chunks[0] < 200                     # the warm prompt's step already set a cap
    assert set(chunks[1:-1]) == {64} and 0 < chunks[-1] <= 64 and sum(chunks) == 640


def test_without_decodes_a_prompt_gets_the_whole_budget() -> None:
    sched = make_scheduler(num_blocks=128, max_num_batched_tokens=256)
    sched.pacer.decode_step, sched.pacer.limit = 0.010, 64
    model, log = FakeModel(4), RunLog()
    sched.add_request(make_request("alone", 100, max_tokens=2))
    run_step(sched, model, log)
    assert log.steps[-1].scheduled[0].num_new_tokens == 100


def test_prompts_up_to_the_threshold_fill_whole_and_only_longer_ones_are_paced() -> None:
    sched = make_scheduler(num_blocks=1024, max_num_batched_tokens=1024, max_model_len=4096,
                           prefill_pace_threshold=256)
    model, log = FakeModel(4), RunLog()
    for i in range(2):
        sched.add_request(make_request(f"d{i}", 3, max_tokens=100))
    run_step(sched, model, log)                 # their prompts; from here on they decode
    sched.pacer.decode_step, sched.pacer.limit = 0.010, 64
    sched.add_request(make_request("short", 256, max_tokens=1))
    sched.add_request(make_request("long", 257, max_tokens=1))
    run_step(sched, model, log)
    chunks = {s.request.request_id: s.num_new_tokens for s in log.steps[-1].scheduled}
    assert chunks == {"d0": 1, "d1": 1, "short": 256, "long": 64}
    sched.observe_step(log.steps[-1], 1.0)      # a whole short prompt in it: nothing learnt
    assert sched.pacer.limit == 64
    run_step(sched, model, log)
    chunks = {s.request.request_id: s.num_new_tokens for s in log.steps[-1].scheduled}
    assert chunks == {"d0": 1, "d1": 1, "long": 64}
    sched.observe_step(log.steps[-1], 0.015)    # paced chunks alone, at the cap with room: grow
    assert sched.pacer.limit == 81
    with pytest.raises(ValueError, match="prefill_pace_threshold"):
        SchedulerConfig(prefill_pace_threshold=-1)
