#!/usr/bin/env bash
# What a checkpoint costs the training on a GPU: llm-pretrain saving a version every STEPS/2
# steps, in the background (the default) and in the loop (--sync-checkpoints).
# Each run prints one {"checkpoint_step": N, "stall_s": S} line per save (the seconds
# common.save_state held the training) and keeps them in its metrics.json.
#
#   bash bench/gpu_checkpoint.sh OUT_DIR [MODEL] [STEPS] [MODES]
#
# MODES: any of async sync (default: both). Checkpoints go to CKPT_ROOT
# (default /dev/shm/amlhpc-ckpt), emptied before and after each run.
set -u
out=${1:?usage: bench/gpu_checkpoint.sh OUT_DIR [MODEL] [STEPS] [MODES]}
model=${2:-llama3.2-1b}
steps=${3:-24}
modes=${4:-async sync}
py=${PYTHON:-python3}
ckpt_root=${CKPT_ROOT:-/dev/shm/amlhpc-ckpt}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
for mode in $modes; do
  rm -rf "$ckpt_root" "$out/$mode"; mkdir -p "$out/$mode"
  flag=""
  [ "$mode" = sync ] && flag="--sync-checkpoints"
  start=$(date +%s)
  env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 NODE_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29600 \
      AMLHPC_CHECKPOINT_DIR="$ckpt_root" \
      timeout 200 "$py" -m amlhpc.jobs.workloads.llm.train --model "$model" --steps "$steps" --seq-len 4096 --micro-batch 2 \
        --warmup-steps 5 --checkpoint-every $((steps / 2)) --log-every 1 --output-dir "$out/$mode" $flag \
      > "$out/$mode/log.txt" 2>&1
  echo "$mode: exit $? in $(( $(date +%s) - start )) s: $(grep -h '^{"checkpoint_step"' "$out/$mode/log.txt" | tr '\n' ' ')"
done | tee "$out/summary.txt"
rm -rf "$ckpt_root"
