"""Validated request bodies -> token ids and SamplingParams (lifecycle steps 2-3).

Types and static bounds were checked while decoding (protocol.py's Structs); here come the
bounds that depend on the server config or the model (marked config_max there, so
/openapi.json states them too), rules across fields, the model name, the context window,
and prompt tokenization.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.api.errors import APIError
from shared.api.protocol import ChatCompletionRequest, CompletionRequest, _Common, to_builtins
from shared.api.structured import structured_spec
from shared.api.tools import ToolPlan, plan_tools
from shared.config import ServerConfig
from shared.errors import ParamError, RequestTooLongError
from shared.frontend.tokenizer import Tokenizer
from shared.messages import ModelInfo, SamplingParams
from shared.structured.grammar import validate
from shared.trace.steps import Step
from shared.trace.tracer import TraceHandle

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions


@dataclass
class Job:
    """One prompt to run n times."""

    prompt_ids: list[int]
    params: SamplingParams     # n == 1; fanout.py sets per-child seeds
    prompt_text: str | None = None
    priority: int = 0          # lower runs first (the core refuses != 0 under fcfs)


@dataclass
class Prepared:
    jobs: list[Job]
    n: int
    stream: bool
    include_usage: bool
    logprobs: int | None       # None: no logprobs in the response
    continuous_usage: bool = False      # stream_options.continuous_usage_stats
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs field (None: not asked)
    tools: ToolPlan | None = None       # chat with tools: how calls are made and parsed


def check_model(model: str | None, accepted: set[str]) -> None:
    if model is not None and model not in accepted:
        raise APIError(404, f"The model `{model}` does not exist.", "model", "model_not_found")


def prepare_chat(req: ChatCompletionRequest, tok: Tokenizer, info: ModelInfo,
                 cfg: ServerConfig, trace: TraceHandle | None = None,
                 defaults: dict[str, Any] | None = None) -> Prepared:
    if req.top_logprobs is not None and not req.logprobs:
        raise ParamError("top_logprobs requires logprobs to be true", param="top_logprobs")
    _check_max(req.top_logprobs, cfg.max_logprobs, "top_logprobs")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    plan = plan_tools(req)
    ids = render_chat(tok, to_builtins(req.messages), req.add_generation_prompt is not False, trace,
                      plan.tools if plan else None)
    _check_max(req.max_tokens, info.max_model_len, "max_tokens")
    _check_max(req.max_completion_tokens, info.max_model_len, "max_completion_tokens")
    if req.max_completion_tokens is not None:   # OpenAI's newer name wins
        max_tokens, param = req.max_completion_tokens, "max_completion_tokens"
    else:
        max_tokens, param = req.max_tokens, "max_tokens"
    defaults = defaults or {}
    limit = fit_context(len(ids), max_tokens, info.max_model_len, param, "messages",
                        defaults.get("max_tokens"))
    params = sampling_params(req, limit, logprobs, info, cfg, defaults)
    if plan is not None and plan.spec is not None:
        validate(plan.spec, "tools")
        params.structured_outputs = plan.spec
    prepared = _prepared(req, [Job(ids, params, priority=req.priority or 0)], logprobs, cfg)
    prepared.tools = plan
    return prepared


def prepare_completion(req: CompletionRequest, tok: Tokenizer, info: ModelInfo,
                       cfg: ServerConfig, trace: TraceHandle | None = None,
                       defaults: dict[str, Any] | None = None) -> Prepared:
    _check_max(req.logprobs, cfg.max_logprobs, "logprobs")
    _check_choices(req, cfg)
    jobs = []
    prompts = prompt_token_ids(req.prompt, tok, info.vocab_size)
    if trace is not None:
        trace.mark(Step.TOKENIZED, "tokenized",
                   {"prompts": len(prompts), "prompt_tokens": [len(p[0]) for p in prompts]},
                   where=prepare_completion)
    for ids, text in prompts:
        limit = fit_context(len(ids), req.max_tokens, info.max_model_len, "max_tokens", "prompt",
                            (defaults or {}).get("max_tokens", COMPLETION_DEFAULT_MAX_TOKENS))
        params = sampling_params(req, limit, req.logprobs, info, cfg, defaults)
        if req.echo and req.logprobs is not None:   # echoed prompt tokens get their logprobs
            params.prompt_logprobs = max(params.prompt_logprobs or 0, req.logprobs)
        jobs.append(Job(ids, params, text if req.echo else None, req.priority or 0))
    return _prepared(req, jobs, req.logprobs, cfg)


def _check_choices(req: CompletionRequest, cfg: ServerConfig) -> None:
    """Prompts x n capped before anything is tokenized or allocated per choice: past the
    admission queue's size such a request could never run, and would only cost memory."""
    _check_max(req.n, cfg.max_n, "n")
    prompt = req.prompt
    count = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    choices = count * (1 if req.n is None else req.n)
    if choices > cfg.max_waiting_requests:
        raise ParamError(f"prompts x n is {choices}, more than the server's limit of "
                         f"{cfg.max_waiting_requests} (max_waiting_requests)", param="prompt")


def _prepared(req: _Common, jobs: list[Job], logprobs: int | None, cfg: ServerConfig) -> Prepared:
    n = 1 if req.n is None else req.n
    _check_max(n, cfg.max_n, "n")
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    # As vLLM: continuous usage only together with include_usage.
    continuous = include_usage and bool(req.stream_options.continuous_usage_stats)
    _check_max(req.prompt_logprobs, cfg.max_logprobs, "prompt_logprobs")
    if req.prompt_logprobs is not None and req.stream:
        raise ParamError("prompt_logprobs is not supported with stream", param="prompt_logprobs")
    return Prepared(jobs, n, bool(req.stream), include_usage, logprobs, continuous,
                    req.prompt_logprobs)


