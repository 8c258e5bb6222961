"""POST /v1/chat/completions: OpenAI's chat.completion and chat.completion.chunk shapes."""
from __future__ import annotations

from shared.api.logprobs import chat_logprobs, vllm_prompt_logprobs
from shared.api.protocol import ChatCompletionRequest, decode_body
from shared.api.requests import Prepared, check_model, prepare_chat
from shared.api.serving import Choice, Ctx, Serving, finish_reason
from shared.api.tools import ToolCallsState
from shared.frontend.outputs import RequestOutput
from shared.trace.tracer import TraceHandle


class ChatServing(Serving):
    id_prefix = "chatcmpl"

    def prepare(self, body: bytes, trace: TraceHandle | None = None) -> Prepared:
        req = decode_body(body, ChatCompletionRequest)
        check_model(req.model, self.state.accepted_models)
        engine = self.state.engine
        return prepare_chat(req, engine.tokenizer, engine.model_info, self.state.config, trace,
                            self.state.generation_defaults)

    def on_output(self, ctx: Ctx, index: int, out: RequestOutput) -> list[dict]:
        choice = ctx.choice(index)
        delta = out.outputs[0]
        chunks = []
        if not choice.started:
            choice.started = True
            if ctx.prepared.tools is not None:
                choice.tool_calls = ToolCallsState.start(ctx.prepared.tools)
            chunks.append(self._chunk(ctx, index, {"role": "assistant", "content": ""}))
        choice.num_tokens += len(delta.token_ids)
        text, calls = self._split(choice, delta.text, out.finished)
        choice.text.append(text)
        lps = None
        if ctx.prepared.logprobs is not None and delta.logprobs:
            choice.logprobs.extend(delta.logprobs)
            lps = {"content": chat_logprobs(delta.logprobs, self.state.texts)}
        if text or lps:
            chunks.append(self._chunk(ctx, index, {"content": text}, lps))
        # One delta per chunk, as OpenAI streams them: the call's id and name, then fragments.
        chunks.extend(self._chunk(ctx, index, {"tool_calls": [call]}) for call in calls)
        if out.finished:
            choice.finish_reason = self._finish_reason(choice, out)
            chunks.append(self._chunk(ctx, index, {}, None, choice.finish_reason))
        return chunks

    @staticmethod
    def _split(choice: Choice, text: str, finished: bool) -> tuple[str, list[dict]]:
        """Content text and tool_call deltas of this output (all content without tools)."""
        state: ToolCallsState | None = choice.tool_calls
        if state is None:
            return text, []
        events = state.parser.feed(text) + (state.parser.finish() if finished else [])
        return state.deltas(events)

    @staticmethod
    def _finish_reason(choice: Choice, out: RequestOutput) -> str | None:
        reason = finish_reason(out)
        # As OpenAI: a reply that made calls ends with "tool_calls" (unless it was cut short).
        if reason == "stop" and choice.tool_calls is not None and choice.tool_calls.calls:
            return "tool_calls"
        return reason

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
            choices.append({"index": index, "message": self._message(c), "logprobs": lps,
                            "finish_reason": c.finish_reason})
        body = {"id": ctx.id, "object": "chat.completion", "created": ctx.created,
                "model": ctx.model, "choices": choices, "usage": ctx.usage()}
        if ctx.prepared.prompt_logprobs is not None:    # vLLM's extension, one prompt per chat
            first = ctx.choices[min(ctx.choices)].prompt_logprobs or []
            body["prompt_logprobs"] = vllm_prompt_logprobs(first, self.state.texts,
                                                           ctx.prepared.prompt_logprobs)
        return body

    @staticmethod
    def _message(c: Choice) -> dict:
        text = "".join(c.text)
        calls = c.tool_calls.calls if c.tool_calls is not None else []
        if not calls:
            return {"role": "assistant", "content": text}
        # As OpenAI: content is null when the reply is only calls.
        return {"role": "assistant", "content": text if text.strip() else None, "tool_calls": calls}
