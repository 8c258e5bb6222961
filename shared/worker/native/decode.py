"""The fused native step: all decoder layers of a step in one C call.

At one token per step the eager model spends more time dispatching ~15 small torch ops per
layer than multiplying; ``decode.c`` runs a whole step, from the embedding lookup to the final
norm, inside one OpenMP region (torch ops between the C calls that stream the weights ran at
several times their warm time: their code and data come back from DRAM). Python keeps the RoPE
tables (every variant of ``RotaryEmbedding``: one table over all positions, computed once,
or per step for dynamic NTK) and the lm_head. It takes decode steps of
up to ``native.max_rows`` rows with any weights, and, with int8-activation weights (W8A8 or
Q4V above ``native.max_rows`` rows), steps of up to ``max_tokens`` tokens of any mix: prompts,
chunks and decode rows. ``--quantization none`` keeps prompts on the eager model (the exact
float path). A step it cannot take runs the eager model as before.
"""
from __future__ import annotations

import ctypes
import logging
from typing import TYPE_CHECKING

import torch

from shared.worker.attention.metadata import AttentionMetadata
from shared.worker.attention.native_backend import supports as native_supports
from shared.worker.models.layers import Embedding, Linear
from shared.worker.native.abi import (
    MAT_Q4V,
    MAT_W8A8,
    MAX_GROUP,
    Dims,
    Layer,
    Mat,
    Scratch,
    StepIO,
    addr,
    with_bias,
)
from shared.worker.quant.formats import Dense, WeightFormat
from shared.worker.quant.linear import QuantLinear

if TYPE_CHECKING:
    from shared.worker.models.llama import LlamaForCausalLM
    from shared.worker.native.build import NativeKernels

logger = logging.getLogger(__name__)

KV_DTYPES = (torch.float32, torch.bfloat16)
ROPE_TABLE_BYTES = 64 << 20     # longer contexts compute their cos/sin per step


def _linear_mat(module: torch.nn.Module, rows: int) -> Mat | None:
    """The C view of the weight ``module`` multiplies ``rows`` rows with, bias included."""
    fmt: WeightFormat
    if isinstance(module, QuantLinear):
        fmt, bias = module.formats[module.dispatch.format_for(rows)], module.bias
    elif isinstance(module, Linear):
        fmt, bias = Dense(module.weight.detach()), module.bias
    else:
        return None
    m = fmt.native_mat()
    if m is None or (bias is not None and bias.dtype != torch.float32):
        return None
    return with_bias(m, None if bias is None else bias.detach())


