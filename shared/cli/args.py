"""CLI flags generated from the config dataclasses, so there is one configuration path."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any

# Flag names that differ from the field name (issue-facing spellings).
RENAMES = {"kv_cache_size_gb": "kv-cache-size"}
HELP = {
    "model": "HF-format folder or GGUF file (default: SmolLM2-135M-Instruct, fetched from PyPI)",
    "dtype": "auto | float32 | bfloat16 (auto: bfloat16)",
    "quantization": "none | int8 | int4 | w8a8 | auto: linear-layer weight format (auto: per "
                    "step, the format measured fastest on this machine for the batch size; "
                    "CUDA: none)",
    "max_model_len": "context window in tokens (default: the model's)",
    "num_threads": "torch intra-op threads",
    "num_blocks": "KV cache blocks (overrides --kv-cache-size)",
    "kv_cache_size_gb": "KV cache size in GiB",
    "enable_prefix_caching": "reuse KV blocks of shared prompt prefixes",
    "kv_cache_dtype": "auto | float32 | bfloat16: element type of the KV cache (auto: the "
                      "model's dtype)",
    "max_num_seqs": "most sequences per engine step",
    "max_num_batched_tokens": "token budget of one engine step",
    "long_prefill_token_threshold": "most tokens of one prompt computed per step (0: the whole "
                                    "budget); smaller keeps decodes steady while long prompts fill",
    "prefill_step_ratio": "while requests decode, cap a step's prompt tokens so the step takes at "
                          "most about this many times a decode-only step, learnt from the "
                          "engine's step times (0: off, prompts get the whole budget)",
    "prefill_pace_threshold": "with --prefill-step-ratio, requests of at most this many tokens "
                              "fill whole, outside the cap; longer ones are paced (0: all)",
    "scheduling_policy": "fcfs | priority: priority admits waiting requests by (priority, arrival) "
                         "and preempts the lowest-priority, newest running one first; fcfs "
                         "refuses a request priority other than 0",
    "engine": "v0: one process, one loop; v1: API process + engine-core process over ZMQ",
    "api_key": "require 'Authorization: Bearer KEY' on /v1/* (env: TWINSERVE_API_KEY)",
    "max_waiting_requests": "queued requests beyond this get HTTP 429",
    "max_body_bytes": "request bodies larger than this get HTTP 413",
    "responses_store_size": "most /v1/responses kept in memory (store: true) for GET "
                            "/v1/responses/{id} and previous_response_id; 0: store is refused",
    "allowed_origins": "CORS: origins allowed, comma-separated or a JSON list ('*': any); "
                       "unset: no CORS headers",
    "allowed_methods": "CORS: methods allowed (with --allowed-origins)",
    "allowed_headers": "CORS: request headers allowed (with --allowed-origins)",
    "allow_credentials": "CORS: allow credentials (with --allowed-origins)",
    "enable_debug_endpoints": "serve /debug/stats and /debug/lifecycle and honour the "
                              "X-Twinserve-Trace header (off: 404, header ignored)",
    "engine_step_timeout": "seconds the engine may go without progress while requests are in "
                           "flight before it is declared dead (vLLM's engine iteration timeout)",
    "keep_alive_on_engine_death": "after the engine dies, keep answering 503 instead of exiting "
                                  "non-zero (for a supervisor to restart the server)",
    "timeout_header": "seconds a client has to send a request's headers; then the connection is closed",
    "timeout_body": "seconds a client has to send a request's body; then 408",
    "timeout_keep_alive": "seconds an idle keep-alive connection stays open",
    "max_header_bytes": "largest request header block accepted (larger: 400)",
    "limit_concurrency": "open connections served at once (past it: 503)",
    "generation_config": "sampling defaults for fields a request omits: auto (the model's "
                         "generation_config.json), none (OpenAI's defaults) or a folder with one",
    "trace": "record the lifecycle of every request (per request: header 'X-Twinserve-Trace: 1')",
    "trace_decode": "traces keep every decode step instead of summarising them (header value: all)",
    "metrics_prefix": "twinserve | vllm: prefix of the /metrics series; vllm publishes them as "
                      "vllm:* (with vLLM's deprecated aliases) for vLLM's Grafana dashboard",
    "debug_fail_after_steps": "testing only: make the forward pass raise after N steps",
    "debug_fail_request_seed": "testing only: a request with this seed fails in the core (alone)",
    "debug_hang_after_steps": "testing only: make the forward pass hang after N steps",
    "attention_backend": "auto | native | torch | triton (auto: Triton kernels on CUDA, the native "
                         "C kernels on CPU, torch where neither is available)",
    "gpu_memory_utilization": "CUDA: share of free GPU memory for weights + KV cache when "
                              "--num-blocks is not given",
    "data_parallel_size": "v1: engine-core processes behind the API server, each with its own "
                          "scheduler, KV cache and model copy; requests are routed by load",
    "data_parallel_prefix_affinity": "v1, data parallel: route a prompt that shares its first "
                                     "blocks with a recent one to that request's core",
    "tensor_parallel_size": "worker processes that split each layer's attention heads and MLP "
                            "(torch.distributed: gloo on CPU, NCCL on CUDA); rendezvous on "
                            "MASTER_ADDR:MASTER_PORT (default 127.0.0.1, a free port)",
    "tensor_parallel_local_size": "tensor parallel across nodes: ranks this node starts, rank 0 "
                                  "included (0: all); the others run python -m "
                                  "shared.worker.distributed.worker on their nodes",
    "tensor_parallel_shared_memory": "tensor parallel on one CPU node: all-reduce through shared "
                                     "memory (off: gloo over loopback TCP, ~100x slower here)",
    "debug_fail_tp_rank": "testing only: this tensor-parallel worker rank fails at start-up",
    "grammar_cache_size": "structured outputs: compiled grammars kept in memory (LRU)",
    "malloc_keep_freed": "CPU: keep freed tensor memory in the engine process (glibc's mmap "
                         "and trim thresholds raised) instead of page-faulting it in every step",
    "enforce_eager": "run decode steps op by op: no CUDA graph replay (CUDA), no fused native "
                     "decode step (CPU)",
}


def flag_name(field_name: str) -> str:
    return "--" + RENAMES.get(field_name, field_name.replace("_", "-"))


def _parse_type(type_str: str) -> type | None:
    for name, typ in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if type_str.startswith(name):
            return typ
    return None


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    group = parser.add_argument_group(cls.__name__)
    for f in dataclasses.fields(cls):
        typ = _parse_type(str(f.type))
        if f.name in skip or typ is None:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        kwargs: dict[str, Any] = {"dest": f"{cls.__name__}.{f.name}", "default": default,
                                  "help": f"{HELP.get(f.name, '')} (default: {default})"}
        if typ is not bool:
            kwargs["metavar"] = f.name.upper()
        if typ is bool:
            group.add_argument(flag_name(f.name), action=argparse.BooleanOptionalAction, **kwargs)
        else:
            group.add_argument(flag_name(f.name), type=typ, **kwargs)


def build_dataclass(cls: type, ns: argparse.Namespace) -> Any:
    prefix = f"{cls.__name__}."
    values = {k[len(prefix):]: v for k, v in vars(ns).items() if k.startswith(prefix)}
    return cls(**values)
