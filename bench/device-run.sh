#!/usr/bin/env bash
# The GPU-machine runbook (nvidia-h200-x2) behind bench/RESULTS.md, in three device calls of under
# 10 minutes each. There, after installing the carried Ray wheels: bash bench/device-run.sh PART
#   sockets  NCCL forced onto TCP sockets (a proxy for one 40 Gbps EFA link): the reference vs ours
#            at the same tokens per optimizer step, each network lever added in turn; with and
#            without accumulation
#   jobs     the real job: accumulation vs none at the same tokens under sockets (tokens/s, loss on
#            `repeat` data); on NVLink, HSDP (2 replicas of 1 GPU) vs FSDP and bf16 vs fp32 reduce
#   nvlink   no regression on NVLink against RESULTS.md; the batch planner under a 22 GiB budget
#   recheck  NVLink again with peak memory read before the compute probe; sockets at mb 8 x 2
#   precision one GPU (nvidia-h200), about 4 minutes: bf16 vs fp32 gradient accumulation
#   trust    one GPU, about 8 minutes: the memory planner against measured peaks
#            (bench.calibrate), the job's throughput with sync vs async checkpoints
#            (bench.checkpoints), and the reference with and without FSDP1's no_sync() at
#            world size 1
#   fine-tune one GPU, about 5 minutes: the document-mask variants; loading both ways
#   pretrained one GPU, about 2 minutes: the job with --accum-dtype fp32 --reduce-dtype bf16 on a
#            pretrained directory (a tiny Qwen2 saved there: the machine reaches no hub), trained
#            on the shipped chat set and exported (CPU rehearsal: the same command, no GPU)
#   lora     one GPU, under 6 minutes: 1.5B full fine-tuning (whole GPU; refused under 22 GiB)
#            vs 1.5B LoRA vs 7B LoRA (LARGE, random init) under --memory-budget-gib 22: tokens/s,
#            peak against the planner's estimate, loss on the shipped set (bench.lora).
#            CPU rehearsal: MODEL=tiny LARGE=tiny SEQ=64 OUT=/tmp/out bash bench/device-run.sh lora
#   lora-l4  one GPU, under 10 minutes, side by side: the naive PEFT baseline (LARGE at seq 2048,
#            mb 2, whole GPU; per-document attention as ours, then causal rows: NAIVE_CAUSAL=0
#            skips), ours under --memory-budget-gib 22 at seq 2048 (the cluster's flex_attention,
#            then sdpa: LORA_SDPA=0 skips) and at 512 (one step of each profiled), then the
#            LoRA calibration grid (bench.calibrate --grid lora: LARGE at 512..2048, MODEL at
#            1024..2048, micro-batch 1, 2 (4), with and without
#            checkpointing, tokens/s each; the most wanted rows first; LORA_GRID=0 skips it).
#            CPU rehearsal: MODEL=tiny LARGE=tiny OUT=/tmp/out bash bench/device-run.sh lora-l4
#   family   one GPU, under 8 minutes: LoRA at seq 2048 of Llama-3.1-8B, Qwen3-8B and Ministral-8B
#            under --memory-budget-gib 22 and Gemma-3-12B under 40 (random init): the planner's
#            estimate against the measured peak, tokens/s (bench.lora).
#            CPU rehearsal: FAMILIES=tiny WIDE=tiny SEQ=64 OUT=/tmp/out bash bench/device-run.sh family
#   dpo      one GPU, under 4 minutes: a DPO step (--objective dpo) of 7B LoRA (LARGE, reference =
#            adapters off) under --memory-budget-gib 22, 1.5B full fine-tuning under it (the
#            planner's refusal) and on the whole GPU (reference table first): tokens/s, peak
#            against the planner's estimate (bench.dpo).
#            CPU rehearsal: MODEL=tiny LARGE=tiny SEQ=64 OUT=/tmp/out bash bench/device-run.sh dpo
#   preempt  one GPU, about 2 minutes: a preemption's checkpoint, one rank's shards of the 1.5B
#            run on 8 workers written (local disk and /dev/shm) and copied to local storage
#            (bench.emergency_save; the S3 upload itself: the same command from a GPU pod)
#   preempt-poll one GPU, under 3 minutes: what the per-step preemption check costs: 300 calls of
#            ray.train.get_preemption_info() beside a barrier and an all_reduce, then the job
#            (POLL_MODEL, default qwen2.5-0.5b, eager) with and without polls, A/B/A/B
#            (bench.preemption_poll). CPU rehearsal:
#            POLL_MODEL=tiny SEQ=64 OUT=/tmp/out bash bench/device-run.sh preempt-poll
#   kernels  one GPU, about 5 minutes: Liger-Kernel's fused RMSNorm, SwiGLU and rotary kernels
#            against compile's own fusion, MODEL full fine-tuning at micro-batch 8, compiled and
#            eager (bench variants ours-liger*; the liger-kernel wheel carried in .whl: the
#            machine reaches no index). CPU rehearsal (the liger rows are import errors there):
#            MODEL=tiny SEQ=64 OUT=/tmp/out bash bench/device-run.sh kernels
#   harness  one GPU, about 2 minutes: lm-eval seconds per 100 examples (bench.harness_time)
#            CPU rehearsal: MODEL=tiny OUT=/tmp/out bash bench/device-run.sh harness
# Afterwards, here: copy $OUT's JSON into bench/runs/<date>/ and run `python -m bench.results`
# (RESULTS.md) and `python -m bench.calibrate --fit bench/runs/<date>/calibration.json`.
# MODEL/SEQ/WORKERS override the shape for a CPU rehearsal of the flags (tests/bench/test_runbook.py
# checks that every variant named here exists in bench/benchmark.py).
set -uo pipefail
: "${OUT:?OUT must name the folder that comes back}"
PART=${1:?usage: device-run.sh sockets|jobs|nvlink|recheck|precision|trust|fine-tune|pretrained|lora|lora-l4|family|dpo|preempt|preempt-poll|kernels|harness}
MODEL=${MODEL:-qwen2.5-1.5b} SEQ=${SEQ:-2048} WORKERS=${WORKERS:-2} LARGE=${LARGE:-qwen2.5-7b}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
SOCKETS=(env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
BENCH=(python3 -m bench --model "$MODEL" --seq-len "$SEQ" --warmup 2 --steps 3)
JOB=(python3 -m training --model "$MODEL" --seq-len "$SEQ" --num-workers "$WORKERS" --data repeat
     --warmup-steps 0 --lr 3e-4 --log-every 1 --checkpoint-every 0 --storage-path /tmp/runs
     --on-fallback warn)
TOKENS=$((WORKERS * 16 * SEQ))  # 16 sequences per GPU per optimizer step
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, transformers, ray; print('torch', torch.__version__, 'transformers', transformers.__version__, 'ray', ray.__version__)"
  date -u
} 2>&1 | tee "$OUT/$PART-gpu.txt"
case "$PART" in
sockets)
  timeout 330 "${SOCKETS[@]}" "${BENCH[@]}" --micro-batch-size 4 --grad-accum 4 \
    --variants reference,ours,ours-bf16-reduce,ours-hsdp-bf16-reduce,ours-bf16-reduce-prefetch2 \
    --label "sockets proxy, mb 4 x 4 accumulated, levers added in turn" \
    --json-out "$OUT/sockets-accum.json" 2>&1 | tee "$OUT/sockets.log"
  timeout 200 "${SOCKETS[@]}" "${BENCH[@]}" --micro-batch-size 4 \
    --variants reference,ours,ours-bf16-reduce \
    --label "sockets proxy, mb 4, no accumulation" \
    --json-out "$OUT/sockets-noaccum.json" 2>&1 | tee -a "$OUT/sockets.log"
  ;;
