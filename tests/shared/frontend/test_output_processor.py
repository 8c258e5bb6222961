from __future__ import annotations

import pytest

from shared.frontend.output_processor import OutputProcessor
from shared.frontend.outputs import RequestOutput
from shared.frontend.tokenizer import Tokenizer
from shared.messages import EngineCoreOutput, SamplingParams, TokenLogprobs

PROMPT = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tok(default_model_dir: str) -> Tokenizer:
    return Tokenizer(default_model_dir)


def run(tok: Tokenizer, ids: list[int], params: SamplingParams, finish_last: str | None = None,
        stop_reason: int | str | None = None) -> tuple[list[RequestOutput], list[str], OutputProcessor]:
    """Feed ``ids`` one per step; optionally the core finishes on the last one."""
    proc = OutputProcessor(tok)
    proc.add_request("r", tok.encode(PROMPT), params, prompt=PROMPT)
    outs, aborts = [], []
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        core = EngineCoreOutput("r", [t], finish_reason=finish_last if last else None,
                                stop_reason=stop_reason if last else None)
        res = proc.process_outputs([core])
        outs += res.request_outputs
        aborts += res.reqs_to_abort
    return outs, aborts, proc


def text_of(outs: list[RequestOutput]) -> str:
    return "".join(o.outputs[0].text for o in outs)


def test_plain_stream_with_multibyte_and_length_finish(tok: Tokenizer) -> None:
    text = "héllo 世界 🎉🎉 ok"
    ids = tok.encode(text)
    outs, aborts, proc = run(tok, ids, SamplingParams(), finish_last="length")
    assert len(outs) == len(ids)                     # one output per step, even when text is ""
    assert text_of(outs) == text and aborts == []
    assert all("\ufffd" not in o.outputs[0].text for o in outs)
    assert [t for o in outs for t in o.outputs[0].token_ids] == ids
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "length"
    assert not any(o.finished for o in outs[:-1])
    assert outs[0].prompt == PROMPT and outs[0].prompt_token_ids == tok.encode(PROMPT)
    assert not proc.has_request("r") and proc.num_requests == 0


@pytest.mark.parametrize("skip", [True, False])
def test_eos_finish_keeps_id_and_hides_text(tok: Tokenizer, skip: bool) -> None:
    eos = tok.eos_token_id
    ids = tok.encode("Done.") + [eos]
    outs, _, _ = run(tok, ids, SamplingParams(skip_special_tokens=skip), finish_last="stop")
    assert text_of(outs) == "Done."
    assert outs[-1].outputs[0].token_ids == [eos]
    assert outs[-1].outputs[0].finish_reason == "stop" and outs[-1].finished


def test_special_tokens_mid_output_follow_skip_flag(tok: Tokenizer) -> None:
    start = tok.token_to_id("<|im_start|>")
    ids = tok.encode("a") + [start] + tok.encode("b")
    assert text_of(run(tok, ids, SamplingParams(skip_special_tokens=True), "length")[0]) == "ab"
    assert text_of(run(tok, ids, SamplingParams(skip_special_tokens=False), "length")[0]) == "a<|im_start|>b"


def test_stop_string_spanning_tokens_never_leaks(tok: Tokenizer) -> None:
    stop = "STOP HERE"
    ids = tok.encode("Some text STOP HERE and more")
    outs, aborts, proc = run(tok, ids, SamplingParams(stop=[stop]))
    streamed = ""
    for o in outs:
        streamed += o.outputs[0].text
        # no prefix of the stop string that later turns out to be the stop may be emitted
        assert "STOP" not in streamed
    assert streamed == "Some text "
    last = outs[-1].outputs[0]
    assert outs[-1].finished and last.finish_reason == "stop" and last.stop_reason == stop
    assert aborts == ["r"] and not proc.has_request("r")
    reported = [t for o in outs for t in o.outputs[0].token_ids]
    assert tok.decode(reported).endswith("HERE")     # tokens after the stop are dropped
    assert len(reported) < len(ids)


