#!/usr/bin/env bash
# GPU check for twinserve (issue 6): kernel tests natively on CUDA, torch vs Triton backend and
# CUDA graphs on/off agreement, offline tokens/s at batch 1/32/256, each engine served at
# concurrency 64. Random-weight models are built on the spot with SmolLM2's real tokenizer.
#
#   scripts/gpu_check.sh [RESULT.json]          # default: $OUT/gpu_check.json; < 8 minutes
#   scripts/gpu_check.sh --cpu-dry-run [RESULT.json]
#
# Needs torch (CUDA) and Triton installed, no network. Tokenizer files: run
# `python scripts/gpu_check.py --stage-tokenizer` beforehand where the default model is cached
# (it copies ~2 MB into .gpu_check/tokenizer, which travels with the working tree).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
args=()
for a in "$@"; do
  case "$a" in
    --*) args+=("$a") ;;
    *) args+=(--out "$a") ;;
  esac
done
exec timeout 475 "$PY" scripts/gpu_check.py "${args[@]}"
