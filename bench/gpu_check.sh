#!/usr/bin/env bash
# zerotune's GPU code paths on a real GPU, in one short run (about 7 minutes on one H200):
#   1. the bundled example tuned on the GPU (CUDA memory stats per trial, warm trials with
#      reset_peak_memory_stats and the device-memory leak check, DeepSpeed's FusedAdam);
#   2. a real CUDA out-of-memory error: the trial must end "oom", not "crashed";
#   3. bench/warm_vs_cold.py --device cuda: the same configs cold and warm (throughput and peak
#      memory side by side) and a soak of warm trials across stages 0-3 (device memory after
#      each teardown back at its level);
#   4. the memory budget on the GPU (--memory-per-device): peaks above it end "oom", and the
#      memory model prunes what it predicts will not fit;
#   5. FSDP2 beside DeepSpeed: the Trainer example tuned across both engines (CUDA memory of
#      FSDP2 trials, the engines' dtypes and losses compared), where transformers is installed;
#   6. nothing left behind: no trial process of the tunings above alive (each rank runs under
#      its waiter, forked before CUDA starts), every results folder marked as zerotune's.
#
#   bash bench/gpu_check.sh [OUT]      # OUT: where the logs and results.tgz go (default bench/results/gpu)
#
# Needs torch with CUDA, DeepSpeed, pydantic, rich, hjson and filelock importable; where a folder .whl of
# wheels is present, they are installed into /tmp/site first (a machine without a package
# registry, such as a lent device machine).
set -u
out=${1:-${OUT:-bench/results/gpu}}
work=$(mktemp -d /tmp/zerotune-gpu.XXXXXX)  # results folders, packed into $out/results.tgz at each step
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH=$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
unset DS_ACCELERATOR
py=python3

step() {
    tar czf "$out/results.tgz" -C "$work" . 2>/dev/null
    printf '\n=== %s (%s)\n' "$1" "$(date +%T)"
}

states() {  # each trial of the named results folders: state, memory, throughput, how it started
    "$py" - "$work" "$@" <<'EOF'
import json, sys
from pathlib import Path
for run in sys.argv[2:]:
    f = Path(sys.argv[1]) / run / "results.json"
    if not f.exists():
        print(run, "no results.json")
        continue
    for t in json.loads(f.read_text()).get("trials", []):
        mib = {k: max(t.get(k) or [0]) / 2**20 for k in ("peak_memory", "peak_allocated", "static_memory")}
        print(f"{run:7s} {t.get('name', '?'):16s} {t.get('state', '?'):8s} {t.get('memory_kind', ''):8s} "
              f"reserved {mib['peak_memory']:8.1f} MiB, allocated {mib['peak_allocated']:8.1f}, "
              f"static {mib['static_memory']:7.1f}; {t.get('throughput') or 0:9.1f}/s; "
              f"{t.get('start', '')[:30]}; {t.get('reason', '')[:100]}")
EOF
}

tune() {  # name, timeout, zerotune tune's arguments
    local name=$1 limit=$2 start
    shift 2
    start=$(date +%s)
    timeout "$limit" "$py" -m zerotune.cli tune --num-gpus 1 --results-dir "$work/$name" --overwrite "$@" \
        > "$out/$name.log" 2>&1
    echo "rc=$? in $(( $(date +%s) - start )) s"
    tail -n 40 "$out/$name.log"
    states "$name"
}

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$py" -c "import torch, deepspeed, sys; print('python', sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.version.cuda, 'deepspeed', deepspeed.__version__, 'gpus', torch.cuda.device_count())" || exit 1

# DeepSpeed 0.19.8's JIT builder sorts TORCH_CUDA_ARCH_LIST as numbers and fails on an
# architecture-specific entry such as 9.0a ("invalid literal for int() with base 10: '0a'", in
# every trial that builds FusedAdam): where one is set, the device's own capability instead.
case "${TORCH_CUDA_ARCH_LIST:-}" in
    *[0-9][a-z]*)
        echo "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST, which DeepSpeed cannot parse: set to the device's capability"
        TORCH_CUDA_ARCH_LIST=$("$py" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
        export TORCH_CUDA_ARCH_LIST ;;
esac

step "DeepSpeed's FusedAdam, built once (JIT) before the trials"
start=$(date +%s)
timeout 120 "$py" -c "from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load(verbose=False)" \
    > "$out/fused_adam_build.log" 2>&1
echo "rc=$? in $(( $(date +%s) - start )) s"
tail -n 3 "$out/fused_adam_build.log"

step "1. zerotune tune, the bundled example on one GPU"
tune tune 120 examples/gpt.py --deepspeed_config examples/ds_config.json

step "2. a real CUDA out-of-memory error (medium model, micro-batch 8192, stage 0): 'oom' expected"
cat > "$work/oom_ds.json" <<'EOF'
{"train_micro_batch_size_per_gpu": 8192, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "zero_optimization": {"stage": 0}, "autotuning": {"enabled": true}}
EOF
tune oom 60 examples/gpt.py --model medium --deepspeed_config "$work/oom_ds.json"

step "3. warm against cold on the GPU"
timeout 150 "$py" bench/warm_vs_cold.py --device cuda --num-gpus 1 --skip-choice --soak 8 \
    --out "$work/warm_vs_cold" > "$out/warm_vs_cold.log" 2>&1
echo "rc=$?"
tail -n 20 "$out/warm_vs_cold.log"

step "4. the memory budget on the GPU (--memory-per-device 600MB)"
tune budget 90 --memory-per-device 600MB examples/gpt.py --deepspeed_config examples/ds_config.json

step "5. FSDP2 beside DeepSpeed on the GPU (the Trainer example, --engines deepspeed,fsdp), where transformers imports"
if "$py" -c "import transformers, accelerate" 2>/dev/null; then
    tune engines 150 --engines deepspeed,fsdp examples/hf_trainer.py --deepspeed examples/ds_config_hf_trainer.json \
        --output_dir "$work/hf_out" --per_device_train_batch_size 8 --gradient_accumulation_steps 2 --max_steps 60 \
        --report_to none --save_strategy no --n_layer 2 --n_embd 128
    grep -E "^engine |engines:" "$work/engines/summary.txt"
else
    echo "skipped: transformers and accelerate are not importable here"
fi

step "6. nothing left behind: trial processes alive (0 expected), results folders zerotune's"
"$py" - "$work" <<'EOF'
import json, os, sys
from pathlib import Path
work = str(Path(sys.argv[1]).resolve())
alive = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
    except OSError:
        continue
    if f"ZEROTUNE_RESULTS={work}" in env:
        alive.append(pid)
print("trial processes alive:", len(alive), alive[:5])
for run in ("tune", "oom", "budget", "engines"):
    try:
        record = json.loads((Path(work) / run / "tuning.json").read_text())
    except (OSError, ValueError) as e:
        print(run, "no tuning.json:", type(e).__name__)
        continue
    print(run, "zerotune's:", "zerotune" in record, "state:", record.get("state"), "made:", len(record.get("made", [])))
EOF

step "done"
