"""POST /v1/chat/completions: OpenAI's chat.completion and chat.completion.chunk shapes."""
from __future__ import annotations

from shared.api.logprobs import chat_logprobs, vllm_prompt_logprobs
from shared.api.protocol import ChatCompletionRequest, decode_body
from shared.api.requests import Prepared, check_model, prepare_chat
from shared.api.serving import Ctx, Serving, finish_reason
from shared.frontend.outputs import RequestOutput
from shared.trace.tracer import TraceHandle


class ChatServing(Serving):
    id_prefix = "chatcmpl"

    def prepare(self, body: bytes, trace: TraceHandle | None = None) -> Prepared:
        req = decode_body(body, ChatCompletionRequest)
        check_model(req.model, self.state.accepted_models)
        engine = self.state.engine
        return prepare_chat(req, engine.tokenizer, engine.model_info, self.state.config, trace)

    def on_output(self, ctx: Ctx, index: int, out: RequestOutput) -> list[dict]:
        choice = ctx.choice(index)
        delta = out.outputs[0]
        chunks = []
        if not choice.started:
            choice.started = True
            chunks.append(self._chunk(ctx, index, {"role": "assistant", "content": ""}))
        choice.text.append(delta.text)
        choice.num_tokens += len(delta.token_ids)
        lps = None
        if ctx.prepared.logprobs is not None and delta.logprobs:
            choice.logprobs.extend(delta.logprobs)
            lps = {"content": chat_logprobs(delta.logprobs, self.state.texts)}
        if delta.text or lps:
            chunks.append(self._chunk(ctx, index, {"content": delta.text}, lps))
        if out.finished:
            choice.finish_reason = finish_reason(out)
            chunks.append(self._chunk(ctx, index, {}, None, choice.finish_reason))
        return chunks

    def _chunk(self, ctx: Ctx, index: int, delta: dict, logprobs: dict | None = None,
               reason: str | None = None) -> dict:
        chunk = {"id": ctx.id, "object": "chat.completion.chunk", "created": ctx.created,
                 "model": ctx.model, "choices": [{"index": index, "delta": delta,
                                                  "logprobs": logprobs, "finish_reason": reason}]}
        if ctx.prepared.include_usage:
            chunk["usage"] = None   # as OpenAI: null on every chunk but the last
        return chunk

    def usage_chunk(self, ctx: Ctx) -> dict:
        return {"id": ctx.id, "object": "chat.completion.chunk", "created": ctx.created,
                "model": ctx.model, "choices": [], "usage": ctx.usage()}

    def full_response(self, ctx: Ctx) -> dict:
        choices = []
        for index in sorted(ctx.choices):
            c = ctx.choices[index]
            lps = None
            if ctx.prepared.logprobs is not None:
                lps = {"content": chat_logprobs(c.logprobs, self.state.texts)}
            choices.append({"index": index, "message": {"role": "assistant", "content": "".join(c.text)},
                            "logprobs": lps, "finish_reason": c.finish_reason})
        body = {"id": ctx.id, "object": "chat.completion", "created": ctx.created,
                "model": ctx.model, "choices": choices, "usage": ctx.usage()}
        if ctx.prepared.prompt_logprobs is not None:    # vLLM's extension, one prompt per chat
            first = ctx.choices[min(ctx.choices)].prompt_logprobs or []
            body["prompt_logprobs"] = vllm_prompt_logprobs(first, self.state.texts,
                                                           ctx.prepared.prompt_logprobs)
        return body
