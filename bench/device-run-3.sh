#!/usr/bin/env bash
# First GPU call of 2026-11-30 (nvidia-h200-x2): back-to-back step timing (no host sync between
# steps, as in training), the per-block compile lever, and a profile of each variant's step.
# Run there after installing the carried Ray wheels: bash bench/device-run-3.sh
set -uo pipefail
: "${OUT:?OUT must name the folder that comes back}"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_LOGS=recompiles,graph_breaks
BENCH=(python3 -m training.bench)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/gpu.txt"
timeout 300 "${BENCH[@]}" --variants reference,ours,ours-compile,ours-zero2-compile --profile-dir /tmp/prof \
  --label "back-to-back timing; per-block compile; profiled" --json-out "$OUT/bench-mb4.json" 2>&1 | tee "$OUT/bench.log"
tar -cf "$OUT/traces-mb4.tar" -C /tmp/prof .
timeout 200 "${BENCH[@]}" --micro-batch-size 8 --variants reference,ours-zero2,ours-zero2-compile \
  --label "micro-batch 8, back-to-back timing" --json-out "$OUT/bench-mb8.json" 2>&1 | tee -a "$OUT/bench.log"
