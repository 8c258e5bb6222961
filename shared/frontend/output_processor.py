"""Turns engine-core token ids into per-request text deltas (lifecycle step 12).

Runs in the front end (v0: the API loop; v1: the API process's output handler). It owns
one IncrementalDetokenizer per request, checks stop strings on the text, and reports
requests that hit one, because only the core can stop generating them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from shared.frontend.detokenizer import IncrementalDetokenizer
from shared.frontend.outputs import CompletionOutput, RequestOutput
from shared.frontend.tokenizer import Tokenizer
from shared.messages import EngineCoreOutput, RequestTimes, SamplingParams, TokenLogprobs


@dataclass
class ProcessedOutputs:
    request_outputs: list[RequestOutput] = field(default_factory=list)
    reqs_to_abort: list[str] = field(default_factory=list)   # hit a stop string here


@dataclass
class _RequestState:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None
    detok: IncrementalDetokenizer
    text: str = ""              # output text so far, cut at a stop string
    sent: int = 0               # characters of ``text`` already handed out
    num_tokens: int = 0
    # Prompt logprobs that came with a token whose text is still held back (a stop string
    # may be starting): they go out with the first output that is emitted.
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    times: RequestTimes | None = None      # likewise the core's first-token intervals

    @property
    def hold_back(self) -> int:
        """Trailing characters that might be the start of a stop string."""
        return max((len(s) for s in self.params.stop), default=1) - 1

    def add_text(self, delta: str) -> str | None:
        """Append decoded text; return the stop string it completes, cutting ``text`` there."""
        start = max(0, len(self.text) - self.hold_back)
        self.text += delta
        if not delta or not self.params.stop or self.num_tokens <= self.params.min_tokens:
            return None
        # Only windows that include new text can hold a new match; take the earliest.
        hits = [(i, s) for s in self.params.stop if (i := self.text.find(s, start)) >= 0]
        if not hits:
            return None
        idx, stop = min(hits)
        keep = idx + len(stop) if self.params.include_stop_str_in_output else idx
        self.text = self.text[:keep]
        return stop

    def take_text(self, finished: bool) -> str:
        end = len(self.text) if finished else max(self.sent, len(self.text) - self.hold_back)
        delta, self.sent = self.text[self.sent:end], end
        return delta


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._states: dict[str, _RequestState] = {}

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    prompt: str | None = None) -> None:
        detok = IncrementalDetokenizer(self._tokenizer, prompt_token_ids, params.skip_special_tokens)
        self._states[request_id] = _RequestState(request_id, prompt_token_ids, params, prompt, detok)

    def has_request(self, request_id: str) -> bool:
        return request_id in self._states

    @property
    def num_requests(self) -> int:
        return len(self._states)

    def abort_request(self, request_id: str) -> None:
        """Forget a request (client gone, or aborted by the engine); unknown ids are fine."""
        self._states.pop(request_id, None)

    remove = abort_request

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> ProcessedOutputs:
        result = ProcessedOutputs()
        for out in outputs:
            state = self._states.get(out.request_id)
            if state is None:
                continue                # already finished here (stop string) or aborted
            request_output, hit_stop = self._process(state, out)
            if request_output is None:
                continue
            result.request_outputs.append(request_output)
            if request_output.finished:
                del self._states[out.request_id]
            if hit_stop:
                result.reqs_to_abort.append(out.request_id)
        return result

    def _process(self, state: _RequestState, out: EngineCoreOutput) -> tuple[RequestOutput | None, bool]:
        finish_reason, stop_reason = out.finish_reason, out.stop_reason
        num_kept, stop = self._detokenize(state, out)
        if stop is not None:
            finish_reason, stop_reason = "stop", stop
        elif finish_reason is not None:
            state.add_text(state.detok.flush())     # a trailing incomplete character
        finished = finish_reason is not None
        if out.prompt_logprobs is not None:
            state.prompt_logprobs = out.prompt_logprobs
        if out.times is not None:
            state.times = out.times
        if num_kept == 0 and not finished:
            return None, False
        completion = CompletionOutput(
            index=0, text=state.take_text(finished), token_ids=out.new_token_ids[:num_kept],
            logprobs=_kept_logprobs(state.params, out.new_logprobs, num_kept),
            finish_reason=finish_reason, stop_reason=stop_reason,
        )
        request_output = RequestOutput(
            request_id=state.request_id, prompt_token_ids=state.prompt_token_ids, outputs=[completion],
            finished=finished, num_cached_tokens=out.num_cached_tokens, prompt=state.prompt,
            prompt_logprobs=state.prompt_logprobs, times=state.times,
        )
        state.prompt_logprobs = state.times = None
        # A core-finished request needs no abort, even if a stop string also matched.
        return request_output, stop is not None and out.finish_reason is None

    def _detokenize(self, state: _RequestState, out: EngineCoreOutput) -> tuple[int, str | None]:
        """Feed new tokens one at a time; return how many count and the stop string hit."""
        ids = out.new_token_ids
        # When the core stopped on EOS or a stop token id, that token's text is not part
        # of the output unless asked for (vLLM's rule); its id is still reported. A grammar
        # that ends on an ordinary token keeps it.
        last = ids[-1] if ids else None
        hide_last = (out.finish_reason == "stop" and not state.params.include_stop_str_in_output
                     and (last == self._tokenizer.eos_token_id or last in state.params.stop_token_ids))
        for k, token_id in enumerate(ids):
            state.num_tokens += 1
            if hide_last and k == len(ids) - 1:
                break
            stop = state.add_text(state.detok.append([token_id]))
            if stop is not None:
                return k + 1, stop      # tokens after the stop are never reported
        return len(ids), None


def _kept_logprobs(params: SamplingParams, logprobs: list[TokenLogprobs] | None,
                   num_kept: int) -> list[TokenLogprobs] | None:
    if params.logprobs is None:
        return None
    return list(logprobs or [])[:num_kept]
