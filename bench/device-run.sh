#!/usr/bin/env bash
# The GPU-machine runbook (nvidia-h200-x2) behind bench/RESULTS.md and the NCCL-guard evidence, in
# one device call. There, after installing the carried Ray wheels: bash bench/device-run.sh
#   1. benchmark at micro-batch 4 and 8: reference vs ours, and ours with one lever taken out
#   2. the real job twice (healthy; NCCL forced onto sockets) for the guard, + the fail-fast path
#   3. the defaults under --memory-budget-gib 22 (L4 proxy), and the fallback cost
# tests/bench/test_runbook.py checks that every variant named here exists in bench/benchmark.py.
set -uo pipefail
: "${OUT:?OUT must name the folder that comes back}"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
JOB=(timeout 150 python3 -m training --model qwen2.5-1.5b --num-workers 2 --seq-len 2048
     --micro-batch-size 4 --log-every 5 --checkpoint-every 0 --storage-path /tmp/runs)
BENCH=(timeout 150 python3 -m bench)
SOCKETS=(env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/gpu.txt"
"${BENCH[@]}" --variants reference,ours,ours-eager,ours-zero3,ours-unfused-loss \
  --label "levers, one taken out at a time" --json-out "$OUT/bench-mb4.json" 2>&1 | tee -a "$OUT/bench.log"
"${BENCH[@]}" --micro-batch-size 8 --variants reference,ours --label "micro-batch 8" \
  --json-out "$OUT/bench-mb8.json" 2>&1 | tee -a "$OUT/bench.log"
rm -rf /tmp/nccl-logs
"${JOB[@]}" --steps 15 --name guard-healthy 2>&1 | tee "$OUT/job.log"
"${SOCKETS[@]}" "${JOB[@]}" --steps 15 --on-fallback warn --name guard-sockets 2>&1 | tee -a "$OUT/job.log"
"${SOCKETS[@]}" "${JOB[@]}" --steps 2 --name guard-sockets-fail 2>&1 | tee -a "$OUT/job.log"
echo "exit status of the fail-fast run: ${PIPESTATUS[0]}" | tee -a "$OUT/job.log"
tar -czf "$OUT/nccl-logs.tar.gz" -C /tmp nccl-logs
"${BENCH[@]}" --memory-budget-gib 22 --variants ours --label "L4 proxy: defaults under 22 GiB" \
  --json-out "$OUT/bench-budget.json" 2>&1 | tee -a "$OUT/bench.log"
"${SOCKETS[@]}" "${BENCH[@]}" --variants ours --label "fallback cost: NCCL forced onto sockets" \
  --json-out "$OUT/bench-sockets.json" 2>&1 | tee -a "$OUT/bench.log"
