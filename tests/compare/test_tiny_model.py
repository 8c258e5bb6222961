"""The overhead-bound model: tiny shape, real tokenizer, same weights from the same seed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from compare.tiny_model import tiny_config, write_random_weights


def test_tiny_folder_loads_with_the_real_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   default_model_dir: str) -> None:
    from compare.tiny_model import ensure_tiny_model
    from shared.worker.model_loader import load_model

    monkeypatch.setenv("TWINSERVE_CACHE", str(tmp_path))
    folder = ensure_tiny_model(Path(default_model_dir))
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (64, 2, 49152)
    assert cfg["tie_word_embeddings"] is True
    real_tok = (Path(default_model_dir) / "tokenizer.json").read_bytes()
    assert (folder / "tokenizer.json").read_bytes() == real_tok
    model = load_model(folder)
    assert sum(p.numel() for p in model.parameters()) < 4_000_000
    assert ensure_tiny_model(Path(default_model_dir)) == folder   # cached, not rebuilt


def test_weights_depend_only_on_seed(tmp_path: Path) -> None:
    cfg = tiny_config({"vocab_size": 1000, "rms_norm_eps": 1e-5, "model_type": "llama"})
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        write_random_weights(tmp_path / f"{name}.safetensors", cfg, seed)
    a, b, c = (load_file(str(tmp_path / f"{n}.safetensors")) for n in "abc")
    key = "model.layers.1.mlp.down_proj.weight"
    assert a[key].shape == (64, 128)
    assert all((a[k] == b[k]).all() for k in a)
    assert not (a[key] == c[key]).all()