jobs)
  # The same 16 x TOKENS tokens: 16 steps of one micro-batch vs 4 steps accumulated.
  timeout 130 "${SOCKETS[@]}" "${JOB[@]}" --tokens-per-step $((TOKENS / 4)) --steps 16 \
    --name sockets-noaccum 2>&1 | tee "$OUT/jobs.log"
  timeout 130 "${SOCKETS[@]}" "${JOB[@]}" --tokens-per-step "$TOKENS" --steps 4 \
    --name sockets-accum 2>&1 | tee -a "$OUT/jobs.log"
  for run in "fsdp-fp32" "hsdp-fp32 --hsdp-replicas 2" "fsdp-bf16 --reduce-dtype bf16"; do
    set -- $run
    timeout 110 "${JOB[@]}" --tokens-per-step "$TOKENS" --steps 6 --no-compile --name "$@" \
      2>&1 | tee -a "$OUT/jobs.log"
  done
  ;;
nvlink)
  timeout 220 "${BENCH[@]}" --micro-batch-size 8 --variants reference,ours,ours-bf16-reduce \
    --label "NVLink no-regression, micro-batch 8" --json-out "$OUT/nvlink-mb8.json" \
    2>&1 | tee "$OUT/nvlink.log"
  timeout 150 "${JOB[@]}" --tokens-per-step "$TOKENS" --steps 4 --memory-budget-gib 22 \
    --name l4-budget 2>&1 | tee -a "$OUT/nvlink.log"
  ;;
