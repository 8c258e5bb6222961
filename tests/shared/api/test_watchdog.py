"""EngineWatchdog against a scripted engine: stall -> dead -> exit after the grace period."""
from __future__ import annotations

import asyncio

from shared.api.watchdog import EngineWatchdog
from shared.errors import EngineDeadError


class _Engine:
    def __init__(self, stalled: float | None) -> None:
        self.stalled = stalled
        self.error: BaseException | None = None

    def stalled_for(self) -> float | None:
        return self.stalled

    def fail_all(self, error: BaseException) -> None:
        self.error = error

    @property
    def is_dead(self) -> bool:
        return self.error is not None


def _run(engine: _Engine, seconds: float, keep_alive: bool = False) -> tuple[EngineWatchdog, list]:
    exits: list[float] = []

    async def main() -> EngineWatchdog:
        loop = asyncio.get_running_loop()
        dog = EngineWatchdog(engine, step_timeout_s=1.0, keep_alive_on_death=keep_alive,
                             on_exit=lambda: exits.append(loop.time()), grace_s=0.5)
        dog.start()
        await asyncio.sleep(seconds)
        await dog.stop()
        return dog

    return asyncio.run(main()), exits


def test_progress_or_idleness_is_never_a_stall() -> None:
    for stalled in (None, 0.5):
        engine = _Engine(stalled)
        dog, exits = _run(engine, 1.0)
        assert engine.error is None and exits == [] and not dog.exit_requested


def test_a_stall_kills_the_engine_and_then_the_server() -> None:
    engine = _Engine(5.0)
    dog, exits = _run(engine, 1.5)
    assert isinstance(engine.error, EngineDeadError) and "no progress" in str(engine.error)
    assert len(exits) == 1 and dog.exit_requested


def test_keep_alive_stays_up_after_death() -> None:
    engine = _Engine(5.0)
    dog, exits = _run(engine, 1.5, keep_alive=True)
    assert engine.is_dead and exits == [] and not dog.exit_requested
