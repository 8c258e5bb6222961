"""bench_structured's parts that need no server: matched bodies and compile timing."""
from __future__ import annotations

from compare.bench_structured import TOPICS, _bodies, compile_times


def test_the_free_round_matches_each_constrained_length() -> None:
    constrained, free = _bodies(None), _bodies(list(range(5, 5 + len(TOPICS))))
    assert all("response_format" in b and "ignore_eos" not in b for b in constrained)
    assert [b["max_tokens"] for b in free] == list(range(5, 5 + len(TOPICS)))
    assert all(b["ignore_eos"] and "response_format" not in b for b in free)
    assert [b["messages"] for b in free] == [b["messages"] for b in constrained]
    assert [b["seed"] for b in free] == [b["seed"] for b in constrained]


def test_compile_times_compiles_distinct_schemas(default_model_dir: str) -> None:
    times = compile_times(3)
    assert len(times) == 3 and all(0 < t < 30 for t in times)
