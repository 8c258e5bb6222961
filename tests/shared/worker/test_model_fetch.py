"""Model resolution: the cached default folder, GGUF conversion, and clear errors."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.worker.model_fetch import DEFAULT_MODEL_NAME, fetch_default_gguf, resolve_model
from shared.worker.model_loader import load_model


def test_default_model_folder_is_complete(default_model_dir: str) -> None:
    folder = resolve_model(None)
    assert folder == Path(default_model_dir)
    assert folder.name == DEFAULT_MODEL_NAME
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert (folder / name).is_file(), name
    assert resolve_model(DEFAULT_MODEL_NAME) == folder
    assert resolve_model(str(folder)) == folder


def test_model_flag_rejects_what_it_cannot_load(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither an HF-format folder nor a .gguf file"):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(str(tmp_path))


@pytest.mark.slow
def test_gguf_file_converts_once_to_the_same_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     default_model_dir: str) -> None:
    gguf = fetch_default_gguf()          # kept in the cache by the default_model_dir fixture
    reference = Path(default_model_dir)
    monkeypatch.setenv("TWINSERVE_CACHE", str(tmp_path))
    folder = resolve_model(str(gguf))
    assert folder.is_relative_to(tmp_path) and (folder / "model.safetensors").is_file()
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_model(str(gguf)) == folder                     # cached: no second conversion
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime
    ours, ref = load_model(folder), load_model(reference)
    for (name, a), (_, b) in zip(ours.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), name
