"""What the front end needs to know about the loaded model and cache."""
from __future__ import annotations

import msgspec


class ModelInfo(msgspec.Struct):
    name: str
    path: str
    max_model_len: int
    vocab_size: int
    num_kv_blocks: int
    block_size: int
