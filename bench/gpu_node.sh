#!/usr/bin/env bash
# One GPU node, measured the way a job measures it: the health gate in report mode against
# the catalog's marks for the size this GPU belongs to, then llm-pretrain through the in-job
# launcher (telemetry every second) with asynchronous and then synchronous checkpoints.
#
#   bash bench/gpu_node.sh OUT_DIR [MODEL] [STEPS]
#
# OUT_DIR receives: gpu.txt (nvidia-smi, torch), health/ (the node report), run-async/ and
# run-sync/ (a run folder `jobs report` reads: node0/user_logs, node0/outputs/aml-hpc),
# and one log per step. Needs python3 with torch (CUDA) and the NVML bindings; no Azure, no
# network. The GPU's size is chosen from its name (H200 -> ND96isr_H200_v5, H100 ->
# ND96isr_H100_v5); its facts come from amlhpc/core/catalog/skus.toml through AMLHPC_SKU_JSON.
# On a machine with one GPU of the size's eight, the GPU count check fails (reported, not
# fatal: report mode) and NVLink, peer copies and the all-reduce have no second GPU.
set -u
out=${1:?usage: bench/gpu_node.sh OUT_DIR [MODEL] [STEPS]}
model=${2:-llama3.2-1b}
steps=${3:-40}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv 2>&1
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'; } > "$out/gpu.txt" 2>&1
name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$name" in
  *H200*) sku=Standard_ND96isr_H200_v5 ;;
  *) sku=Standard_ND96isr_H100_v5 ;;
esac
sku_json=${SKU_JSON_DIR:-.gpu}/$sku.json
[ -f "$sku_json" ] || "$py" -c "import dataclasses, json, sys; from amlhpc.core import skus
json.dump(dataclasses.asdict(skus.get('$sku')), sys.stdout)" > "$sku_json" || exit 2
export AMLHPC_SKU_JSON="$(cat "$sku_json")"
echo "size $sku (GPU: ${name:-none})" >> "$out/gpu.txt"

one_rank() {  # what Azure ML's launcher sets for the only process of a one-node, one-GPU job
  env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 NODE_RANK=0 GROUP_RANK=0 \
      MASTER_ADDR=127.0.0.1 MASTER_PORT="$1" "${@:2}"
}

# 1. The health gate, full repetitions (the sustained GEMM mark's 60 s), report mode.
start=$(date +%s)
one_rank 29400 timeout 200 "$py" -m amlhpc.jobs.runtime.health --mode report --report-dir "$out/health" \
  > "$out/health.log" 2>&1
echo "health: exit $? in $(( $(date +%s) - start )) s" >> "$out/gpu.txt"

# 2. llm-pretrain through the launcher, checkpoints to memory (/dev/shm) every steps/2.
ckpt_root=${CKPT_ROOT:-/dev/shm/amlhpc-ckpt}
for mode in async sync; do
  run="$out/run-$mode/node0"
  mkdir -p "$run/user_logs" "$run/outputs"
  rm -rf "$ckpt_root"
  flag=""; [ "$mode" = sync ] && flag="--sync-checkpoints"
  start=$(date +%s)
  (cd "$run" && one_rank 29500 env AMLHPC_CHECKPOINT_DIR="$ckpt_root" AMLHPC_TELEMETRY_INTERVAL_S=1 AMLHPC_HEALTH=off AMLHPC_PIN=auto \
      AMLHPC_REPORT_DIR=outputs/aml-hpc PYTHONPATH="$OLDPWD${PYTHONPATH:+:$PYTHONPATH}" \
      timeout 150 "$py" -m amlhpc.jobs.runtime.launch -- \
      "$py" -m amlhpc.jobs.workloads.llm.train --model "$model" --steps "$steps" --seq-len 4096 --micro-batch 2 \
        --warmup-steps 5 --checkpoint-every $((steps / 2)) --log-every 1 --output-dir outputs $flag) \
    > "$run/user_logs/std_log_process_0.txt" 2>&1
  echo "llm $mode: exit $? in $(( $(date +%s) - start )) s" >> "$out/gpu.txt"
done
rm -rf "$ckpt_root"
cat "$out/gpu.txt"
