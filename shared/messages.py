"""Typed messages both engines use: v0 passes these objects, v1 encodes them with msgpack.

Everything that crosses the v1 process boundary is declared here (never pickle).
"""
from __future__ import annotations

import math

import msgspec

from shared.errors import ParamError
from shared.trace.tracer import TraceEvent

# Below this, logits / temperature overflows to inf/NaN: treat as greedy (vLLM's bound).
GREEDY_EPSILON = 1e-5


class StructuredOutputsParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the output must match: exactly one of these (vLLM's ``structured_outputs``).

    ``json`` is a JSON schema as text, ``json_object`` any JSON object, ``regex`` a regular
    expression (Rust regex syntax), ``choice`` one of the strings, ``grammar`` GBNF (llama.cpp's
    dialect) or Lark.
    """

    json: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None]
        given += ["json_object"] if self.json_object else []
        _check(len(given) == 1, "structured_outputs",
               "structured_outputs needs exactly one of json, json_object, regex, choice, grammar"
               + (f"; got {', '.join(given)}" if given else ""))
        _check(self.choice is None or (len(self.choice) > 0 and all(self.choice)),
               "structured_outputs.choice", "choice must be a non-empty list of non-empty strings")


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How one request is decoded. Field names follow vLLM's SamplingParams."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                     # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16        # None: up to the context length
    min_tokens: int = 0
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None        # top alternatives per token; 0: the sampled token only
    prompt_logprobs: int | None = None  # the same for every prompt token (the first has none)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logit_bias: dict[int, float] = {}   # token id -> added to its logit before sampling
    structured_outputs: StructuredOutputsParams | None = None   # constrained decoding

    def __post_init__(self) -> None:
        _check(self.n >= 1, "n", "n must be at least 1")
        _check(math.isfinite(self.temperature) and self.temperature >= 0,
               "temperature", "temperature must be a finite number >= 0")
        _check(math.isfinite(self.top_p) and 0 < self.top_p <= 1, "top_p", "top_p must be in (0, 1]")
        _check(self.top_k >= -1, "top_k", "top_k must be -1 (disabled), 0 (disabled) or positive")
        _check(math.isfinite(self.min_p) and 0 <= self.min_p <= 1, "min_p", "min_p must be in [0, 1]")
        _check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "max_tokens must be at least 1")
        _check(self.min_tokens >= 0, "min_tokens", "min_tokens must be >= 0")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens,
               "min_tokens", "min_tokens must not exceed max_tokens")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            _check(math.isfinite(v) and -2 <= v <= 2, name, f"{name} must be in [-2, 2]")
        _check(math.isfinite(self.repetition_penalty) and 0 < self.repetition_penalty <= 10,
               "repetition_penalty", "repetition_penalty must be in (0, 10]")
        _check(self.logprobs is None or self.logprobs >= 0, "logprobs", "logprobs must be >= 0")
        _check(self.prompt_logprobs is None or self.prompt_logprobs >= 0, "prompt_logprobs",
               "prompt_logprobs must be >= 0")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "stop strings must be non-empty")
        _check(all(t >= 0 for t in self.stop_token_ids), "stop_token_ids", "stop_token_ids must be >= 0")
        _check(len(self.logit_bias) <= 300 and all(
            t >= 0 and math.isfinite(v) and -100 <= v <= 100 for t, v in self.logit_bias.items()),
            "logit_bias", "logit_bias: at most 300 token ids >= 0, biases in [-100, 100]")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPSILON

    def for_child(self, index: int) -> SamplingParams:
        """Params of choice ``index`` when n > 1 fans out into n sequences (seed + index)."""
        seed = None if self.seed is None else self.seed + index
        return msgspec.structs.replace(self, n=1, seed=seed)


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise ParamError(message, param=param)


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True):
    """A tokenized request handed to the engine core (lifecycle step 4)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float
    trace: bool = False
    trace_decode: bool = False      # trace every decode step instead of summarising them
    priority: int = 0               # lower runs first (--scheduling-policy priority)
    # n > 1: the id of the request with the same prompt that prefills it for this one; the
    # core admits this request once that prompt is computed and forks its KV (one prefill).
    prefill_leader: str | None = None


class TokenLogprobs(msgspec.Struct, array_like=True):
    """The sampled token's logprob and rank, plus the top-N alternatives."""

    token_id: int
    logprob: float
    rank: int
    top_ids: list[int]
    top_logprobs: list[float]


class RequestTimes(msgspec.Struct, array_like=True):
    """Intervals the core measures on its own monotonic clock, sent with the first token (the
    API process cannot see when a request was queued or first scheduled)."""

    queued: float       # added to the scheduler -> first scheduled (a resume does not count)
    prefill: float      # first scheduled -> first token sampled


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """New tokens of one request from one engine step."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None   # stop | length | abort
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    # With the first output token: one entry per prompt token, None for the first.
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    # This request failed in the core (finish_reason "abort"); the others go on.
    error: str | None = None
    times: RequestTimes | None = None   # with the first output token only


class SchedulerStats(msgspec.Struct, array_like=True):
    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_total_blocks: int
    kv_cache_usage: float               # share of blocks held by live requests
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    num_tracked: int = 0                # requests the scheduler holds state for (leak check)
    num_forked_tokens: int = 0          # prompt tokens n > 1 siblings took from their leader


class StepTimes(msgspec.Struct, array_like=True):
    """Wall time of one engine step's phases, in seconds."""

    schedule: float = 0.0
    prepare: float = 0.0
    forward: float = 0.0
    sample: float = 0.0
    update: float = 0.0
    num_tokens: int = 0
    num_seqs: int = 0


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True):
    outputs: list[EngineCoreOutput]
    timestamp: float
    stats: SchedulerStats | None = None
    step: StepTimes | None = None
    # Which engine core sent these (data parallel: --data-parallel-size); 0 with one core.
    engine_index: int = 0
    # Lifecycle events of traced requests recorded in the core (steps 5-11); None when no
    # request is traced, which costs one nil byte per frame (array_like keeps trailing fields).
    trace_events: list[TraceEvent] | None = None


class ModelInfo(msgspec.Struct):
    """What the front end needs to know about the loaded model and cache (v1: the READY frame)."""

    name: str
    path: str
    max_model_len: int
    vocab_size: int
    num_kv_blocks: int
    block_size: int
