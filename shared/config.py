"""The one configuration path: dataclasses here, CLI flags mapped onto them (see cli.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

QUANTIZATION_MODES = ("none", "int8", "int4", "w8a8", "auto")
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16")
SCHEDULING_POLICIES = ("fcfs", "priority")
METRICS_PREFIXES = ("twinserve", "vllm")


@dataclass
class ModelConfig:
    model: str | None = None          # None: the default SmolLM2-135M-Instruct
    dtype: str = "auto"               # auto | float32 | bfloat16
    # Weight format of the linear layers: none (the float weights: today's exact path) | int8 |
    # int4 (weight-only) | w8a8 | auto (per step, the format measured fastest for its size).
    quantization: str = "auto"
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    seed: int = 0
    num_threads: int | None = None    # torch intra-op threads; None keeps torch's default
    device: str = "cpu"
    attention_backend: str = "auto"   # auto (triton on CUDA, native on CPU) | native | torch | triton
    gpu_memory_utilization: float = 0.9   # CUDA: share of free GPU memory for model + KV cache
    enforce_eager: bool = False       # no decode CUDA graphs (CUDA), no fused native decode step (CPU)
    # CPU: glibc keeps freed tensor memory for the next step (shared/worker/host_malloc.py).
    malloc_keep_freed: bool = True
    # Testing only: the forward pass raises after this many steps (0: never), so tests can
    # check that a dying engine fails requests cleanly in both topologies.
    debug_fail_after_steps: int = 0
    debug_hang_after_steps: int = 0   # testing only: the forward pass never returns after N steps

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, not {self.dtype!r}")
        if self.quantization not in QUANTIZATION_MODES:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_MODES)}, "
                             f"not {self.quantization!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError("max_model_len must be >= 1")
        if self.attention_backend not in ("auto", "native", "torch", "triton"):
            raise ValueError(f"attention_backend must be auto, native, torch or triton, "
                             f"not {self.attention_backend!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")


@dataclass
class CacheConfig:
    block_size: int = 16
    num_blocks: int | None = None     # None: derived from kv_cache_size_gb
    kv_cache_size_gb: float = 0.5
    enable_prefix_caching: bool = True
    # auto | float32 | bfloat16 (see policy.resolve_kv_dtype for what auto picks).
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        if self.kv_cache_size_gb <= 0:
            raise ValueError("kv_cache_size_gb must be > 0")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                             f"not {self.kv_cache_dtype!r}")


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    # Most tokens of one prompt computed per step (0: up to the whole budget): a long prompt
    # then fills in several steps while running requests keep decoding at a steady pace.
    long_prefill_token_threshold: int = 0
    # While requests decode, prompt tokens per step are capped so that a step takes at most
    # about this many times a decode-only step, from the engine's own step times (0: off;
    # off by default: on the AMX Xeon it cost W1 11-20% of its throughput, README).
    prefill_step_ratio: float = 0.0
    # Requests of at most this many tokens fill whole, outside the pacer's cap (0: every
    # prompt is paced): only long prompts are cut to protect the streams.
    prefill_pace_threshold: int = 0
    scheduling_policy: str = "fcfs"   # fcfs | priority (lower request priority runs first)
    debug_fail_request_seed: int | None = None  # testing only: requests with this seed fail

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0")
        if self.prefill_step_ratio != 0 and self.prefill_step_ratio <= 1:
            raise ValueError("prefill_step_ratio must be 0 (off) or > 1")
        if self.prefill_pace_threshold < 0:
            raise ValueError("prefill_pace_threshold must be >= 0")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be fcfs or priority, not {self.scheduling_policy!r}")


@dataclass
class StructuredOutputsConfig:
    grammar_cache_size: int = 128     # compiled grammars kept (LRU by the grammar's hash)

    def __post_init__(self) -> None:
        if self.grammar_cache_size < 1:
            raise ValueError("grammar_cache_size must be >= 1")


@dataclass
class ParallelConfig:
    # v1 only: engine-core processes behind one API server, each with its own scheduler,
    # KV cache and model copy.
    data_parallel_size: int = 1
    # Data parallel: send a request whose prompt starts like a recent one to the same core
    # (its prefix cache), unless that core is busier than the least-loaded by a margin.
    data_parallel_prefix_affinity: bool = True
    # Worker processes that split each layer's heads and MLP (torch.distributed).
    tensor_parallel_size: int = 1
    # Ranks started on this node, rank 0 included (0: all of them); the rest join from other
    # nodes through MASTER_ADDR/MASTER_PORT (docs/TENSOR_PARALLEL.md).
    tensor_parallel_local_size: int = 0
    # All ranks on one CPU node: collectives through shared memory, not gloo's TCP loopback.
    tensor_parallel_shared_memory: bool = True
    debug_fail_tp_rank: int = 0     # testing only: this worker rank raises during start-up

    def __post_init__(self) -> None:
        if self.data_parallel_size < 1 or self.tensor_parallel_size < 1:
            raise ValueError("data_parallel_size and tensor_parallel_size must be >= 1")
        if not 0 <= self.tensor_parallel_local_size <= self.tensor_parallel_size:
            raise ValueError("tensor_parallel_local_size must be between 0 and "
                             "tensor_parallel_size")


@dataclass
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    structured_outputs: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)


@dataclass
class ServerConfig:
    engine: str = "v1"                # v0 | v1
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None        # also read from TWINSERVE_API_KEY
    served_model_name: str | None = None
    max_waiting_requests: int = 256
    max_body_bytes: int = 1 << 20
    # Slow and idle clients (a normal client never meets these): seconds to send the request
    # headers (then the connection is closed) and the body (408), idle keep-alive seconds,
    # the header block's size (400 past it) and open connections (503 past it).
    timeout_header: float = 10.0
    timeout_body: float = 30.0
    timeout_keep_alive: float = 5.0
    max_header_bytes: int = 16 << 10
    limit_concurrency: int = 1024
    max_stop_strings: int = 16
    max_logprobs: int = 20
    max_n: int = 16
    generation_config: str = "auto"   # auto (the model's generation_config.json) | none | a folder
    responses_store_size: int = 100   # /v1/responses kept for GET and previous_response_id
    allowed_origins: str | None = None    # CORS, comma-separated or a JSON list; None: CORS off
    allowed_methods: str = "*"
    allowed_headers: str = "*"
    allow_credentials: bool = False
    trace: bool = False               # trace every request's lifecycle (/debug/lifecycle)
    # /debug/* and the X-Twinserve-Trace header: off by default, since traces hold other
    # clients' text and /debug/stats names pids and the IPC folder. --trace implies it.
    enable_debug_endpoints: bool = False
    engine_step_timeout: float = 60.0     # seconds without progress, requests in flight: dead
    keep_alive_on_engine_death: bool = False  # else exit non-zero a few seconds after it dies
    trace_decode: bool = False        # traces keep every decode step instead of a summary
    metrics_prefix: str = "twinserve"  # twinserve | vllm: the name prefix of /metrics series

    @property
    def debug_enabled(self) -> bool:
        return self.enable_debug_endpoints or self.trace or self.trace_decode

    def __post_init__(self) -> None:
        if self.engine not in ("v0", "v1"):
            raise ValueError(f"engine must be v0 or v1, not {self.engine!r}")
        for name in ("timeout_header", "timeout_body", "timeout_keep_alive"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.max_header_bytes < 1024 or self.limit_concurrency < 1:
            raise ValueError("max_header_bytes must be >= 1024 and limit_concurrency >= 1")
        if not self.engine_step_timeout > 0:
            raise ValueError("engine_step_timeout must be > 0")
        if self.metrics_prefix not in METRICS_PREFIXES:
            raise ValueError(f"metrics_prefix must be twinserve or vllm, not {self.metrics_prefix!r}")
        if not 0 <= self.port < 65536:
            raise ValueError("port must be in [0, 65535]")
