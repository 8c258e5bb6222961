"""Our Llama-family model against transformers, through the paged KV cache.

Reference: one HF forward over a whole token sequence gives the logits at every position; ours
must give the same rows however the sequence is cut into prefill, chunks and decode steps, with
shuffled, non-contiguous blocks. Tiny models get large random weights (and biases) so that a
wrong RoPE, mask or weight mapping moves logits far beyond the 1e-4 tolerance.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from shared.worker.attention.metadata import AttentionMetadata
from shared.worker.model_loader import allocate_kv_caches, kv_bytes_per_block, load_model
from shared.worker.models import ArchConfig, LlamaForCausalLM

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
BLOCK_SIZE = 4
NUM_BLOCKS = 40
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)


# ---------------------------------------------------------------- helpers

@dataclass
class Seq:
    """One sequence's token ids, its blocks, and how many of its tokens are in the cache."""
    tokens: list[int]
    blocks: list[int]
    cached: int = 0
    logits: list[torch.Tensor] = field(default_factory=list)


class BlockPool:
    """Hands out block ids in a shuffled order (block 0 included, the table padding value)."""

    def __init__(self, num_blocks: int, seed: int = 0) -> None:
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)

    def seq(self, tokens: list[int]) -> Seq:
        n = -(-len(tokens) // BLOCK_SIZE)
        blocks, self.free = self.free[:n], self.free[n:]
        return Seq(tokens, blocks)


def run_step(model: LlamaForCausalLM, caches: list, work: list[tuple[Seq, int]]) -> None:
    """Feed the next q tokens of each sequence as one flat batch; store each row's logits."""
    ids, positions, slots, q_lens, seq_lens = [], [], [], [], []
    for seq, q in work:
        pos = list(range(seq.cached, seq.cached + q))
        ids += seq.tokens[pos[0]:pos[-1] + 1]
        positions += pos
        slots += [seq.blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in pos]
        q_lens.append(q)
        seq_lens.append(seq.cached + q)
    width = max(len(s.blocks) for s, _ in work)
    tables = [s.blocks + [0] * (width - len(s.blocks)) for s, _ in work]
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        block_size=BLOCK_SIZE, query_lens_list=q_lens, seq_lens_list=seq_lens)
    with torch.inference_mode():
        logits = model.compute_logits(model(torch.tensor(ids), torch.tensor(positions), meta, caches))
    for (seq, q), start in zip(work, starts):
        seq.logits.append(logits[start:start + q])
        seq.cached += q


def hf_logits(hf_model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf_model(torch.tensor([tokens])).logits[0].float()


def assert_matches(seq: Seq, ref: torch.Tensor, atol: float = ATOL) -> None:
    ours = torch.cat(seq.logits)
    assert ours.shape == ref[:seq.cached].shape
    err = (ours - ref[:seq.cached]).abs().max().item()
    assert err < atol, f"max |logit diff| {err:.3g} >= {atol}"


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights large enough that attention is peaked and every parameter matters."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))


def make_tiny(tmp_path: Path, family: str, seed: int = 0,
              **overrides: object) -> tuple[Path, torch.nn.Module]:
    configs = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "qwen3": transformers.Qwen3Config}
    models = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
              "qwen3": transformers.Qwen3ForCausalLM}
    kwargs = {**TINY, "tie_word_embeddings": False, **overrides}
    if family == "qwen3":
        kwargs.setdefault("head_dim", 16)
    torch.manual_seed(seed)
    hf_model = models[family](configs[family](**kwargs)).eval()
    randomize(hf_model, seed)
    folder = tmp_path / f"{family}-{seed}"
    hf_model.save_pretrained(folder)
    return folder, hf_model


def tokens(n: int, vocab: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=gen).tolist()


def new_caches(model: LlamaForCausalLM, dtype: torch.dtype = torch.float32) -> list:
    return allocate_kv_caches(model.arch, NUM_BLOCKS, BLOCK_SIZE, dtype, "cpu")