def test_include_stop_str_in_output(tok: Tokenizer) -> None:
    ids = tok.encode("alpha beta gamma delta")
    outs, aborts, _ = run(tok, ids, SamplingParams(stop=["gamma"], include_stop_str_in_output=True))
    assert text_of(outs) == "alpha beta gamma"
    assert outs[-1].outputs[0].stop_reason == "gamma" and aborts == ["r"]


def test_stop_at_very_first_token(tok: Tokenizer) -> None:
    ids = tok.encode("Hello world")
    first = tok.decode(ids[:1])
    outs, aborts, _ = run(tok, ids, SamplingParams(stop=[first]))
    assert len(outs) == 1 and outs[0].finished
    assert outs[0].outputs[0].text == "" and outs[0].outputs[0].token_ids == ids[:1]
    assert aborts == ["r"]


def test_earliest_of_several_stops_wins_and_near_miss_is_released(tok: Tokenizer) -> None:
    ids = tok.encode("one two three four")
    outs, _, _ = run(tok, ids, SamplingParams(stop=["four", "two t"]))
    assert text_of(outs) == "one " and outs[-1].outputs[0].stop_reason == "two t"
    # "two x" starts like the stop "two t" but is not one: it must come out in full
    outs, aborts, _ = run(tok, tok.encode("one two x"), SamplingParams(stop=["two t"]), "length")
    assert text_of(outs) == "one two x" and aborts == []


def test_hold_back_is_flushed_at_finish(tok: Tokenizer) -> None:
    ids = tok.encode("abc xyz")
    outs, _, _ = run(tok, ids, SamplingParams(stop=["zzzzzzzz"]), finish_last="length")
    assert outs[0].outputs[0].text == ""             # held back: could start a stop string
    assert text_of(outs) == "abc xyz" and outs[-1].finished


def test_logprobs_follow_reported_tokens(tok: Tokenizer) -> None:
    proc = OutputProcessor(tok)
    proc.add_request("a", [1], SamplingParams(logprobs=1, stop=["b"]))
    proc.add_request("n", [1], SamplingParams())
    ids = tok.encode("a b c")
    lps = [TokenLogprobs(t, -0.5, 1, [t], [-0.5]) for t in ids]
    res = proc.process_outputs([EngineCoreOutput("a", ids, new_logprobs=lps),
                                EngineCoreOutput("n", ids[:1])])
    by_id = {o.request_id: o.outputs[0] for o in res.request_outputs}
    # the stop lands inside this multi-token step: ids and logprobs are cut together
    assert by_id["a"].token_ids == ids[:2] and by_id["a"].logprobs == lps[:2]
    assert by_id["a"].text == "a " and res.reqs_to_abort == ["a"]
    assert by_id["n"].logprobs is None


def test_unknown_and_aborted_requests_are_ignored(tok: Tokenizer) -> None:
    proc = OutputProcessor(tok)
    proc.add_request("a", [1], SamplingParams())
    proc.abort_request("a")
    proc.abort_request("never-added")
    res = proc.process_outputs([EngineCoreOutput("a", [5]), EngineCoreOutput("x", [5])])
    assert res.request_outputs == [] and proc.num_requests == 0


def test_core_abort_finishes_without_new_tokens(tok: Tokenizer) -> None:
    proc = OutputProcessor(tok)
    proc.add_request("a", [1], SamplingParams(stop=["long stop"]))
    proc.process_outputs([EngineCoreOutput("a", tok.encode("hi"))])
    res = proc.process_outputs([EngineCoreOutput("a", [], finish_reason="abort")])
    out = res.request_outputs[0]
    assert out.finished and out.outputs[0].finish_reason == "abort" and out.outputs[0].text == "hi"
    assert res.reqs_to_abort == [] and not proc.has_request("a")
