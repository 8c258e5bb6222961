"""Offline throughput: twinserve's ``LLM.generate`` beside HF transformers' batched
``generate`` on the same random prompts, in the same run (``make bench-offline``).

    python -m compare.bench_offline [--num-prompts 128] [--dtype float32 bfloat16] [--skip-hf]
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import time

import numpy as np
import torch

from shared.frontend.tokenizer import Tokenizer
from shared.worker.model_fetch import resolve_model


def make_prompts(n: int, lo: int, hi: int, vocab: int, special: set[int], seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(lo, hi + 1, size=n)
    ids = [int(i) for i in range(vocab) if i not in special]
    return [[ids[j] for j in rng.integers(0, len(ids), size=int(k))] for k in lengths]


def bench_twinserve(model: str | None, prompts: list[list[int]], out_len: int, dtype: str,
                    args: argparse.Namespace) -> float:
    from shared.llm import LLM
    from shared.messages import SamplingParams

    llm = LLM(model, dtype=dtype, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_size_gb=args.kv_cache_size)
    params = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    produced = sum(len(o.outputs[0].token_ids) for o in outs)
    assert produced == len(prompts) * out_len, produced
    del llm
    gc.collect()
    return produced / elapsed


def bench_hf(folder: str, prompts: list[list[int]], out_len: int, dtype: str, batch: int,
             pad_id: int) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    produced, t0 = 0, time.perf_counter()
    # Sorting by length keeps padding (wasted work for HF) small, which favours HF.
    ordered = sorted(prompts, key=len)
    for i in range(0, len(ordered), batch):
        chunk = ordered[i:i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=out_len,
                                 min_new_tokens=out_len, do_sample=False, pad_token_id=pad_id)
        produced += (out.shape[1] - width) * len(chunk)
    return produced / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--num-prompts", type=int, default=128)
    p.add_argument("--input-len", type=int, nargs=2, default=(64, 512), metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-cache-size", type=float, default=4.0, help="GiB")
    p.add_argument("--hf-batch-size", type=int, default=32)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    folder = str(resolve_model(args.model))
    tok = Tokenizer(folder)
    prompts = make_prompts(args.num_prompts, *args.input_len, tok.vocab_size, tok.special_token_ids, args.seed)
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}; {len(prompts)} prompts of {args.input_len[0]}-{args.input_len[1]} "
          f"tokens, {args.output_len} output tokens each (ignore_eos, greedy)")
    rows = []
    for dtype in args.dtype:
        ours = bench_twinserve(args.model, prompts, args.output_len, dtype, args)
        hf = None if args.skip_hf else bench_hf(folder, prompts, args.output_len, dtype,
                                                 args.hf_batch_size, tok.eos_token_id or 0)
        rows.append({"dtype": dtype, "twinserve_tok_s": ours, "hf_tok_s": hf,
                     "ratio": None if hf is None else ours / hf})
        ratio = "" if hf is None else f"  HF generate {hf:8.1f} tok/s  ratio {ours / hf:5.2f}x"
        print(f"{dtype:>9}: twinserve {ours:8.1f} tok/s{ratio}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
