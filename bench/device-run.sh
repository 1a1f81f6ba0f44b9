#!/usr/bin/env bash
# The GPU-machine runs behind bench/RESULTS.md and the NCCL-guard evidence (nvidia-h200-x2).
# Usage there, after installing the carried Ray wheels: bash bench/device-run.sh PHASE
#   levers   - benchmark: reference vs ours and one-lever variants, micro-batch 4 and 8
#   guard    - the real job twice (healthy; NCCL forced onto sockets) + the fail-fast path
#   budget   - the default config under --memory-budget-gib 22, and the fallback cost
set -uo pipefail
: "${OUT:?OUT must name the folder that comes back}"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
JOB=(python3 -m training --model qwen2.5-1.5b --num-workers 2 --seq-len 2048 --micro-batch-size 4
     --log-every 5 --checkpoint-every 0 --storage-path /tmp/runs)
FORCE_SOCKETS=(env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
case "$1" in
  levers)
    python3 -m training.bench --variants reference,ours,ours-unfused-loss,ours-zero2,ours-compile \
      --label "levers, one at a time" --json-out "$OUT/bench-mb4.json" 2>&1 | tee "$OUT/bench-mb4.log"
    python3 -m training.bench --micro-batch-size 8 --variants reference,ours,ours-zero2,ours-zero2-compile \
      --label "micro-batch 8" --json-out "$OUT/bench-mb8.json" 2>&1 | tee "$OUT/bench-mb8.log"
    ;;
  guard)
    rm -rf /tmp/nccl-logs
    "${JOB[@]}" --steps 15 --name guard-healthy 2>&1 | tee "$OUT/job-healthy.log"
    "${FORCE_SOCKETS[@]}" "${JOB[@]}" --steps 15 --on-fallback warn --name guard-sockets 2>&1 \
      | tee "$OUT/job-sockets-warn.log"
    "${FORCE_SOCKETS[@]}" "${JOB[@]}" --steps 2 --name guard-sockets-fail 2>&1 | tee "$OUT/job-sockets-fail.log"
    echo "exit status of the fail-fast run: ${PIPESTATUS[0]}" | tee -a "$OUT/job-sockets-fail.log"
    tar -czf "$OUT/nccl-logs.tar.gz" -C /tmp nccl-logs
    ;;
  budget)
    python3 -m training.bench --memory-budget-gib 22 --variants reference,ours \
      --label "L4 proxy: default config under 22 GiB" --json-out "$OUT/bench-budget.json" 2>&1 | tee "$OUT/bench-budget.log"
    "${FORCE_SOCKETS[@]}" python3 -m training.bench --variants ours \
      --label "fallback cost: NCCL forced onto sockets" --json-out "$OUT/bench-sockets.json" 2>&1 | tee "$OUT/bench-sockets.log"
    ;;
esac
cp bench/RESULTS.md "$OUT/RESULTS.md" 2>/dev/null || true
