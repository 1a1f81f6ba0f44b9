#!/usr/bin/env bash
# Second GPU call of 2026-11-30 (nvidia-h200-x2): the new defaults (`ours`: compiled layers and
# loss, ZeRO-2 where it fits) against the reference at micro-batch 8 and 4, each lever taken back
# out one at a time, profiled. Run there after installing the carried Ray wheels.
set -uo pipefail
: "${OUT:?OUT must name the folder that comes back}"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
BENCH=(python3 -m training.bench)
timeout 280 "${BENCH[@]}" --micro-batch-size 8 --variants reference,ours,ours-eager,ours-zero3 --profile-dir /tmp/prof8 \
  --label "defaults: compile + ZeRO-2; levers out one at a time" --json-out "$OUT/bench-mb8.json" 2>&1 | tee "$OUT/bench.log"
tar -cf "$OUT/traces-mb8.tar" -C /tmp/prof8 .
timeout 200 "${BENCH[@]}" --variants reference,ours,ours-eager-zero3 --profile-dir /tmp/prof4 \
  --label "defaults vs 2026-11-29 defaults (eager, ZeRO-3)" --json-out "$OUT/bench-mb4.json" 2>&1 | tee -a "$OUT/bench.log"
tar -cf "$OUT/traces-mb4.tar" -C /tmp/prof4 .
