"""POST /v1/completions: OpenAI's legacy text_completion shape, with echo and logprobs."""
from __future__ import annotations

from shared.api.logprobs import CompletionLogprobs, merge_completion_logprobs, vllm_prompt_logprobs
from shared.api.protocol import CompletionRequest, decode_body
from shared.api.requests import Prepared, check_model, prepare_completion
from shared.api.serving import Choice, Ctx, Serving, finish_reason
from shared.frontend.outputs import RequestOutput
from shared.trace.steps import Step
from shared.trace.tracer import TraceHandle


class CompletionServing(Serving):
    id_prefix = "cmpl"

    def prepare(self, body: bytes, trace: TraceHandle | None = None) -> Prepared:
        req = decode_body(body, CompletionRequest)
        check_model(req.model, self.state.accepted_models)
        if trace is not None:
            trace.mark(Step.VALIDATED, "body validated (no chat template)",
                       {"prompt": type(req.prompt).__name__}, where=self.prepare)
        engine = self.state.engine
        return prepare_completion(req, engine.tokenizer, engine.model_info, self.state.config, trace,
                                  self.state.generation_defaults)

    def on_output(self, ctx: Ctx, index: int, out: RequestOutput) -> list[dict]:
        choice = ctx.choice(index)
        delta = out.outputs[0]
        text, lp_block = self._start(ctx, choice) if not choice.started else ("", None)
        text += delta.text
        choice.text.append(delta.text)
        choice.num_tokens += len(delta.token_ids)
        if choice.legacy_lp is not None and delta.logprobs:
            block = choice.legacy_lp.delta(delta.logprobs)
            choice.legacy_blocks.append(block)
            lp_block = block if lp_block is None else _concat(lp_block, block)
        if out.finished:
            choice.finish_reason = finish_reason(out)
        if not (text or lp_block or out.finished):
            return []
        return [{"id": ctx.id, "object": "text_completion", "created": ctx.created, "model": ctx.model,
                 "choices": [{"index": choice.index, "text": text, "logprobs": lp_block,
                              "finish_reason": choice.finish_reason}], **_usage_null(ctx)}]

    def _start(self, ctx: Ctx, choice: Choice) -> tuple[str, dict | None]:
        """First delta of a choice: set up logprobs and emit the echoed prompt, if asked."""
        choice.started = True
        job = ctx.prepared.jobs[choice.index // ctx.prepared.n]
        if ctx.prepared.logprobs is not None:
            choice.legacy_lp = CompletionLogprobs(self.state.texts)
        if job.prompt_text is None:
            return "", None
        choice.text.append(job.prompt_text)
        if choice.legacy_lp is None:
            return job.prompt_text, None
        block = choice.legacy_lp.prompt(job.prompt_ids, choice.prompt_logprobs,
                                        ctx.prepared.logprobs or 0)
        choice.legacy_blocks.append(block)
        return job.prompt_text, block

    def usage_chunk(self, ctx: Ctx) -> dict:
        return {"id": ctx.id, "object": "text_completion", "created": ctx.created,
                "model": ctx.model, "choices": [], "usage": ctx.usage()}

    def full_response(self, ctx: Ctx) -> dict:
        choices = []
        for index in sorted(ctx.choices):
            c = ctx.choices[index]
            choices.append({"index": index, "text": "".join(c.text),
                            "logprobs": merge_completion_logprobs(c.legacy_blocks)
                            if ctx.prepared.logprobs is not None else None,
                            "finish_reason": c.finish_reason})
            if ctx.prepared.prompt_logprobs is not None:    # vLLM's extension
                choices[-1]["prompt_logprobs"] = vllm_prompt_logprobs(
                    c.prompt_logprobs or [], self.state.texts, ctx.prepared.prompt_logprobs)
        return {"id": ctx.id, "object": "text_completion", "created": ctx.created, "model": ctx.model,
                "choices": choices, "usage": ctx.usage()}


def _usage_null(ctx: Ctx) -> dict:
    return {"usage": None} if ctx.prepared.include_usage else {}


def _concat(a: dict, b: dict) -> dict:
    return {key: a[key] + b[key] for key in a}