def unsupported_reason(model: LlamaForCausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> str | None:
    """Why the fused step cannot run this model (None: it can)."""
    a = model.arch
    if type(model.embed_tokens) is not Embedding:
        return "the embedding is sharded (tensor parallelism)"
    if model.embed_tokens.weight.dtype != torch.float32:
        return f"the model runs in {model.embed_tokens.weight.dtype} (the fused step is float32)"
    if any(k.dtype not in KV_DTYPES or not k.is_contiguous() for k, _ in kv_caches):
        return "the KV cache is not contiguous float32 or bfloat16"
    if not native_supports(a.num_attention_heads, a.num_key_value_heads, a.head_dim,
                           kv_caches[0][0].dtype):
        return f"{a.num_attention_heads} heads / {a.num_key_value_heads} KV heads of {a.head_dim}"
    return None


class FusedDecode:
    """Runs steps through ``decode.c`` (see the module docstring for which)."""

    def __init__(self, model: LlamaForCausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 native: NativeKernels, num_threads: int, max_tokens: int = 0,
                 max_positions: int = 0) -> None:
        a = model.arch
        self.model, self.native, self.num_threads = model, native, num_threads
        self.kv_caches = kv_caches      # kept alive: the C structs hold their pointers
        self.dims = Dims(a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim,
                         a.intermediate_size, a.num_hidden_layers, a.rms_norm_eps, a.head_dim ** -0.5)
        self.takes_prompts = max_tokens > 0
        self.capacity = max(native.max_rows, max_tokens)
        self._rows = torch.arange(self.capacity, dtype=torch.int32)
        self._rows64 = self._rows.long()
        self._layers: dict[tuple, ctypes.Array[Layer] | None] = {}     # by the formats rows take
        self._by_rows: dict[int, ctypes.Array[Layer] | None] = {}
        self._scratch, self._scratch_struct = self._alloc_scratch(num_threads)
        self._rope = self._rope_table(max_positions)
        self._io = StepIO(embed=model.embed_tokens.weight.data_ptr(),
                          final_norm=model.norm.weight.data_ptr())

    def _rope_table(self, positions: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """cos/sin of every position below ``positions`` (the longest context), once; None
        where they depend on the sequence (dynamic NTK) or would take too much memory."""
        rotary = self.model.rotary
        if rotary.is_dynamic or not 0 < positions * rotary.head_dim * 8 <= ROPE_TABLE_BYTES:
            return None
        cos, sin = rotary.cos_sin(torch.arange(positions), None, torch.float32)
        return cos.contiguous(), sin.contiguous()

    def _alloc_scratch(self, num_threads: int) -> tuple[list[torch.Tensor], Scratch]:
        a, r = self.model.arch, self.capacity
        h, kvh, d = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        capacity = 8 * num_threads      # partial attention results (attention.c's split)
        split = capacity * ((h // kvh) * d + 2 * MAX_GROUP)
        x_rows = max(r, num_threads * self.native.max_rows)     # decode.c's rmsnorm_step
        sizes = [(h + 2 * kvh) * d, h * d, h * d, 2 * a.intermediate_size, a.intermediate_size]
        bufs = ([torch.empty(x_rows * a.hidden_size)] + [torch.empty(r * n) for n in sizes]
                + [torch.empty(split)])
        return bufs, Scratch(*(b.data_ptr() for b in bufs), capacity, r)

    def layers_for(self, rows: int) -> ctypes.Array[Layer] | None:
        """The C description of every layer with the weight formats ``rows`` dispatches to."""
        if rows in self._by_rows:
            return self._by_rows[rows]
        attn, mlp = self.model.layers[0].self_attn, self.model.layers[0].mlp
        key = tuple(m.dispatch.format_for(rows) if isinstance(m, QuantLinear) else None
                    for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj))
        if key not in self._layers:
            self._layers[key] = self._build_layers(rows)
        self._by_rows[rows] = self._layers[key]
        return self._layers[key]

    def _build_layers(self, rows: int) -> ctypes.Array[Layer] | None:
        out = (Layer * len(self.model.layers))()
        for i, (layer, (k, v)) in enumerate(zip(self.model.layers, self.kv_caches, strict=True)):
            attn, mlp = layer.self_attn, layer.mlp
            mats = [_linear_mat(m, rows) for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj,
                                                   mlp.down_proj)]
            if any(m is None for m in mats):
                return None
            norms = [layer.input_layernorm, layer.post_attention_layernorm, attn.q_norm, attn.k_norm]
            out[i] = Layer(*(None if n is None else addr(n.weight) for n in norms), *mats,
                           k.data_ptr(), v.data_ptr(), int(k.dtype == torch.bfloat16))
        return out

    def can_run(self, meta: AttentionMetadata) -> bool:
        tokens = meta.num_tokens
        if tokens > self.capacity or not (self.takes_prompts
                                          or all(q == 1 for q in meta.query_lens_list)):
            return False
        layers = self.layers_for(tokens)
        if layers is None:
            return False
        # Above max_rows only the int8-activation kernels have decode.c's shared rounding.
        return tokens <= self.native.max_rows or all(
            m.kind in (MAT_W8A8, MAT_Q4V) for m in (layers[0].qkv, layers[0].o, layers[0].gate_up,
                                                    layers[0].down))

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            meta: AttentionMetadata) -> torch.Tensor:
        """The final-normed hidden states [tokens, hidden], as the eager model returns them.

        ``positions`` are below the ``max_positions`` the tables were built for (the runner's
        max_model_len, which the scheduler holds every sequence to)."""
        model, rows, io = self.model, meta.num_tokens, self._io
        h = torch.empty(rows, self.dims.hidden)        # decode.c fills it from the embedding
        if self._rope is not None:
            (cos, sin), rope_row = self._rope, positions
        else:
            cos, sin = model.rotary.cos_sin(positions, model.token_seq_lens(meta), torch.float32)
            cos, sin, rope_row = cos.contiguous(), sin.contiguous(), self._rows64
        if rows == meta.num_seqs:       # one token a sequence: row i is sequence i
            table_row, ctx = self._rows, meta.seq_lens
        else:                           # each token its sequence's table and position + 1 keys
            table_row = torch.repeat_interleave(self._rows[:meta.num_seqs],
                                                torch.tensor(meta.query_lens_list))
            ctx = (positions + 1).to(torch.int32)
        tables = meta.block_tables      # tensors from prepare_inputs: contiguous
        io.h, io.rows, io.ids, io.rope_row = h.data_ptr(), rows, input_ids.data_ptr(), rope_row.data_ptr()
        io.cos, io.sin, io.slots = cos.data_ptr(), sin.data_ptr(), meta.slot_mapping.data_ptr()
        io.tables, io.max_blocks, io.block_size = tables.data_ptr(), tables.shape[1], meta.block_size
        io.table_row, io.ctx = table_row.data_ptr(), ctx.data_ptr()
        rc = self.native.decode_forward(
            ctypes.addressof(self.dims), ctypes.addressof(self.layers_for(rows)),
            ctypes.addressof(io), ctypes.addressof(self._scratch_struct), self.num_threads)
        if rc != 0:
            raise RuntimeError(f"decode_forward refused {rows} rows")
        return h