recheck)  # after the peak-memory fix: clean NVLink peaks; the planner's micro-batch under sockets
  timeout 200 "${BENCH[@]}" --micro-batch-size 8 --variants reference,ours \
    --label "NVLink, micro-batch 8, peak before the compute probe" \
    --json-out "$OUT/nvlink-mb8-recheck.json" 2>&1 | tee "$OUT/recheck.log"
  timeout 240 "${SOCKETS[@]}" "${BENCH[@]}" --micro-batch-size 8 --grad-accum 2 \
    --variants reference,ours-bf16-reduce \
    --label "sockets proxy, mb 8 x 2 accumulated (the planner's choice for 65,536 tokens/step)" \
    --json-out "$OUT/sockets-mb8x2.json" 2>&1 | tee -a "$OUT/recheck.log"
  ;;
precision)  # one GPU: bf16 vs fp32 gradient accumulation over 16 micro-batches
  timeout 230 python3 -m bench.precision --model "$MODEL" --seq-len "$SEQ" --steps 3 \
    --json-out "$OUT/precision.json" 2>&1 | tee "$OUT/precision.log"
  ;;
trust)  # one GPU; each step's JSON is written even when a later one fails
  timeout 190 python3 -m bench.calibrate --model "$MODEL" --seq-len "$SEQ" \
    --json-out "$OUT/calibration.json" 2>&1 | tee "$OUT/trust.log"
  timeout 230 python3 -m bench.checkpoints --storage-path /tmp/ckpt-bench --steps 40 \
    --json-out "$OUT/checkpoints.json" 2>&1 | tee -a "$OUT/trust.log"
  timeout 90 "${BENCH[@]}" --micro-batch-size 4 --grad-accum 4 \
    --variants reference,reference-no-sync \
    --label "world size 1: FSDP1 reference with and without no_sync()" \
    --json-out "$OUT/reference-no-sync-ws1.json" 2>&1 | tee -a "$OUT/trust.log"
  ;;
fine-tune)  # one GPU: packed rows with a document mask vs causal; loading the 1.5B
  # weights on every rank vs rank 0 + broadcast (time on the GPU, host memory of 4 ranks)
  timeout 170 "${BENCH[@]}" --micro-batch-size 4 --variants ours,ours-docs4,ours-docs4-flex \
    --label "4 documents per row, document mask (sdpa dense vs flex block-sparse) vs causal" \
    --json-out "$OUT/docmask.json" 2>&1 | tee "$OUT/fine-tune.log"
  timeout 150 python3 -m bench.loading --shape "$MODEL" --runs cuda:1,cpu:4 \
    --out "$OUT/loading.json" 2>&1 | tee -a "$OUT/fine-tune.log"
  ;;
