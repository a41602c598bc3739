#!/usr/bin/env bash
# The prepared GPU check (issue 14): run from the repository root on a GPU machine.
# Needs python with torch (CUDA) and transformers; no network. Writes $OUT/gpu_check.json
# (default ./gpu_check.json) within a 450 s budget; extra arguments go to gpu_check.py.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
exec python scripts/gpu_check.py --out "${OUT:-.}/gpu_check.json" "$@"
