#!/usr/bin/env bash
# Third GPU call of 2026-11-30 (nvidia-h200-x2): the new defaults under the 22 GiB L4 budget, with
# NCCL forced onto sockets, and the real job (compiled by default now) with a checkpoint.
set -uo pipefail
: "${OUT:?OUT must name the folder that comes back}"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
BENCH=(python3 -m training.bench)
timeout 150 "${BENCH[@]}" --memory-budget-gib 22 --variants ours --label "L4 proxy: default config under 22 GiB" \
  --json-out "$OUT/bench-budget.json" 2>&1 | tee "$OUT/bench.log"
NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 timeout 150 "${BENCH[@]}" --variants ours \
  --label "fallback cost: NCCL forced onto sockets" --json-out "$OUT/bench-sockets.json" 2>&1 | tee -a "$OUT/bench.log"
timeout 200 python3 -m training --model qwen2.5-1.5b --num-workers 2 --seq-len 2048 --micro-batch-size 8 \
  --steps 20 --log-every 5 --checkpoint-every 10 --storage-path /tmp/runs --name defaults-mb8 2>&1 | tee "$OUT/job.log"