def render_chat(tok: Tokenizer, messages: list[dict[str, Any]], add_generation_prompt: bool,
                trace: TraceHandle | None = None, tools: list[dict[str, Any]] | None = None) -> list[int]:
    try:
        text = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tools=tools)
    except ParamError:
        raise
    except Exception as exc:  # a template may raise anything on odd input; it is the client's input
        raise ParamError(f"cannot render the chat template: {exc}", param="messages") from None
    if trace is not None:
        trace.mark(Step.VALIDATED, "chat template rendered",
                   {"messages": len(messages), "chars": len(text)}, where=render_chat)
    ids = tok.encode(text, add_special_tokens=False)
    if trace is not None:
        trace.mark(Step.TOKENIZED, "tokenized", {"prompt_tokens": len(ids)}, where=render_chat)
    if not ids:
        raise ParamError("the rendered chat has no tokens", param="messages")
    return ids


def prompt_token_ids(prompt: Any, tok: Tokenizer, vocab_size: int) -> list[tuple[list[int], str]]:
    """Each prompt of a completions request as (token ids, text) - text is used by echo."""
    if isinstance(prompt, str):
        prompt = [prompt]
    kinds = {type(p) for p in prompt}
    if kinds == {int}:
        prompt = [prompt]
    elif len(kinds) > 1:
        raise ParamError("prompt must not mix strings, token ids and lists", param="prompt")
    out = []
    for p in prompt:
        ids = tok.encode(p, add_special_tokens=True) if isinstance(p, str) else p
        if not ids:   # a non-empty text may still tokenize to nothing
            raise ParamError("prompt must not be empty", param="prompt")
        check_token_ids(ids, vocab_size, "prompt")
        out.append((ids, p if isinstance(p, str) else tok.decode(ids, skip_special_tokens=False)))
    return out


def check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    """The vocab bound; ids >= 0 was checked while decoding (protocol.TokenId)."""
    if any(t >= vocab_size for t in ids):
        raise ParamError(f"token ids must be in [0, {vocab_size})", param=param)


def fit_context(n_prompt: int, max_tokens: int | None, max_model_len: int, param: str,
                prompt_param: str, default: int | None) -> int:
    """The max_tokens to run with; a prompt that does not fit raises RequestTooLongError."""
    room = max_model_len - n_prompt
    if room <= 0:
        raise RequestTooLongError(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{n_prompt} tokens, leaving no room for the completion.", param=prompt_param)
    if max_tokens is None:
        return min(default or room, room)
    if max_tokens > room:
        raise RequestTooLongError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} for the "
            f"completion). Please reduce the prompt or {param}.", param=param)
    return max_tokens


def sampling_params(req: _Common, max_tokens: int, logprobs: int | None, info: ModelInfo,
                    cfg: ServerConfig, defaults: dict[str, Any] | None = None) -> SamplingParams:
    """``defaults`` (the model's generation config) fill the sampling fields a request omits."""
    stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    if len(stop) > cfg.max_stop_strings:
        raise ParamError(f"at most {cfg.max_stop_strings} stop strings are allowed", param="stop")
    check_token_ids(req.stop_token_ids or [], info.vocab_size, "stop_token_ids")
    _check_max(req.min_tokens, info.max_model_len, "min_tokens")
    min_tokens = None if req.min_tokens is None else min(req.min_tokens, max_tokens)  # max wins
    top_k = req.top_k if req.top_k is None or req.top_k < info.vocab_size else 0  # >= vocab: off
    given: dict[str, Any] = {
        "temperature": req.temperature, "top_p": req.top_p, "top_k": top_k, "min_p": req.min_p,
        "seed": req.seed, "stop_token_ids": req.stop_token_ids, "ignore_eos": req.ignore_eos,
        "presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": req.repetition_penalty, "min_tokens": min_tokens,
        "include_stop_str_in_output": req.include_stop_str_in_output,
        "skip_special_tokens": req.skip_special_tokens, "prompt_logprobs": req.prompt_logprobs,
        "logit_bias": logit_bias(req.logit_bias, info.vocab_size),
        "structured_outputs": structured_spec(req),
    }
    for key, value in (defaults or {}).items():
        if key in given and given[key] is None:
            given[key] = value
    kwargs = {k: v for k, v in given.items() if v is not None}
    return SamplingParams(max_tokens=max_tokens, stop=stop, logprobs=logprobs, **kwargs)


def logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    """OpenAI's string keys -> token ids in the vocabulary (count and values: protocol.py)."""
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        try:
            token_id = int(key)
        except ValueError:
            raise ParamError(f"logit_bias keys must be token ids, got {key!r}",
                             param="logit_bias") from None
        if not 0 <= token_id < vocab_size:
            raise ParamError(f"logit_bias token ids must be in [0, {vocab_size}), got {token_id}",
                             param="logit_bias")
        out[token_id] = value
    return out


def _check_max(value: int | None, hi: int, param: str) -> None:
    """A config-dependent upper bound; the static lower bound was checked while decoding."""
    if value is not None and value > hi:
        raise ParamError(f"{param} must be at most {hi}, got {value}", param=param)
