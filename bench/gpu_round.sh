#!/usr/bin/env bash
# The GPU checks of one lent device session, in one call (a few minutes on an H200):
#
#   bash bench/gpu_round.sh OUT_DIR [STATE_MIB] [REPEATS]
#
# 1. gpu.txt: nvidia-smi and torch;
# 2. the pre-restart health check (amlhpc.jobs.runtime.health.quick) against a baseline taken
#    just before: its verdict on a healthy GPU and its seconds;
# 3. llm-pretrain (llama3.2-1b, 40 steps of 2 x 4096 tokens) through the in-job launcher with
#    background checkpoints at steps 20 and 40: MFU, the stall per save inside training, and the
#    progress file's own-work median (CUDA events: the device's time per step, not the host's);
# 4. bench.checkpoint's stall on the GPU: a state of STATE_MIB (default 14144 MiB: llama3.2-1b's
#    fp32 weights and Adam's two moments, 1.236 B parameters x 12 bytes) on the device, saved
#    synchronously against in the background, REPEATS (default 5) warm saves each, interleaved,
#    files in /dev/shm (the fastest disk a node has: the synchronous save at its cheapest, the
#    ratio at its hardest), then the same command again as its rerun (--rerun-of the first);
# 5. bench.writer_beside with 8 writer threads and a 4 GiB state (staged in page-locked memory
#    here): does the background write slow a host-bound loop in its process, and a forked one?
#
# Needs python3 with torch (CUDA) and the NVML bindings; no Azure, no network. Each step has
# its own timeout, so a slow one leaves the others their time.
set -u
out=${1:?usage: bench/gpu_round.sh OUT_DIR [STATE_MIB] [REPEATS]}
state_mib=${2:-14144}
repeats=${3:-5}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
say() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$out/gpu.txt"; }

{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv 2>&1
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'
  nproc; free -g | head -2; df -h /dev/shm | tail -1; git rev-parse --short HEAD 2>/dev/null; } >> "$out/gpu.txt" 2>&1

# 2. The pre-restart check, as the launcher runs it before an in-job restart.
start=$(date +%s.%N)
timeout 60 "$py" - > "$out/quick.txt" 2>&1 <<'EOF'
import time
from amlhpc.jobs.runtime.health import quick
started = time.perf_counter()
start = quick.baseline()
taken = time.perf_counter() - started
failed = quick.before_restart(start)
print(f"baseline {taken:.2f} s, check {time.perf_counter() - started - taken:.2f} s; gpus {start!r}")
print("failed:", [r.line() for r in failed] or "none")
EOF
say "quick check: exit $? ($(tail -2 "$out/quick.txt" | tr '\n' ' '))"

# 3. llm-pretrain through the launcher.
one_rank() {
  env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 NODE_RANK=0 GROUP_RANK=0 \
      MASTER_ADDR=127.0.0.1 MASTER_PORT="$1" "${@:2}"
}
run="$out/llm/node0"
ckpt_root=/dev/shm/amlhpc-ckpt
mkdir -p "$run/user_logs" "$run/outputs"
rm -rf "$ckpt_root"
start=$(date +%s)
(cd "$run" && one_rank 29500 env AMLHPC_CHECKPOINT_DIR="$ckpt_root" AMLHPC_TELEMETRY_INTERVAL_S=1 AMLHPC_HEALTH=off \
    AMLHPC_PIN=auto AMLHPC_REPORT_DIR=outputs/aml-hpc \
    timeout 150 "$py" -m amlhpc.jobs.runtime.launch -- \
    "$py" -m amlhpc.jobs.workloads.llm.train --model llama3.2-1b --steps 40 --seq-len 4096 --micro-batch 2 \
      --warmup-steps 5 --checkpoint-every 20 --log-every 1 --output-dir outputs) \
  > "$run/user_logs/std_log_process_0.txt" 2>&1
say "llm: exit $? in $(( $(date +%s) - start )) s: $(grep -h '"checkpoint_step"' "$run/user_logs/std_log_process_0.txt" | tr '\n' ' ')"
find "$run" /tmp -path '*progress*' -name '*.json' 2>/dev/null | head -4 | while read -r f; do
  echo "$f: $(cat "$f")" >> "$out/progress.txt"; done
grep -h -i "mfu\|tokens/s" "$run/user_logs/std_log_process_0.txt" | tail -3 >> "$out/gpu.txt"
rm -rf "$ckpt_root"

# 4. The stall of a llama3.2-1b-sized state on the GPU, then its rerun.
for pass in 1 2; do
  rerun=""; [ "$pass" = 2 ] && rerun="--rerun-of $out/ckpt1/checkpoint.json"
  if [ "$pass" = 2 ] && [ "$SECONDS" -gt "${RERUN_BEFORE_S:-330}" ]; then
    say "checkpoint pass 2 not run: $SECONDS s gone (the rerun starts only before ${RERUN_BEFORE_S:-330} s)"; break
  fi
  start=$(date +%s)
  TMPDIR=/dev/shm timeout 200 "$py" -m bench.checkpoint --skip restore,recovery --device cuda --no-baselines \
    --state-mib "$state_mib" --repeats "$repeats" --out "$out/ckpt$pass" $rerun > "$out/ckpt$pass.log" 2>&1
  say "checkpoint pass $pass: exit $? in $(( $(date +%s) - start )) s"
  grep -h "ours\|writer" "$out/ckpt$pass/checkpoint.md" 2>/dev/null | tee -a "$out/gpu.txt"
done
# 5. The host beside the writer (llm-pretrain's steps ran 3.4x slower during a write on 2026-11-29).
start=$(date +%s)
timeout 150 "$py" -m bench.writer_beside --mib 4096 --writers 8 --repeats 3 > "$out/writer_beside.txt" 2>&1
say "writer beside: exit $? in $(( $(date +%s) - start )) s: $(tail -2 "$out/writer_beside.txt" | tr '\n' ' ')"
cat "$out/gpu.txt"
