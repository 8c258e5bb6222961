"""The v1 wire format: one-byte tags plus msgspec msgpack payloads (never pickle).

API process -> core (input socket):  ADD(EngineCoreRequest) | ABORT(list[str]) | SHUTDOWN
core -> API process (output socket): READY(CoreReady) | OUTPUTS(EngineCoreOutputs)
                                     | REJECT(CoreReject) | FAILED(CoreFailure)
"""
from __future__ import annotations

from typing import Any

import msgspec

from shared.messages import EngineCoreOutputs, EngineCoreRequest, ModelInfo

ADD, ABORT, SHUTDOWN = b"\x00", b"\x01", b"\x02"
READY, OUTPUTS, REJECT, FAILED = b"\x10", b"\x11", b"\x12", b"\x13"


class CoreReady(msgspec.Struct):
    """Start-up handshake: what the API side needs before it accepts HTTP."""

    model_info: ModelInfo
    pid: int
    engine_index: int = 0


class CoreReject(msgspec.Struct):
    """The core refused one request (e.g. it can never fit the KV cache)."""

    request_id: str
    message: str
    param: str | None = None


class CoreFailure(msgspec.Struct):
    """The core is going down (start-up failed or a step raised)."""

    message: str


_TYPES: dict[bytes, Any] = {
    ADD: EngineCoreRequest, ABORT: list[str], SHUTDOWN: None,
    READY: CoreReady, OUTPUTS: EngineCoreOutputs, REJECT: CoreReject, FAILED: CoreFailure,
}
# The tag of each message struct, for senders (the same table read the other way).
TAG_OF: dict[type, bytes] = {t: tag for tag, t in _TYPES.items()
                             if isinstance(t, type) and issubclass(t, msgspec.Struct)}


class WireCodec:
    """Encoder/decoders reused for every frame (building them per message is slow)."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoders = {tag: msgspec.msgpack.Decoder(t) for tag, t in _TYPES.items() if t is not None}

    def encode(self, tag: bytes, payload: Any = None) -> list[bytes]:
        return [tag, self._encoder.encode(payload)]

    def decode(self, frames: list[bytes]) -> tuple[bytes, Any]:
        tag, body = frames[0], frames[1]
        decoder = self._decoders.get(tag)
        return tag, (decoder.decode(body) if decoder is not None else None)
