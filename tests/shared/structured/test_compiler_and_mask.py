"""GrammarCompiler (cache, errors) and GrammarMasker against the real SmolLM2 tokenizer."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from shared.errors import ParamError
from shared.messages import StructuredOutputsParams as Spec
from shared.structured.bitmask import GrammarMasker
from shared.structured.compiler import GrammarCompiler, GrammarState
from shared.structured.grammar import validate

EOS = 2


@pytest.fixture(scope="module")
def tok(default_tokenizer_json: str) -> Tokenizer:
    return Tokenizer.from_file(default_tokenizer_json)


@pytest.fixture(scope="module")
def compiler(default_tokenizer_json: str, tok: Tokenizer):
    c = GrammarCompiler(Path(default_tokenizer_json), tok.get_vocab_size(), EOS, cache_size=2)
    yield c
    c.shutdown()


def _ready(state: GrammarState) -> GrammarState:
    deadline = time.monotonic() + 30
    while not state.ready():
        assert time.monotonic() < deadline, "grammar never compiled"
        time.sleep(0.005)
    return state


def test_the_mask_allows_exactly_the_grammars_tokens(compiler: GrammarCompiler, tok: Tokenizer) -> None:
    state = _ready(compiler.submit(Spec(regex="[0-9]")))
    vocab = tok.get_vocab_size()
    allowed = GrammarMasker().allowed([state.matcher], vocab)[0]
    digits = {i for i in range(vocab) if len(s := tok.decode([i])) == 1 and s.isdigit() and s.isascii()}
    assert set(torch.nonzero(allowed).flatten().tolist()) == digits and len(digits) == 10


def test_masked_logits_pick_only_allowed_tokens_row_by_row(compiler: GrammarCompiler,
                                                            tok: Tokenizer) -> None:
    yes_no = _ready(compiler.submit(Spec(choice=["yes", "no"])))
    digit = _ready(compiler.submit(Spec(regex="[0-9]")))
    vocab = tok.get_vocab_size()
    logits = torch.randn(3, vocab)
    out = GrammarMasker().apply(logits, [0, 2], [yes_no.matcher, digit.matcher])
    assert torch.equal(out[1], logits[1])                      # the free row is untouched
    assert tok.decode([int(out[0].argmax())]) in ("yes", "no", "y", "n", "ye")
    assert tok.decode([int(out[2].argmax())]).isdigit()
    assert torch.isinf(out[0]).sum() > vocab - 20


def test_sequences_of_one_grammar_get_their_own_matcher(compiler: GrammarCompiler, tok: Tokenizer) -> None:
    a = _ready(compiler.submit(Spec(choice=["yes", "no"])))
    b = _ready(compiler.submit(Spec(choice=["yes", "no"])))
    assert a.accept(tok.token_to_id("yes")) and a.is_stopped
    assert not b.is_stopped and b.accept(tok.token_to_id("no")) and b.is_stopped


def test_the_cache_reuses_compiles_and_is_bounded(default_tokenizer_json: str, tok: Tokenizer) -> None:
    c = GrammarCompiler(Path(default_tokenizer_json), tok.get_vocab_size(), EOS, cache_size=2)
    try:
        specs = [Spec(regex=f"a{{{k}}}") for k in (1, 2, 3)]
        for spec in (specs[0], specs[0], specs[1], specs[0]):
            _ready(c.submit(spec))
        assert c.num_compiled == 2
        _ready(c.submit(specs[2]))        # evicts specs[1], the least recently used
        _ready(c.submit(specs[0]))
        assert c.num_compiled == 3
        _ready(c.submit(specs[1]))
        assert c.num_compiled == 4
    finally:
        c.shutdown()


def test_a_compile_error_is_reported_and_not_cached(compiler: GrammarCompiler) -> None:
    bad = Spec(regex="a(b")              # validate() would have refused it with a 400
    for _ in range(2):
        state = _ready(compiler.submit(bad))
        assert state.matcher is None and "unclosed group" in state.error


def test_a_forbidden_token_sets_the_error(compiler: GrammarCompiler, tok: Tokenizer) -> None:
    state = _ready(compiler.submit(Spec(regex="[0-9]+")))
    assert not state.accept(tok.token_to_id("hello"))
    assert state.error


@pytest.mark.parametrize(("spec", "fragment"), [
    (Spec(json='{"type": "objectx"}'), "objectx"),
    (Spec(json="[1, 2]"), "object or a boolean"),
    (Spec(json="{"), "not valid JSON"),
    (Spec(json="false"), "accepts no value"),
    (Spec(regex="(("), "regex"),
    (Spec(grammar="root ::= foo"), "foo"),
])
def test_validate_names_the_problem(spec: Spec, fragment: str) -> None:
    with pytest.raises(ParamError) as exc:
        validate(spec, "structured_outputs")
    assert fragment in str(exc.value) and exc.value.param == "structured_outputs"


def test_validate_accepts_gbnf_lark_and_schema_features() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"enum": [1, 2]},
                                                     "minItems": 1, "maxItems": 2}}}
    for spec in (Spec(json=json.dumps(schema)), Spec(json="true"), Spec(json_object=True),
                 Spec(grammar='root ::= "a" | "b"'), Spec(grammar='start: "a" | "b"')):
        assert validate(spec, "p")


def test_a_spec_needs_exactly_one_kind() -> None:
    for kwargs in ({}, {"regex": "a", "choice": ["a"]}, {"json_object": True, "json": "{}"}):
        with pytest.raises(ParamError):
            Spec(**kwargs)
