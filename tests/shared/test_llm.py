"""The offline LLM on the real default model: exactness against HF transformers and the
engine-level behaviours (batching, preemption, prefix caching, seeds, stop strings)."""
from __future__ import annotations

import pytest
import torch

from shared import LLM, SamplingParams

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 7?",
    "Name a famous painter.",
    "How do birds fly?",
]


@pytest.fixture(scope="module")
def llm(default_model_dir: str) -> LLM:
    return LLM(default_model_dir, dtype="float32", quantization="none",
               max_num_seqs=16, num_blocks=512)


def _chat_ids(llm: LLM, question: str) -> list[int]:
    return llm.tokenizer.encode(llm.tokenizer.apply_chat_template([{"role": "user", "content": question}]))


def test_batched_greedy_equals_transformers_generate(llm: LLM, default_model_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    prompts = [_chat_ids(llm, q) for q in QUESTIONS]
    # min_tokens masks EOS as HF's min_new_tokens does, so both produce exactly 32 tokens.
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32, min_tokens=32))
    hf = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    for prompt, out in zip(prompts, outs):
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=32, min_new_tokens=32,
                              do_sample=False, pad_token_id=2)
        assert out.outputs[0].token_ids == ref[0, len(prompt):].tolist()
        assert out.outputs[0].finish_reason == "length"


def test_chat_answers_paris(llm: LLM) -> None:
    out = llm.chat([{"role": "user", "content": QUESTIONS[0]}], SamplingParams(temperature=0, max_tokens=32))
    assert out[0].outputs[0].text == "The capital of France is Paris."
    assert out[0].outputs[0].finish_reason == "stop"       # EOS, not the length limit
    assert out[0].outputs[0].token_ids[-1] == llm.tokenizer.eos_token_id


def test_preemption_under_tiny_cache_keeps_greedy_outputs(llm: LLM, default_model_dir: str) -> None:
    prompts = [_chat_ids(llm, q) for q in QUESTIONS[:6]]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    roomy = llm.generate(prompts, params)
    # 6 requests of ~50 tokens each need ~24 blocks of 16; 12 blocks force preemption.
    tight = LLM(default_model_dir, dtype="float32", quantization="none",
                num_blocks=12, max_num_seqs=16)
    squeezed = tight.generate(prompts, params)
    assert tight.core.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in squeezed] == [o.outputs[0].token_ids for o in roomy]
    assert tight.core.scheduler.kv_cache_manager.num_free_blocks == 12


def test_prefix_cache_hit_gives_same_tokens(llm: LLM) -> None:
    system = "You are a careful assistant. " * 12
    conv = lambda q: [{"role": "system", "content": system}, {"role": "user", "content": q}]  # noqa: E731
    params = SamplingParams(temperature=0, max_tokens=12)
    first = llm.chat(conv("Name a color."), params)[0]
    second = llm.chat(conv("Name a color."), params)[0]
    assert second.num_cached_tokens >= 64
    assert second.outputs[0].token_ids == first.outputs[0].token_ids


def test_seed_reproducible_regardless_of_batch(llm: LLM) -> None:
    seeded = SamplingParams(temperature=1.0, max_tokens=16, seed=1234, ignore_eos=True)
    alone = llm.generate(["Once upon a time"], seeded)[0].outputs[0].token_ids
    noisy = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    batch = llm.generate(["Hello there", "Once upon a time", "Roses are red"], [noisy, seeded, noisy])
    assert batch[1].outputs[0].token_ids == alone
    other = llm.generate(["Once upon a time"], SamplingParams(temperature=1.0, max_tokens=16,
                                                             seed=4321, ignore_eos=True))
    assert other[0].outputs[0].token_ids != alone


def test_n_choices_and_logprobs(llm: LLM) -> None:
    out = llm.generate("The capital of France is",
                       SamplingParams(temperature=0.9, max_tokens=6, n=3, seed=7, logprobs=2,
                                      ignore_eos=True))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for choice in out.outputs:
        assert len(choice.token_ids) == 6 and len(choice.logprobs) == 6
        for tok, lp in zip(choice.token_ids, choice.logprobs):
            assert lp.token_id == tok and lp.logprob <= 0 and len(lp.top_ids) == 2
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1   # seeds differ per choice


def test_n_choices_fork_one_prefill_and_match_a_lone_request(llm: LLM) -> None:
    """Eight greedy choices share one prefill (the siblings compute only the last prompt
    token, on KV forked from the first: shared blocks plus a copied partial block) and give
    what one request alone gives."""
    prompt = _chat_ids(llm, "Why is the sky blue? Answer in one sentence.")   # not a block multiple
    assert len(prompt) % 16 != 1
    alone = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, logprobs=0))[0]
    stats = llm.core.scheduler
    before = stats.num_forked_tokens
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, n=8, logprobs=0))[0]
    assert stats.num_forked_tokens - before == 7 * (len(prompt) - 1)
    want = alone.outputs[0]
    for choice in out.outputs:
        assert choice.token_ids == want.token_ids
        for got, ref in zip(choice.logprobs, want.logprobs):
            assert abs(got.logprob - ref.logprob) < 1e-3


