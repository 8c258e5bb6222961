"""One step's inputs as flat numpy arrays (lifecycle step 8), and their wire form.

The runner turns a SchedulerOutput into ``StepArrays`` on the CPU, then into device tensors.
Under tensor parallelism rank 0 broadcasts the arrays to the other ranks as msgspec bytes (raw
array buffers, never pickles), so every rank runs the same forward on the same batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import numpy as np

from shared.core.request import Request
from shared.core.scheduler_output import SchedulerOutput
from shared.worker.prompt_logprobs import PromptRows, prompt_rows


@dataclass
class StepArrays:
    input_ids: np.ndarray           # [num_tokens] int64
    positions: np.ndarray           # [num_tokens] int64
    slot_mapping: np.ndarray        # [num_tokens] int64
    query_start_loc: np.ndarray     # [num_seqs + 1] int32
    seq_lens: np.ndarray            # [num_seqs] int32
    block_tables: np.ndarray        # [num_seqs, max_blocks] int32, padded with 0
    logits_indices: np.ndarray      # [num_sampling] int64
    query_lens: list[int]
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    prompt_rows: list[PromptRows] = field(default_factory=list)


def flatten_step(sched: SchedulerOutput, block_size: int) -> tuple[StepArrays, list[Request]]:
    """The scheduled chunks back to back in one batch; also the requests that sample, in row
    order of ``logits_indices``."""
    bs = block_size
    tokens: list[int] = []
    positions, slots, logits_idx = [], [], []
    query_lens, seq_lens, sampling = [], [], []
    scored: list[PromptRows] = []
    max_blocks = max(len(s.block_ids) for s in sched.scheduled)
    tables = np.zeros((len(sched.scheduled), max_blocks), dtype=np.int32)
    for i, s in enumerate(sched.scheduled):
        end = s.start + s.num_new_tokens
        if (rows := prompt_rows(s, len(tokens))) is not None:
            scored.append(rows)
        tokens.extend(s.request.all_token_ids[s.start:end])
        pos = np.arange(s.start, end, dtype=np.int64)
        table = np.asarray(s.block_ids, dtype=np.int64)
        positions.append(pos)
        slots.append(table[pos // bs] * bs + pos % bs)
        tables[i, : len(s.block_ids)] = s.block_ids
        query_lens.append(s.num_new_tokens)
        seq_lens.append(end)
        if s.samples:
            logits_idx.append(len(tokens) - 1)
            sampling.append(s.request)
    qsl = np.zeros(len(query_lens) + 1, dtype=np.int32)
    np.cumsum(query_lens, out=qsl[1:])
    arrays = StepArrays(
        input_ids=np.asarray(tokens, dtype=np.int64), positions=np.concatenate(positions),
        slot_mapping=np.concatenate(slots), query_start_loc=qsl,
        seq_lens=np.asarray(seq_lens, dtype=np.int32), block_tables=tables,
        logits_indices=np.asarray(logits_idx, dtype=np.int64), query_lens=query_lens,
        block_copies=list(sched.block_copies), prompt_rows=scored)
    return arrays, sampling


class _Wire(msgspec.Struct, array_like=True):
    input_ids: bytes
    positions: bytes
    slot_mapping: bytes
    block_tables: bytes
    table_width: int
    logits_indices: bytes
    query_lens: list[int]
    seq_lens: list[int]
    block_copies: list[tuple[int, int]]
    prompt_rows: list[PromptRows]


def encode_step(a: StepArrays) -> bytes:
    return msgspec.msgpack.encode(_Wire(
        a.input_ids.tobytes(), a.positions.tobytes(), a.slot_mapping.tobytes(),
        a.block_tables.tobytes(), a.block_tables.shape[1], a.logits_indices.tobytes(),
        a.query_lens, a.seq_lens.tolist(), a.block_copies, a.prompt_rows))


def decode_step(payload: bytes) -> StepArrays:
    w = msgspec.msgpack.decode(payload, type=_Wire)
    qsl = np.zeros(len(w.query_lens) + 1, dtype=np.int32)
    np.cumsum(w.query_lens, out=qsl[1:])
    return StepArrays(
        input_ids=_array(w.input_ids, np.int64), positions=_array(w.positions, np.int64),
        slot_mapping=_array(w.slot_mapping, np.int64), query_start_loc=qsl,
        seq_lens=np.asarray(w.seq_lens, dtype=np.int32),
        block_tables=_array(w.block_tables, np.int32).reshape(-1, w.table_width),
        logits_indices=_array(w.logits_indices, np.int64), query_lens=w.query_lens,
        block_copies=w.block_copies, prompt_rows=w.prompt_rows)


def _array(raw: bytes, dtype: type) -> np.ndarray:
    # A writable copy: torch.from_numpy warns on (and must not write through) read-only buffers.
    return np.frombuffer(bytearray(raw), dtype=dtype)
