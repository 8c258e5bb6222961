"""Grammar compilation off the engine's step loop, and each sequence's matcher.

A request with a spec waits in the scheduler's queue until its grammar is compiled; other
requests keep stepping meanwhile. Compiled grammars are cached by the SHA-256 of their text (a
bounded LRU) and every sequence decodes with its own copy of the compiled matcher.
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import llguidance

from shared.messages import StructuredOutputsParams
from shared.structured.grammar import to_grammar


class GrammarError(Exception):
    """The grammar could not be compiled for this tokenizer, or a token broke it."""


class GrammarState:
    """One sequence's matcher, available once its grammar has compiled."""

    def __init__(self, compiled: Future[llguidance.LLMatcher]) -> None:
        self._compiled = compiled
        self.matcher: llguidance.LLMatcher | None = None
        self.error: str | None = None

    def ready(self) -> bool:
        """Non-blocking: True once compiled (or failed: see ``error``)."""
        if self.matcher is not None or self.error is not None:
            return True
        if not self._compiled.done():
            return False
        exc = self._compiled.exception()
        if exc is not None:
            self.error = str(exc)
        else:
            self.matcher = self._compiled.result().deep_copy()
        return True

    def accept(self, token_id: int) -> bool:
        """Advance past a sampled token; False (and ``error`` set) if the grammar forbids it."""
        assert self.matcher is not None, "accept() before the grammar is ready"
        if self.matcher.consume_token(token_id):
            return True
        self.error = self.matcher.get_error() or f"token {token_id} is not allowed by the grammar"
        return False

    @property
    def is_stopped(self) -> bool:
        """The grammar accepted and allows nothing more: the sequence ends here."""
        return self.matcher is not None and self.matcher.is_stopped()


class GrammarCompiler:
    """Compiles specs on one background thread for the tokenizer in ``tokenizer_file``."""

    def __init__(self, tokenizer_file: Path, vocab_size: int, eos_token_id: int | None,
                 cache_size: int = 128) -> None:
        self.tokenizer_file = tokenizer_file
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Future[llguidance.LLMatcher]] = OrderedDict()
        self._lock = threading.Lock()
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        self.num_compiled = 0

    def submit(self, spec: StructuredOutputsParams) -> GrammarState:
        """Start compiling ``spec`` (or reuse its cached or in-flight compile)."""
        grammar = to_grammar(spec)
        key = hashlib.sha256(grammar.encode()).hexdigest()
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None and not (compiled.done() and compiled.exception()):
                self._cache.move_to_end(key)
                return GrammarState(compiled)
            compiled = self._executor.submit(self._compile, grammar)
            self._cache[key] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return GrammarState(compiled)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _compile(self, grammar: str) -> llguidance.LLMatcher:
        # log_level 0: errors are read back with get_error(), not printed to stderr.
        matcher = llguidance.LLMatcher(self._get_tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        self.num_compiled += 1
        return matcher

    def _get_tokenizer(self) -> llguidance.LLTokenizer:
        # Built on first use (~0.5 s), on the compile thread, so start-up does not pay for it.
        if self._tokenizer is None:
            self._tokenizer = llguidance.LLTokenizer(
                self.tokenizer_file.read_text(), n_vocab=self.vocab_size, eos_token=self.eos_token_id)
        return self._tokenizer