def check_prefill(folder: Path, hf_model: torch.nn.Module) -> None:
    model = load_model(folder)
    seq = BlockPool(NUM_BLOCKS).seq(tokens(27, TINY["vocab_size"], 1))
    run_step(model, new_caches(model), [(seq, 27)])
    assert_matches(seq, hf_logits(hf_model, seq.tokens))


def check_decode(folder: Path, hf_model: torch.nn.Module) -> None:
    """Two sequences of different lengths prefilled, then decoded together, token by token."""
    model = load_model(folder)
    caches, pool = new_caches(model), BlockPool(NUM_BLOCKS, seed=3)
    a = pool.seq(tokens(22, TINY["vocab_size"], 2))
    b = pool.seq(tokens(17, TINY["vocab_size"], 3))
    run_step(model, caches, [(a, 13), (b, 6)])
    for _ in range(9):
        run_step(model, caches, [(a, 1), (b, 1)])
    assert_matches(a, hf_logits(hf_model, a.tokens))
    assert_matches(b, hf_logits(hf_model, b.tokens))


# ---------------------------------------------------------------- tiny models, each family

FAMILIES = ["llama", "qwen2", "qwen3"]


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_matches_hf(tmp_path: Path, family: str) -> None:
    check_prefill(*make_tiny(tmp_path, family))


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_then_decode_matches_hf(tmp_path: Path, family: str) -> None:
    check_decode(*make_tiny(tmp_path, family))


@pytest.mark.parametrize("family", FAMILIES)
def test_mixed_batch_matches_hf(tmp_path: Path, family: str) -> None:
    """One step holding: a cached-prefix chunk, two decodes, and a fresh prefill."""
    folder, hf_model = make_tiny(tmp_path, family)
    model = load_model(folder)
    caches, pool = new_caches(model), BlockPool(NUM_BLOCKS, seed=5)
    vocab = TINY["vocab_size"]
    chunked, dec1, dec2, fresh = (pool.seq(tokens(n, vocab, 10 + n)) for n in (15, 11, 6, 7))
    run_step(model, caches, [(dec1, 10), (chunked, 9), (dec2, 5)])
    run_step(model, caches, [(chunked, 6), (dec1, 1), (fresh, 7), (dec2, 1)])
    for seq in (chunked, dec1, dec2, fresh):
        assert_matches(seq, hf_logits(hf_model, seq.tokens))


@pytest.mark.parametrize("tied", [True, False])
def test_tied_and_untied_embeddings(tmp_path: Path, tied: bool) -> None:
    folder, hf_model = make_tiny(tmp_path, "llama", seed=7, tie_word_embeddings=tied)
    model = load_model(folder)
    assert (model.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()) == tied
    check_prefill(folder, hf_model)


def test_sharded_checkpoint(tmp_path: Path) -> None:
    _, hf_model = make_tiny(tmp_path, "qwen3", seed=8)
    folder = tmp_path / "sharded"
    hf_model.save_pretrained(folder, max_shard_size="100KB")
    assert (folder / "model.safetensors.index.json").exists()
    assert len(list(folder.glob("*.safetensors"))) > 1
    check_prefill(folder, hf_model)


ROPE_SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16},
}


@pytest.mark.parametrize("kind", sorted(ROPE_SCALINGS))
def test_rope_scaling_matches_hf(tmp_path: Path, kind: str) -> None:
    params = {"rope_theta": 10000.0, **ROPE_SCALINGS[kind]}
    folder, hf_model = make_tiny(tmp_path, "llama", seed=11, rope_parameters=params)
    assert ArchConfig.from_folder(folder).rope_type == kind
    check_prefill(folder, hf_model)
    check_decode(folder, hf_model)