pretrained)  # one GPU: the root's lazy init used to run on the meta parameters of a pretrained
  # --model when accumulation and reduce dtypes differ (torch's _validate_no_meta_params)
  python3 -c "from transformers import AutoModelForCausalLM as M; from training.model.model import model_config as c; M.from_config(c('tiny', 257)).save_pretrained('/tmp/pretrained-tiny')"
  timeout 170 python3 -m training --model /tmp/pretrained-tiny --tokenizer bytes \
    --data training/data/sample_data/instructions.jsonl --num-workers 1 --seq-len 256 \
    --micro-batch-size 4 --grad-accum 4 --accum-dtype fp32 --reduce-dtype bf16 --steps 6 \
    --log-every 1 --checkpoint-every 0 --storage-path /tmp/runs --name pretrained-fp32-accum \
    --export 2>&1 | tee "$OUT/pretrained.log"
  tail -n 1 "$OUT/pretrained.log" > "$OUT/pretrained.json"
  cp /tmp/runs/pretrained-fp32-accum/hf_model/generation_config.json \
    "$OUT/pretrained-generation-config.json"
  ;;
lora)  # one GPU: LoRA on FSDP2 ; the 7B row at 512 tokens: its bf16 base alone is 14 GiB
  python3 -c "import peft; print('peft', peft.__version__)" 2>&1 | tee "$OUT/lora.log"
  timeout 340 python3 -m bench.lora --model "$MODEL" --large-model "$LARGE" --seq-len "$SEQ" \
    --large-seq-len 512 --steps 12 --memory-budget-gib 22 \
    --json-out "$OUT/lora.json" 2>&1 | tee -a "$OUT/lora.log"
  ;;
lora-l4)  # one GPU: naive PEFT vs ours under an L4's budget, the same call; the LoRA grid
  timeout 100 python3 -m bench.lora --model "$MODEL" --large-model "$LARGE" --steps 5 \
    --runs naive-large --large-seq-len 2048 --naive-micro-batch 2 \
    --json-out "$OUT/lora-naive.json" 2>&1 | tee "$OUT/lora-l4.log"
  [ "${NAIVE_CAUSAL:-1}" = 0 ] || timeout 100 python3 -m bench.lora --model "$MODEL" \
    --large-model "$LARGE" --steps 5 --runs naive-large --large-seq-len 2048 \
    --naive-micro-batch 2 --naive-causal \
    --json-out "$OUT/lora-naive-causal.json" 2>&1 | tee -a "$OUT/lora-l4.log"
  timeout 120 python3 -m bench.lora --model "$MODEL" --large-model "$LARGE" --steps 6 \
    --runs lora-large --large-seq-len 2048 --memory-budget-gib 22 --profile-dir "$OUT" \
    --json-out "$OUT/lora-l4-2048.json" 2>&1 | tee -a "$OUT/lora-l4.log"
  [ "${LORA_SDPA:-1}" = 0 ] || timeout 120 python3 -m bench.lora --model "$MODEL" \
    --large-model "$LARGE" --steps 6 --runs lora-large --large-seq-len 2048 \
    --memory-budget-gib 22 --attention sdpa --profile-dir "$OUT/sdpa" \
    --json-out "$OUT/lora-l4-2048-sdpa.json" 2>&1 | tee -a "$OUT/lora-l4.log"
  timeout 100 python3 -m bench.lora --model "$MODEL" --large-model "$LARGE" --steps 6 \
    --runs lora-large --large-seq-len 512 --memory-budget-gib 22 --profile-dir "$OUT" \
    --json-out "$OUT/lora-l4-512.json" 2>&1 | tee -a "$OUT/lora-l4.log"
  [ "${LORA_GRID:-1}" = 0 ] || timeout 230 python3 -m bench.calibrate --grid lora \
    --model "$MODEL" --large-model "$LARGE" --steps 3 --json-out "$OUT/lora-calibration.json" \
    2>&1 | tee -a "$OUT/lora-l4.log"
  ;;