def test_stop_string_truncates_text(llm: LLM) -> None:
    full = llm.chat([{"role": "user", "content": QUESTIONS[0]}], SamplingParams(temperature=0, max_tokens=32))
    stopped = llm.chat([{"role": "user", "content": QUESTIONS[0]}],
                       SamplingParams(temperature=0, max_tokens=32, stop=["France"]))
    assert full[0].outputs[0].text.startswith("The capital of France")
    assert stopped[0].outputs[0].text == "The capital of "
    assert stopped[0].outputs[0].finish_reason == "stop"
    assert stopped[0].outputs[0].stop_reason == "France"
    assert not llm.core.has_unfinished_requests()


def test_prompt_longer_than_context_is_refused(default_model_dir: str) -> None:
    from shared.errors import RequestTooLongError

    small = LLM(default_model_dir, dtype="float32", quantization="none",
                max_model_len=32, num_blocks=64)
    with pytest.raises(RequestTooLongError, match="32"):
        small.generate([[5] * 40], SamplingParams(max_tokens=4))
    out = small.generate([[5] * 20], SamplingParams(max_tokens=100, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 12                # stops at the context length
    assert out.outputs[0].finish_reason == "length"


def test_priority_policy_runs_lower_values_first(llm: LLM, default_model_dir: str) -> None:
    prio = LLM(default_model_dir, dtype="float32", quantization="none", max_num_seqs=1,
               num_blocks=128, scheduling_policy="priority")
    finished: list[str] = []
    step = prio.core.step

    def recording_step():  # the order requests end in, one at a time (max_num_seqs=1)
        out = step()
        finished.extend(o.request_id for o in out.outputs if o.finish_reason is not None)
        return out
    prio.core.step = recording_step  # type: ignore[method-assign]
    prompts = [_chat_ids(llm, q) for q in QUESTIONS[:3]]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = prio.generate(prompts, params, priority=[2, 0, 1])
    assert finished == ["1-0", "2-0", "0-0"]
    assert ([o.outputs[0].token_ids for o in outs]      # results still in input order
            == [o.outputs[0].token_ids for o in llm.generate(prompts, params)])


def test_fcfs_llm_refuses_a_priority_before_queueing_anything(llm: LLM) -> None:
    with pytest.raises(ValueError, match="scheduling_policy"):
        llm.generate([[5] * 4, [6] * 4], SamplingParams(max_tokens=2), priority=[0, 1])
    with pytest.raises(ValueError, match="2 priorities for 1 prompts"):
        llm.generate([[5] * 4], SamplingParams(max_tokens=2), priority=[0, 1])
    assert not llm.core.has_unfinished_requests()


def test_bfloat16_kv_cache_holds_twice_the_blocks_and_decodes_alike(llm: LLM,
                                                                    default_model_dir: str) -> None:
    # --kv-cache-dtype bfloat16 under float32 activations: the same GiB hold twice the blocks,
    # and decode steps (the fused native step reads the cache) stay close to the float32 cache:
    # greedy tokens agree for most of their length and, where they agree, so do their logprobs.
    sizes = {}
    bf16 = LLM(default_model_dir, dtype="float32", quantization="none", max_num_seqs=16,
               kv_cache_size_gb=0.05, kv_cache_dtype="bfloat16")
    f32 = LLM(default_model_dir, dtype="float32", quantization="none", max_num_seqs=16,
              kv_cache_size_gb=0.05)
    try:
        for name, engine in (("bf16", bf16), ("f32", f32)):
            runner = engine.core.model_runner
            sizes[name] = runner.num_blocks
            assert runner.kv_caches[0][0].dtype == (torch.bfloat16 if name == "bf16" else torch.float32)
        assert bf16.core.model_runner.fused is not None
        assert 0 <= sizes["bf16"] - 2 * sizes["f32"] <= 1     # floor(GiB / block bytes)
        prompts = [_chat_ids(llm, q) for q in QUESTIONS]
        params = SamplingParams(temperature=0, max_tokens=24, min_tokens=24, logprobs=1)
        agreed = []
        for a, b in zip(bf16.generate(prompts, params), f32.generate(prompts, params)):
            ta, tb = a.outputs[0].token_ids, b.outputs[0].token_ids
            n = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), len(ta))
            agreed.append(n)
            for la, lb in zip(a.outputs[0].logprobs[:n], b.outputs[0].logprobs[:n]):
                assert abs(la.logprob - lb.logprob) < 0.1
        assert sum(agreed) >= 0.6 * 24 * len(prompts), agreed
    finally:
        bf16.close()
        f32.close()
