"""ctypes mirrors of the structs in ``native.h`` and ``decode.c``: one place to keep in step
with the C side (field order and types must match exactly)."""
from __future__ import annotations

import ctypes

import torch

i64, i32, f32, ptr = ctypes.c_int64, ctypes.c_int32, ctypes.c_float, ctypes.c_void_p
MAT_F32, MAT_INT8, MAT_Q4, MAT_W8A8, MAT_Q4V = 0, 1, 2, 3, 4
Q4_GROUP, MAX_Q4_GROUPS, W8_GROUP = 32, 128, 32
MAX_GROUP, MAX_DIM = 16, 256        # query heads per KV head, head dim (attention.c, decode.c)
A512_DIM, A512_GROUP = 64, 4        # the shapes attention.c's AVX-512 tile takes (attn512.h)
# decode.c's stages in its enum's order (the timers of a -DTWINSERVE_STAGE_TIMES build).
STAGES = ("fork", "embed", "in_norm", "qkv", "rope_store", "attention", "o", "post_norm", "gate_up",
          "silu", "down", "final_norm", "join")
GEMM_STAGES = ("qkv", "o", "gate_up", "down")


class Mat(ctypes.Structure):
    _fields_ = [("w", ptr), ("scale", ptr), ("zero", ptr), ("bias", ptr), ("n", i64), ("k", i64),
                ("kind", i32)]


class PagedKV(ctypes.Structure):
    _fields_ = [("k_cache", ptr), ("v_cache", ptr), ("tables", ptr), ("max_blocks", i64),
                ("block_size", i64), ("heads", i64), ("kv_heads", i64), ("dim", i64),
                ("kv_bf16", i32), ("scale", f32)]


class Layer(ctypes.Structure):
    _fields_ = [("in_norm", ptr), ("post_norm", ptr), ("q_norm", ptr), ("k_norm", ptr),
                ("qkv", Mat), ("o", Mat), ("gate_up", Mat), ("down", Mat),
                ("k_cache", ptr), ("v_cache", ptr), ("kv_bf16", i32)]


class Dims(ctypes.Structure):
    _fields_ = [("hidden", i64), ("heads", i64), ("kv_heads", i64), ("dim", i64), ("inter", i64),
                ("num_layers", i64), ("eps", f32), ("scale", f32)]


class StepIO(ctypes.Structure):
    _fields_ = [("h", ptr), ("rows", i64), ("ids", ptr), ("embed", ptr), ("final_norm", ptr),
                ("cos", ptr), ("sin", ptr), ("rope_row", ptr), ("slots", ptr), ("tables", ptr),
                ("max_blocks", i64), ("block_size", i64), ("table_row", ptr), ("ctx", ptr)]


class Scratch(ctypes.Structure):
    _fields_ = [("x", ptr), ("qkv", ptr), ("q", ptr), ("attn", ptr), ("gate_up", ptr),
                ("act", ptr), ("split", ptr), ("split_capacity", i64), ("rows", i64)]


def addr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def with_bias(m: Mat, bias: torch.Tensor | None) -> Mat:
    """A copy of ``m`` that adds ``bias`` (float32 [n], kept alive by its owner)."""
    out = Mat.from_buffer_copy(m)
    out.bias = addr(bias)
    return out