family)  # one GPU, under 8 minutes: the planner's LoRA estimate on each built-in family shape at
  # --seq-len SEQ against the measured peak; Gemma-3-12B's 22 GiB bf16 base alone fills an L4's
  # budget, so it plans under 40 (WIDE). CPU rehearsal: FAMILIES=tiny WIDE=tiny SEQ=64 OUT=...
  for LARGE in ${FAMILIES:-llama3.1-8b qwen3-8b ministral-8b}; do
    timeout 105 python3 -m bench.lora --large-model "$LARGE" --large-seq-len "$SEQ" \
      --runs lora-large --steps 5 --memory-budget-gib 22 \
      --json-out "$OUT/family-planner-$LARGE.json" 2>&1 | tee -a "$OUT/family.log"
    echo "$LARGE done at ${SECONDS}s" | tee -a "$OUT/family.log"
  done
  for LARGE in ${WIDE:-gemma3-12b}; do
    timeout 140 python3 -m bench.lora --large-model "$LARGE" --large-seq-len "$SEQ" \
      --runs lora-large --steps 5 --memory-budget-gib 40 \
      --json-out "$OUT/family-planner-$LARGE-b40.json" 2>&1 | tee -a "$OUT/family.log"
    echo "$LARGE done at ${SECONDS}s" | tee -a "$OUT/family.log"
  done
  ;;
dpo)  # one GPU: a DPO step, 7B LoRA under 22 GiB and 1.5B full (the 7B row at 512 tokens)
  timeout 230 python3 -m bench.dpo --model "$MODEL" --large-model "$LARGE" --seq-len "$SEQ" \
    --large-seq-len 512 --steps 8 --memory-budget-gib 22 \
    --json-out "$OUT/dpo.json" 2>&1 | tee "$OUT/dpo.log"
  ;;
preempt)  # one GPU: how long one rank's preemption checkpoint takes
  timeout 200 python3 -m bench.emergency_save --model "$MODEL" --world 8 --repeats 2 \
    --storage-path /tmp/emergency-save-storage --json-out "$OUT/emergency-save.json" \
    2>&1 | tee "$OUT/preempt.log"
  ;;
preempt-poll)  # one GPU: the poll's cost per call and in the job's step (JSON kept per run)
  timeout 175 python3 -m bench.preemption_poll --num-workers 1 --calls 300 \
    --model "${POLL_MODEL:-qwen2.5-0.5b}" --seq-len "$SEQ" --micro-batch-size 4 --steps 30 \
    --pairs 2 --storage-path /tmp/preemption-poll-bench \
    --json-out "$OUT/preemption-poll.json" 2>&1 | tee "$OUT/preempt-poll.log"
  ;;
kernels)  # one GPU: fused Triton kernels (Liger-Kernel) vs compile, the same batches
  python3 -c "import importlib.metadata as m; print('liger-kernel', m.version('liger-kernel'))" \
    2>&1 | tee "$OUT/kernels.log"
  timeout 420 "${BENCH[@]}" --micro-batch-size 8 \
    --variants ours,ours-liger,ours-eager,ours-liger-eager \
    --label "Liger-Kernel RMSNorm + SwiGLU + RoPE vs compile, micro-batch 8" \
    --json-out "$OUT/kernels.json" 2>&1 | tee -a "$OUT/kernels.log"
  ;;
harness)  # one GPU, about 2 minutes: lm-eval's seconds per 100 examples of the shipped task for
  # the default shape (bench.harness_time); needs lm_eval 0.4.13 installed there (no PyPI)
  python3 -c "import lm_eval; print('lm_eval', lm_eval.__version__)" 2>&1 | tee "$OUT/harness.log"
  timeout 200 python3 -m bench.harness_time --model "$MODEL" --limit 100 \
    2>&1 | tee -a "$OUT/harness.log"
  tail -n 1 "$OUT/harness.log" > "$OUT/harness.json"
  ;;
*) echo "unknown part $PART" >&2; exit 2 ;;
esac
