"""The model's own sampling defaults (generation_config.json), used where a request is silent.

vLLM's ``--generation-config``: ``auto`` reads the served model's file, ``none`` uses the
OpenAI defaults, and a folder reads that folder's file. Only sampling fields are taken.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# generation_config.json key -> the request field it stands in for
FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
          "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def load_generation_defaults(mode: str, model_folder: str | Path) -> dict[str, Any]:
    """Request field -> default value; {} for ``none`` or a model without the file."""
    if mode == "none":
        return {}
    folder = Path(model_folder) if mode == "auto" else Path(mode)
    path = folder / "generation_config.json"
    if not path.is_file():
        if mode != "auto":
            raise ValueError(f"--generation-config {mode}: no generation_config.json there")
        return {}
    raw = json.loads(path.read_text(encoding="utf-8"))
    defaults = {field: raw[key] for key, field in FIELDS.items()
                if isinstance(raw.get(key), int | float) and not isinstance(raw.get(key), bool)}
    if defaults:
        logger.info("sampling defaults from %s: %s", path, defaults)
    return defaults
