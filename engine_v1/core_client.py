"""A blocking client of the core process, for the offline ``LLM``:

    from engine_v1 import CoreProcessClient
    llm = LLM(core_factory=CoreProcessClient)   # same LLM code, the core in its own process
"""
from __future__ import annotations

from pathlib import Path

from engine_v1 import wire
from engine_v1.launcher import CoreLauncher
from shared.config import EngineConfig
from shared.errors import EngineDeadError, ParamError
from shared.messages import EngineCoreOutputs, EngineCoreRequest

_POLL_MS = 250


class CoreProcessClient:
    """Implements the CoreDriver protocol of ``shared.llm`` over the v1 wire format."""

    def __init__(self, config: EngineConfig, model_path: Path, ready_timeout_s: float = 300.0) -> None:
        self.launcher = CoreLauncher(config, model_path)
        self.launcher.spawn()
        self.model_info = self.launcher.wait_ready(ready_timeout_s).model_info
        self.codec = wire.WireCodec()
        self._unfinished: set[str] = set()

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send(wire.ADD, request)
        self._unfinished.add(request.request_id)

    def abort_requests(self, request_ids: list[str]) -> None:
        self._send(wire.ABORT, request_ids)
        self._unfinished.difference_update(request_ids)

    def has_unfinished_requests(self) -> bool:
        return bool(self._unfinished)

    def step(self) -> EngineCoreOutputs:
        """Block until the core's next batch of outputs."""
        while True:
            if not self.launcher.out_sock.poll(_POLL_MS):
                if not self.launcher.is_alive():
                    raise EngineDeadError("engine core process exited")
                continue
            tag, payload = self.codec.decode(self.launcher.out_sock.recv_multipart())
            if tag == wire.OUTPUTS:
                for out in payload.outputs:
                    if out.finish_reason is not None:
                        self._unfinished.discard(out.request_id)
                return payload
            if tag == wire.REJECT:
                self._unfinished.discard(payload.request_id)
                raise ParamError(payload.message, payload.param)
            if tag == wire.FAILED:
                raise EngineDeadError(payload.message)

    def shutdown(self) -> None:
        self.launcher.stop()

    close = shutdown    # LLM's CoreDriver name

    def _send(self, tag: bytes, payload: object) -> None:
        self.launcher.send(self.codec.encode(tag, payload))
