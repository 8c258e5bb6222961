"""Turns a SchedulerOutput into tensors, runs the model and samples (lifecycle steps 8-11).

The three phases are separate methods so v0 can await the forward pass in a worker thread
while preparing and sampling on its event loop; ``EngineCore.step`` runs all three in a row.
"""
from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from shared.config import EngineConfig, ModelConfig
from shared.core.request import Request
from shared.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from shared.messages import TokenLogprobs
from shared.worker.attention.metadata import AttentionMetadata
from shared.worker.attention.native_backend import NativeAttention
from shared.worker.attention.native_backend import supports as native_supports
from shared.worker.cuda_graphs import DecodeGraphs
from shared.worker.distributed.group import TensorParallelGroup
from shared.worker.distributed.launch import start_tensor_parallel, wait_loaded
from shared.worker.host_malloc import keep_freed_memory
from shared.worker.model_fetch import cache_dir
from shared.worker.model_loader import (
    activation_reserve_bytes,
    allocate_kv_caches,
    checkpoint_files,
    kv_bytes_per_block,
    load_model,
)
from shared.worker.models.arch_config import ArchConfig
from shared.worker.native.build import load_native
from shared.worker.native.decode import FusedDecode, unsupported_reason
from shared.worker.prompt_logprobs import PromptRows, score_prompts
from shared.worker.quant.policy import apply_quantization, resolve_dtype, resolve_kv_dtype
from shared.worker.sampler import Sampler
from shared.worker.step_inputs import StepArrays, encode_step, flatten_step

logger = logging.getLogger(__name__)


@dataclass
class ModelInput:
    input_ids: torch.Tensor         # [num_tokens] int64
    positions: torch.Tensor         # [num_tokens] int64
    attn_metadata: AttentionMetadata
    logits_indices: torch.Tensor    # [num_sampling] rows of hidden states to turn into logits
    sampling_requests: list[Request]
    prompt_rows: list[PromptRows] = field(default_factory=list)    # prompt_logprobs asked
    arrays: StepArrays | None = None    # what tensor-parallel rank 0 broadcasts
    # Filled by ``forward`` from the hidden states it alone sees; read by ``sample``.
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)


def resolve_attention_backend(name: str, device: torch.device, has_native: bool = False) -> str:
    """auto: Triton kernels on CUDA (when Triton is installed), the native kernels on CPU (when
    they built), torch everywhere else."""
    has_triton = importlib.util.find_spec("triton") is not None
    if name == "native" and not has_native:
        raise ValueError("attention_backend native needs the native CPU kernels (a C compiler, "
                         "a CPU device, TWINSERVE_NATIVE not 0)")
    if name == "auto":
        if device.type == "cuda" and not has_triton:
            logger.warning("Triton is not installed: using the torch attention backend on CUDA")
        if device.type == "cuda":
            return "triton" if has_triton else "torch"
        return "native" if has_native else "torch"
    if name == "triton" and not has_triton:
        raise ValueError("attention_backend triton needs Triton: pip install triton")
    if name == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("attention_backend triton needs a CUDA device (or TRITON_INTERPRET=1)")
    return name


