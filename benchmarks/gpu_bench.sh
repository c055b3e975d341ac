#!/usr/bin/env bash
# GPU benchmark for bertscope. Run from the repository root on a CUDA machine:
#
#   bash benchmarks/gpu_bench.sh --model .devcarry/model
#
# Needs torch (CUDA), and optionally transformers and sentence-transformers (skipped if absent).
# bertscope need not be installed: src/ is put on PYTHONPATH. No network is used.
# Results: $OUT/gpu_bench.json and $OUT/gpu_bench.md (OUT defaults to ./gpu-out); a summary is
# printed. Designed to finish well under 5 minutes on one H200. Extra arguments go to the
# Python script (e.g. --quick for a dry run on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=true
PY="${PYTHON:-python3}"
exec timeout 290 "$PY" benchmarks/gpu_bench.py "$@"
