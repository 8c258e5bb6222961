"""Offline batch inference, as vLLM's ``LLM``: ``LLM().generate(prompts, SamplingParams())``."""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from shared.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from shared.engine_core import EngineCore
from shared.frontend.output_processor import OutputProcessor
from shared.frontend.outputs import CompletionOutput, RequestOutput
from shared.frontend.tokenizer import Tokenizer
from shared.messages import EngineCoreOutputs, EngineCoreRequest, SamplingParams
from shared.worker.model_fetch import resolve_model

Prompt = str | list[int]


class CoreDriver(Protocol):
    """What LLM needs from a core: the in-process EngineCore or a client of a core process."""

    def add_request(self, request: EngineCoreRequest) -> None: ...
    def abort_requests(self, request_ids: list[str]) -> None: ...
    def step(self) -> EngineCoreOutputs: ...
    def has_unfinished_requests(self) -> bool: ...
    def close(self) -> None: ...


class LLM:
    def __init__(self, model: str | None = None, *, dtype: str = "auto", quantization: str = "auto",
                 max_model_len: int | None = None, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 1024, kv_cache_size_gb: float = 0.5,
                 num_blocks: int | None = None, enable_prefix_caching: bool = True,
                 kv_cache_dtype: str = "auto", seed: int = 0, num_threads: int | None = None,
                 scheduling_policy: str = "fcfs",
                 tensor_parallel_size: int = 1,
                 core_factory: Callable[[EngineConfig, Path], CoreDriver] | None = None) -> None:
        """``core_factory`` builds the core from the config and model folder; the default is
        an in-process EngineCore, ``engine_v1.CoreProcessClient`` runs it in its own process."""
        path = resolve_model(model)
        self.config = EngineConfig(
            model=ModelConfig(model=str(path), dtype=dtype, quantization=quantization,
                              max_model_len=max_model_len,
                              seed=seed, num_threads=num_threads),
            cache=CacheConfig(num_blocks=num_blocks, kv_cache_size_gb=kv_cache_size_gb,
                              enable_prefix_caching=enable_prefix_caching,
                              kv_cache_dtype=kv_cache_dtype),
            scheduler=SchedulerConfig(max_num_seqs=max_num_seqs,
                                      max_num_batched_tokens=max_num_batched_tokens,
                                      scheduling_policy=scheduling_policy),
            parallel=ParallelConfig(tensor_parallel_size=tensor_parallel_size),
        )
        self.tokenizer = Tokenizer(path)
        self.core: CoreDriver = (core_factory or EngineCore)(self.config, path)
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop what runs beside this process: a core process, tensor-parallel workers."""
        self.core.close()

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt (strings or token-id lists), in input order.

        ``priority``: one per prompt, lower runs first; needs ``scheduling_policy="priority"``.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = _per_prompt(sampling_params, len(prompts))
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"got {len(priority)} priorities for {len(prompts)} prompts")
        # Checked before anything is queued: a refusal half-way would leave earlier prompts in the core.
        if any(priority or []) and self.config.scheduler.scheduling_policy != "priority":
            raise ValueError("priority other than 0 needs LLM(scheduling_policy='priority')")
        token_lists = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        texts = [p if isinstance(p, str) else None for p in prompts]
        return self._run(token_lists, params, texts, list(priority or [0] * len(prompts)))

    def chat(self, conversations: list[dict[str, Any]] | list[list[dict[str, Any]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             ) -> list[RequestOutput]:
        """Apply the chat template to each OpenAI-style message list, then generate."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        texts = [self.tokenizer.apply_chat_template(c) for c in conversations]  # type: ignore[arg-type]
        return self.generate(texts, sampling_params)

    def _run(self, token_lists: list[list[int]], params: list[SamplingParams],
             texts: list[str | None], priorities: list[int]) -> list[RequestOutput]:
        processor = OutputProcessor(self.tokenizer)
        results: dict[str, tuple[RequestOutput, int]] = {}
        ordered: list[RequestOutput] = []
        for tokens, p, text, prio in zip(token_lists, params, texts, priorities):
            rid = str(next(self._ids))
            result = RequestOutput(rid, tokens, [CompletionOutput(i) for i in range(p.n)], prompt=text)
            ordered.append(result)
            for i in range(p.n):
                child = f"{rid}-{i}"
                child_params = p.for_child(i)
                # n > 1: one prefill, the other choices fork it (not when each scores the prompt)
                leader = f"{rid}-0" if i and p.prompt_logprobs is None else None
                self.core.add_request(EngineCoreRequest(child, tokens, child_params,
                                                        self.tokenizer.eos_token_id, time.time(),
                                                        priority=prio, prefill_leader=leader))
                processor.add_request(child, tokens, child_params, prompt=text)
                results[child] = (result, i)
        while self.core.has_unfinished_requests():
            step = self.core.step()
            processed = processor.process_outputs(step.outputs)
            if processed.reqs_to_abort:
                self.core.abort_requests(processed.reqs_to_abort)
            for out in processed.request_outputs:
                parent, index = results[out.request_id]
                _accumulate(parent.outputs[index], out.outputs[0])
                parent.num_cached_tokens = max(parent.num_cached_tokens, out.num_cached_tokens)
                if out.prompt_logprobs is not None and index == 0:
                    parent.prompt_logprobs = out.prompt_logprobs
        for r in ordered:
            r.finished = True
        return ordered


def _per_prompt(sp: SamplingParams | Sequence[SamplingParams] | None, n: int) -> list[SamplingParams]:
    if sp is None:
        return [SamplingParams()] * n
    if isinstance(sp, SamplingParams):
        return [sp] * n
    if len(sp) != n:
        raise ValueError(f"got {len(sp)} sampling params for {n} prompts")
    return list(sp)


def _accumulate(total: CompletionOutput, delta: CompletionOutput) -> None:
    total.text += delta.text
    total.token_ids.extend(delta.token_ids)
    if delta.logprobs is not None:
        total.logprobs = (total.logprobs or []) + delta.logprobs
    if delta.finish_reason is not None:
        total.finish_reason = delta.finish_reason
        total.stop_reason = delta.stop_reason