def test_dynamic_ntk_prefill_beyond_trained_length(tmp_path: Path) -> None:
    # 27 tokens > max_position_embeddings=16, so the NTK base really is rescaled.
    params = {"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 2.0}
    folder, hf_model = make_tiny(tmp_path, "llama", seed=12, rope_parameters=params,
                                 max_position_embeddings=16)
    check_prefill(folder, hf_model)


def test_bf16_close_to_hf_fp32(tmp_path: Path) -> None:
    folder, hf_model = make_tiny(tmp_path, "qwen2", seed=13)
    model = load_model(folder, dtype=torch.bfloat16)
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    caches, seq = new_caches(model, torch.bfloat16), BlockPool(NUM_BLOCKS).seq(tokens(24, 256, 4))
    run_step(model, caches, [(seq, 16)])
    for _ in range(8):
        run_step(model, caches, [(seq, 1)])
    ours, ref = torch.cat(seq.logits), hf_logits(hf_model, seq.tokens)
    assert ours.dtype == torch.float32
    assert (ours - ref).abs().max().item() < 0.1 * ref.abs().max().item()
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.8


# ---------------------------------------------------------------- config and cache sizing

def test_arch_config_parsing() -> None:
    base = {**TINY, "model_type": "llama", "num_key_value_heads": 2}
    old = ArchConfig.from_hf_dict(
        {**base, "rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert old.rope_theta == 5e5 and old.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    new = ArchConfig.from_hf_dict(
        {**base, "rope_parameters": {"rope_theta": 1e5, "rope_type": "default"}})
    assert new.rope_theta == 1e5 and new.rope_scaling is None and new.head_dim == 16
    qwen2 = ArchConfig.from_hf_dict({**base, "model_type": "qwen2"})
    assert qwen2.attention_bias and not qwen2.o_proj_bias and not qwen2.use_qk_norm
    assert ArchConfig.from_hf_dict({**base, "model_type": "qwen3"}).use_qk_norm
    with pytest.raises(ValueError, match="model_type"):
        ArchConfig.from_hf_dict({**base, "model_type": "gpt2"})


def test_kv_cache_shapes_and_bytes() -> None:
    arch = ArchConfig.from_hf_dict({**TINY, "model_type": "llama"})
    caches = allocate_kv_caches(arch, 10, 16, torch.bfloat16, "cpu")
    assert len(caches) == 2 and caches[0][0].shape == (10, 16, 2, 16)
    total = sum(k.nbytes + v.nbytes for k, v in caches)
    assert kv_bytes_per_block(arch, 16, torch.bfloat16) * 10 == total


# ---------------------------------------------------------------- the default model

@pytest.fixture(scope="module")
def default_pair(default_model_dir: str) -> tuple[LlamaForCausalLM, torch.nn.Module, list[int]]:
    from tokenizers import Tokenizer
    text = ("The paged KV cache stores keys and values in fixed-size blocks, so that many requests "
            "can share one pool of memory. A scheduler decides each step which requests run. ") * 3
    ids = Tokenizer.from_file(str(Path(default_model_dir) / "tokenizer.json")).encode(text).ids[:72]
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32)
    hf_model.eval()
    return load_model(Path(default_model_dir)), hf_model, ids


@pytest.mark.slow
def test_default_model_prefill_and_decode_match_hf(default_pair: tuple) -> None:
    model, hf_model, ids = default_pair
    seq = BlockPool(64, seed=21).seq(ids)
    caches = allocate_kv_caches(model.arch, 64, BLOCK_SIZE, torch.float32, "cpu")
    run_step(model, caches, [(seq, 64)])
    for _ in range(8):
        run_step(model, caches, [(seq, 1)])
    assert_matches(seq, hf_logits(hf_model, seq.tokens))


@pytest.mark.slow
def test_default_model_bf16_smoke(default_pair: tuple, default_model_dir: str) -> None:
    _, hf_model, ids = default_pair
    model = load_model(Path(default_model_dir), dtype=torch.bfloat16)
    seq = BlockPool(64, seed=22).seq(ids[:40])
    caches = allocate_kv_caches(model.arch, 64, BLOCK_SIZE, torch.bfloat16, "cpu")
    run_step(model, caches, [(seq, 32)])
    for _ in range(8):
        run_step(model, caches, [(seq, 1)])
    ours, ref = torch.cat(seq.logits), hf_logits(hf_model, seq.tokens)
    assert (ours - ref).abs().mean().item() < 0.5
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.8
