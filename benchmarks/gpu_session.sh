#!/usr/bin/env bash
# How the H200 figures in docs/BENCHMARKS.md were taken: the bundled model travelled to the GPU
# machine as fp16 safetensors in .devcarry/model (the transfer limit is 64 MiB); this upcasts it to an
# fp32 folder, so every system loads the same fp32 weights, then runs benchmarks/gpu_bench.sh.
set -o pipefail
export PYTHONUNBUFFERED=1
python3 - <<'PY'
import shutil, os
from safetensors.torch import load_file, save_file
src, dst = ".devcarry/model", "/tmp/model32"
shutil.copytree(src, dst, dirs_exist_ok=True)
s = load_file(f"{src}/model.safetensors")
save_file({k: (v.float() if v.is_floating_point() else v) for k, v in s.items()}, f"{dst}/model.safetensors", metadata={"format": "pt"})
print("upcast model ready")
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
bash benchmarks/gpu_bench.sh --model /tmp/model32 "$@" 2>&1 | tee $OUT/gpu_log.txt
