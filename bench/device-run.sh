#!/usr/bin/env bash
# The GPU-machine runs behind bench/RESULTS.md and the NCCL-guard evidence (nvidia-h200-x2), in one
# call. Run there after installing the carried Ray wheels: bash bench/device-run.sh
#   1. benchmark: reference vs ours and one-lever variants (micro-batch 4; ZeRO-2 at 8)
#   2. the real job twice (healthy; NCCL forced onto sockets) for the guard, + the fail-fast path
#   3. the default config under --memory-budget-gib 22 (L4 proxy), and the fallback cost
set -uo pipefail
: "${OUT:?OUT must name the folder that comes back}"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
JOB=(timeout 150 python3 -m training --model qwen2.5-1.5b --num-workers 2 --seq-len 2048
     --micro-batch-size 4 --log-every 5 --checkpoint-every 0 --storage-path /tmp/runs)
BENCH=(timeout 150 python3 -m training.bench)
SOCKETS=(env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/gpu.txt"
"${BENCH[@]}" --variants reference,ours,ours-unfused-loss,ours-zero2 --label "levers, one at a time" \
  --json-out "$OUT/bench-mb4.json" 2>&1 | tee -a "$OUT/bench.log"
rm -rf /tmp/nccl-logs
"${JOB[@]}" --steps 15 --name guard-healthy 2>&1 | tee "$OUT/job.log"
"${SOCKETS[@]}" "${JOB[@]}" --steps 15 --on-fallback warn --name guard-sockets 2>&1 | tee -a "$OUT/job.log"
"${SOCKETS[@]}" "${JOB[@]}" --steps 2 --name guard-sockets-fail 2>&1 | tee -a "$OUT/job.log"
echo "exit status of the fail-fast run: ${PIPESTATUS[0]}" | tee -a "$OUT/job.log"
tar -czf "$OUT/nccl-logs.tar.gz" -C /tmp nccl-logs
"${BENCH[@]}" --memory-budget-gib 22 --variants ours --label "L4 proxy: default config under 22 GiB" \
  2>&1 | tee -a "$OUT/bench.log"
"${SOCKETS[@]}" "${BENCH[@]}" --variants ours --label "fallback cost: NCCL forced onto sockets" \
  2>&1 | tee -a "$OUT/bench.log"
"${BENCH[@]}" --micro-batch-size 8 --variants reference,ours-zero2 --label "micro-batch 8" \
  2>&1 | tee -a "$OUT/bench.log"
cp bench/RESULTS.md "$OUT/RESULTS.md"