class ModelRunner:
    """Owns the model, the paged KV cache tensors and the sampler."""

    def __init__(self, config: EngineConfig, model_path: Path,
                 tp_worker: TensorParallelGroup | None = None) -> None:
        """``tp_worker``: this process is that tensor-parallel rank (> 0), started by rank 0;
        without it and with ``tensor_parallel_size`` > 1, this is rank 0 and starts the others."""
        self.tp, self.launcher = tp_worker, None
        try:
            self._setup(config, model_path)
        except BaseException:
            if self.launcher is not None:   # rank 0: take the workers down with it
                self.launcher.stop(timeout_s=0)
                self.tp.close()
            raise

    def _setup(self, config: EngineConfig, model_path: Path) -> None:
        mc = config.model
        if mc.num_threads:
            torch.set_num_threads(mc.num_threads)
        torch.manual_seed(mc.seed)
        self.device = torch.device(mc.device)
        self.malloc_tuned = (mc.malloc_keep_freed and self.device.type == "cpu"
                             and keep_freed_memory())
        tuning = cache_dir() / "tuning"
        # Native kernels serve small CPU batches (pure torch without them); they decide the dtype.
        self.native = load_native(cache_dir() / "native") if self.device.type == "cpu" else None
        sharded = config.parallel.tensor_parallel_size > 1     # no fused decode step: torch's rule
        self.dtype = resolve_dtype(mc.dtype, self.device, ArchConfig.from_folder(model_path), tuning,
                                   native=self.native is not None and not sharded)
        is_cuda = self.device.type == "cuda"
        if sharded and self.tp is None:
            self.launcher, self.tp = start_tensor_parallel(config, model_path, self.dtype, self.device)
        free_before = torch.cuda.mem_get_info(self.device)[0] if is_cuda else 0
        self.model = load_model(model_path, dtype=self.dtype, device=mc.device, tp=self.tp)
        if self.tp is not None:
            wait_loaded(self.tp, self.launcher)
        self.arch = self.model.arch
        self.quantization = None if sharded else apply_quantization(
            self.model, mc.quantization, self.dtype, self.device, tuning, self.native,
            weights_cache=(cache_dir() / "quantized", checkpoint_files(model_path)))
        self.attention_backend = resolve_attention_backend(mc.attention_backend, self.device,
                                                           self.native is not None)
        self.max_model_len = min(mc.max_model_len or self.arch.max_position_embeddings,
                                 self.arch.max_position_embeddings)
        self.kv_dtype = resolve_kv_dtype(config.cache.kv_cache_dtype, self.dtype,
                                         self.attention_backend, self._fast_bf16_cache(mc))
        self.block_size = config.cache.block_size
        if config.cache.num_blocks:
            self.num_blocks = config.cache.num_blocks
        elif is_cuda:
            self.num_blocks = self._blocks_from_gpu_memory(config, free_before)
        else:
            self.num_blocks = self._blocks_from_size(config.cache.kv_cache_size_gb)
        if self.tp is not None:     # every rank's cache holds the same block ids
            self.num_blocks = self.tp.min_int(self.num_blocks)
        # Graphs need a triton plan (capture-safe) and a static RoPE; dynamic NTK reads lengths.
        use_graphs = (is_cuda and not mc.enforce_eager and self.attention_backend == "triton"
                      and not self.model.rotary.is_dynamic and not sharded)
        # With graphs, one block past the scheduler's num_blocks is the padding rows' scratch block.
        self.kv_caches = allocate_kv_caches(self.arch, self.num_blocks + int(use_graphs),
                                            self.block_size, self.kv_dtype, mc.device)
        self._set_attention_backend(explicit=mc.attention_backend != "auto")
        self.graphs = self._capture_graphs(config) if use_graphs else None
        self.fused = None if sharded else self._fused_decode(config)
        self.attention_fn: Callable[..., object] = self.model.attn_backend.forward
        self.sampler = Sampler()
        quant = "float weights" if self.quantization is None else self.quantization.describe()
        logger.info("model runner: %s %s (%s), %s attention, %d KV blocks of %s, CUDA graphs "
                    "%s, fused decode %s, malloc keeps freed memory %s", self.device, self.dtype,
                    quant, self.attention_backend, self.num_blocks, self.kv_dtype,
                    *("on" if x else "off" for x in (use_graphs, self.fused, self.malloc_tuned)))

    def _fused_decode(self, config: EngineConfig) -> FusedDecode | None:
        """The native step for CPU batches, when this model and dtype allow it."""
        if self.native is None or config.model.enforce_eager or self.attention_backend != "native":
            return None
        if (reason := unsupported_reason(self.model, self.kv_caches)) is not None:
            logger.info("fused decode step off: %s", reason)
            return None
        # Prompts and chunks too where the weights are quantized; float weights keep them on
        # the eager model (the exact path).
        max_tokens = config.scheduler.max_num_batched_tokens if self.quantization is not None else 0
        return FusedDecode(self.model, self.kv_caches, self.native, torch.get_num_threads(),
                           max_tokens, self.max_model_len)

    def _set_attention_backend(self, explicit: bool) -> None:
        a, name = self.arch, self.attention_backend
        shape = (a.num_attention_heads, a.num_key_value_heads, a.head_dim, a.head_dim ** -0.5)
        if name == "triton":
            from shared.worker.attention.triton_backend import TritonAttention

            self.model.set_attention_backend(TritonAttention(*shape))
        elif name == "native":
            if not native_supports(*shape[:3], self.kv_caches[0][0].dtype):
                why = f"the native kernel cannot hold {shape[:3]} (heads, KV heads, head dim)"
                if explicit:
                    raise ValueError(f"attention_backend native: {why}")
                logger.info("torch attention: %s", why)
                self.attention_backend = "torch"
                return
            self.model.set_attention_backend(
                NativeAttention(*shape, self.native, torch.get_num_threads()))

    def _blocks_from_gpu_memory(self, config: EngineConfig, free_before: int) -> int:
        """KV blocks from the GPU memory that was free before loading, times the utilisation,
        minus the weights and an activation reserve."""
        a = self.arch
        model_bytes = torch.cuda.memory_allocated(self.device)
        qkv = (a.num_attention_heads + 2 * a.num_key_value_heads) * a.head_dim
        reserve = activation_reserve_bytes(config, a.hidden_size, a.intermediate_size, a.vocab_size,
                                           qkv, self.dtype)
        budget = int(free_before * config.model.gpu_memory_utilization) - model_bytes - reserve
        per_block = kv_bytes_per_block(a, self.block_size, self.kv_dtype)
        if budget < per_block:
            raise RuntimeError(f"no GPU memory left for the KV cache: {free_before >> 20} MiB free, "
                               f"weights {model_bytes >> 20} MiB, reserve {reserve >> 20} MiB")
        logger.info("KV cache: %d blocks (%.2f GiB) from %.1f GiB free", budget // per_block,
                    budget / (1 << 30), free_before / (1 << 30))
        return budget // per_block

    def _capture_graphs(self, config: EngineConfig) -> DecodeGraphs:
        graphs = DecodeGraphs(self.model, self.kv_caches, config.scheduler.max_num_seqs,
                              self.max_model_len, self.block_size, scratch_block=self.num_blocks)
        graphs.capture()
        logger.info("captured decode CUDA graphs for batch sizes %s", graphs.sizes)
        return graphs

    def _fast_bf16_cache(self, mc: ModelConfig) -> bool:
        """Quantized weights on CPU whose native attention reads a bf16 cache of this shape at
        full speed (``none`` keeps the exact float path, the parity tests', whole)."""
        a = self.arch
        group = a.num_attention_heads // a.num_key_value_heads
        return (self.native is not None and mc.quantization != "none"
                and self.native.fast_bf16_attention(a.head_dim, group))

    def _blocks_from_size(self, size_gb: float) -> int:
        per_block = kv_bytes_per_block(self.arch, self.block_size, self.kv_dtype)
        return max(1, int(size_gb * (1 << 30)) // per_block)

    def prepare_inputs(self, sched: SchedulerOutput) -> ModelInput:
        """Flatten the scheduled chunks into one batch plus attention metadata."""
        # Preempted requests keep their seeded generators: a recompute must not replay draws.
        self.sampler.forget(sched.finished_ids)
        arrays, sampling = flatten_step(sched, self.block_size)
        return self.model_input(arrays, sampling)

    def model_input(self, a: StepArrays, sampling: list[Request]) -> ModelInput:
        """Device tensors for one step (and the step's block copies done): every rank runs this
        on the same arrays."""
        if a.block_copies:
            self.copy_blocks(a.block_copies)
        meta = AttentionMetadata(
            slot_mapping=self._to_device(a.slot_mapping),
            query_start_loc=self._to_device(a.query_start_loc),
            seq_lens=self._to_device(a.seq_lens),
            block_tables=self._to_device(a.block_tables),
            block_size=self.block_size,
            query_lens_list=a.query_lens,
            seq_lens_list=a.seq_lens.tolist(),
        )
        return ModelInput(
            input_ids=self._to_device(a.input_ids),
            positions=self._to_device(a.positions),
            attn_metadata=meta,
            logits_indices=self._to_device(a.logits_indices),
            sampling_requests=sampling,
            prompt_rows=a.prompt_rows,
            arrays=a,
        )

    @torch.inference_mode()
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """KV of block src -> block dst in every layer (a forked request's partial block)."""
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        for k, v in self.kv_caches:
            k.index_copy_(0, dst, k.index_select(0, src))
            v.index_copy_(0, dst, v.index_select(0, src))

    def _to_device(self, arr: np.ndarray) -> torch.Tensor:
        if self.device.type != "cuda":
            return torch.from_numpy(arr).to(self.device)
        # Pinned staging makes the copy asynchronous; torch's caching host allocator keeps each
        # pinned buffer until its copy has run, so reuse across steps is safe.
        return torch.from_numpy(arr).pin_memory().to(self.device, non_blocking=True)

    @torch.inference_mode()
    def forward(self, inp: ModelInput) -> torch.Tensor:
        """The model's forward pass; returns float32 logits of the sampling rows only."""
        if self.launcher is not None:   # rank 0: the other ranks run this step with it
            self.launcher.broadcast(self.tp, encode_step(inp.arrays))
        return self.forward_local(inp)

    @torch.inference_mode()
    def forward_local(self, inp: ModelInput) -> torch.Tensor:
        """This rank's part of the forward pass (all of it without tensor parallelism)."""
        self.attention_fn = self.model.attn_backend.forward     # what the trace names
        if self.graphs is not None and self.graphs.can_run(inp.attn_metadata):
            hidden = self.graphs.run(inp.input_ids, inp.positions, inp.attn_metadata)
        elif self.fused is not None and self.fused.can_run(inp.attn_metadata):
            hidden = self.fused.run(inp.input_ids, inp.positions, inp.attn_metadata)
            self.attention_fn = self.fused.run
        else:
            hidden = self.model(inp.input_ids, inp.positions, inp.attn_metadata, self.kv_caches)
        if inp.prompt_rows:
            inp.prompt_logprobs = score_prompts(hidden, inp.prompt_rows, self.model.compute_logits)
        if inp.logits_indices.numel() == 0:
            return hidden.new_empty((0, self.arch.vocab_size), dtype=torch.float32)
        return self.model.compute_logits(hidden[inp.logits_indices])

    @torch.inference_mode()
    def sample(self, inp: ModelInput, logits: torch.Tensor) -> ModelRunnerOutput:
        out = ModelRunnerOutput(prompt_logprobs=inp.prompt_logprobs)
        if not inp.sampling_requests:
            return out
        result = self.sampler.sample_safely(logits, inp.sampling_requests)
        for row, message in result.failed.items():
            out.failed[inp.sampling_requests[row].request_id] = message
        for req, tok, lp in zip(inp.sampling_requests, result.token_ids, result.logprobs):
            out.sampled_token_ids[req.request_id] = tok
            if lp is not None:
                out.logprobs[req.request_id] = lp
        return out

    def close(self) -> None:
        """Rank 0: tell the other tensor-parallel ranks to leave, and wait for them."""
        launcher, self.launcher = self.launcher, None
        if launcher is not None:
            launcher.broadcast_stop(self.tp)
