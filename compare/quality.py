"""Quality of each ``--quantization`` mode: perplexity on a fixed English text and greedy
agreement with the float weights (``python -m compare.quality``, ``make bench-quality``).

Perplexity comes from the engine's own prompt logprobs, measured two ways so every kernel path
``auto`` can take is scored: as one long prefill (matmuls of thousands of rows) and token by
token (a one-token budget per step: decode-shaped steps of one row). The text ships with the
harness (compare/data/quality_text.txt, ~2,000 tokens, written for this project). Greedy
agreement: the share of identical tokens against the reference mode over 64 tokens on 16 chat
prompts. The bound the project holds its defaults to: within 2% of bf16's perplexity.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

TEXT = Path(__file__).parent / "data" / "quality_text.txt"
BOUND = 0.02        # a mode's perplexity may exceed the reference's by at most 2%
CHAT_PROMPTS = [
    "What is the capital of France?", "Name three primary colours.", "How do bees make honey?",
    "Write a haiku about rain.", "Explain what a lighthouse does.", "What is two plus two?",
    "Give me a tip for learning to cook.", "Why is the sky blue?", "Describe a cat in one sentence.",
    "What should I pack for a day at the beach?", "How many legs does a spider have?",
    "Suggest a name for a small bakery.", "What is the boiling point of water?",
    "Tell me a fact about the moon.", "How do I say hello in Spanish?", "What is a prime number?",
]


@dataclass
class ModeResult:
    mode: str
    ppl_prefill: float
    ppl_decode: float
    greedy_match: float         # share of tokens equal to the reference mode's, position-wise
    scored_prefill: int
    scored_decode: int
    seconds: float


def perplexity(logprobs: list[float]) -> float:
    return math.exp(-sum(logprobs) / len(logprobs))


def _llm(args: argparse.Namespace, mode: str, budget: int):  # noqa: ANN202 - shared.LLM
    from shared import LLM

    quantization, _, kv_dtype = mode.partition("@")         # "w8a8@bfloat16": a bf16 KV cache
    return LLM(args.model, dtype=args.dtype, quantization=quantization,
               kv_cache_dtype=kv_dtype or "auto", num_threads=args.num_threads,
               max_num_batched_tokens=budget, max_num_seqs=max(16, len(CHAT_PROMPTS)),
               enable_prefix_caching=False)


def _scored(llm, ids: list[int]) -> list[float]:  # noqa: ANN001
    from shared import SamplingParams

    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))[0]
    return [lp.logprob for lp in out.prompt_logprobs[1:]]


def _greedy(llm, num_prompts: int, max_tokens: int) -> list[list[int]]:  # noqa: ANN001
    from shared import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    chats = [[{"role": "user", "content": p}] for p in CHAT_PROMPTS[:num_prompts]]
    return [o.outputs[0].token_ids for o in llm.chat(chats, params)]


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    pairs = [(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return sum(x == y for x, y in pairs) / max(1, len(pairs))


def run_mode(args: argparse.Namespace, mode: str, ids: list[int],
             reference: list[list[int]] | None) -> tuple[ModeResult, list[list[int]]]:
    t0 = time.perf_counter()
    llm = _llm(args, mode, budget=len(ids) + 1)
    prefill = _scored(llm, ids)
    greedy = _greedy(llm, args.num_prompts, args.gen_tokens)
    del llm
    decode = _scored(_llm(args, mode, budget=1), ids[: args.decode_tokens])
    match = 1.0 if reference is None else _agreement(greedy, reference)
    result = ModeResult(mode, perplexity(prefill), perplexity(decode), match, len(prefill),
                        len(decode), time.perf_counter() - t0)
    return result, greedy


def report(results: list[ModeResult], args: argparse.Namespace) -> str:
    ref = results[0]
    lines = [f"Perplexity on {TEXT.name} ({results[0].scored_prefill + 1} tokens; token by token: "
             f"{results[0].scored_decode + 1}), {args.dtype} activations, reference: {ref.mode}",
             "", "| mode | ppl, one prefill | vs ref | ppl, token by token | vs ref | greedy match "
             f"({args.num_prompts} x {args.gen_tokens} tokens) | within {BOUND:.0%} |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        dp, dd = r.ppl_prefill / ref.ppl_prefill - 1, r.ppl_decode / ref.ppl_decode - 1
        ok = "yes" if max(dp, dd) <= BOUND else "no"
        lines.append(f"| {r.mode} | {r.ppl_prefill:.3f} | {dp:+.2%} | {r.ppl_decode:.3f} | {dd:+.2%} "
                     f"| {r.greedy_match:.1%} | {ok} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m compare.quality", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model folder or GGUF (default: SmolLM2-135M)")
    p.add_argument("--modes", nargs="+", default=["none", "int8", "int4", "w8a8", "auto"],
                   help="the first is the reference; MODE@bfloat16 also stores the KV cache in "
                        "bf16 (--kv-cache-dtype)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--decode-tokens", type=int, default=None,
                   help="score only this many leading tokens token by token (default: all)")
    p.add_argument("--num-prompts", type=int, default=len(CHAT_PROMPTS))
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--max-text-tokens", type=int, default=None, help="truncate the text (tests)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[ModeResult]:
    from shared.frontend.tokenizer import Tokenizer
    from shared.worker.model_fetch import resolve_model

    args = parse_args(argv)
    args.model = str(resolve_model(args.model))
    ids = Tokenizer(Path(args.model)).encode(TEXT.read_text())[: args.max_text_tokens]
    results, reference = [], None
    for mode in args.modes:
        result, greedy = run_mode(args, mode, ids, reference)
        reference = reference if reference is not None else greedy
        results.append(result)
        print(f"{mode}: ppl {result.ppl_prefill:.3f} / {result.ppl_decode:.3f}, greedy match "
              f"{result.greedy_match:.1%} ({result.seconds:.0f} s)", flush=True)
    print(report(results, args))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return results


if __name__ == "__main__":
    main()
