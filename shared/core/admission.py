"""Admission checks of a new request: can it ever run, and how many tokens may it produce."""
from __future__ import annotations

from shared.core.kv_cache import KVCacheManager
from shared.core.request import Request
from shared.errors import ParamError, RequestTooLongError


def check_fits(request: Request, max_model_len: int, kv: KVCacheManager) -> None:
    """Raise RequestTooLongError (400) for a request that could never run."""
    n = request.num_prompt_tokens
    if n == 0:
        raise ParamError("the prompt must contain at least one token", param="prompt")
    if n >= max_model_len:
        raise RequestTooLongError(
            f"the prompt has {n} tokens but the model's context length is "
            f"{max_model_len} tokens, which leaves no room to generate", param="prompt")
    need = kv.num_blocks_for(n + 1)
    if need > kv.num_blocks:
        raise RequestTooLongError(
            f"the prompt has {n} tokens and needs {need} KV-cache blocks of {kv.block_size} "
            f"tokens, but the whole cache holds {kv.num_blocks} blocks "
            f"({kv.num_blocks * kv.block_size} tokens)", param="prompt")


def max_output_tokens(request: Request, max_model_len: int, kv: KVCacheManager) -> int:
    """The output tokens a request may have: its max_tokens, capped by the context and cache."""
    n = request.num_prompt_tokens
    # k outputs need KV for n + k - 1 tokens: never promise more than the whole cache,
    # or a lone request would outgrow it and preempt itself forever.
    cache_tokens = kv.num_blocks * kv.block_size
    limit = min(max_model_len - n, cache_tokens - n + 1)
    max_tokens = request.sampling_params.max_tokens
    return limit if max_tokens is None else min(max_tokens, limit)
