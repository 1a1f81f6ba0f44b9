#!/usr/bin/env bash
# Second GPU call of 2026-11-29 (nvidia-h200-x2): what the first call's 590 s limit cut off, with
# JSON results kept: the healthy guard run after the preflight fix, the 22 GiB budget, the fallback
# cost and micro-batch 8.
set -uo pipefail
: "${OUT:?}"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
rm -rf /tmp/nccl-logs
timeout 120 python3 -m training --model qwen2.5-1.5b --num-workers 2 --seq-len 2048 --micro-batch-size 4 \
  --log-every 5 --checkpoint-every 0 --storage-path /tmp/runs --steps 15 --name guard-healthy 2>&1 | tee "$OUT/job-healthy.log"
tar -czf "$OUT/nccl-logs-healthy.tar.gz" -C /tmp nccl-logs
timeout 110 python3 -m training.bench --memory-budget-gib 22 --variants ours --label "L4 proxy: default config under 22 GiB" \
  --json-out "$OUT/bench-budget.json" 2>&1 | tail -4
NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 timeout 110 python3 -m training.bench --variants ours --label "fallback cost: NCCL forced onto sockets" \
  --json-out "$OUT/bench-sockets.json" 2>&1 | tail -4
timeout 120 python3 -m training.bench --micro-batch-size 8 --variants reference,ours-zero2 --label "micro-batch 8" \
  --json-out "$OUT/bench-mb8.json" 2>&1 | tail -5
