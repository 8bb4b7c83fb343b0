#!/usr/bin/env bash
# scripts/gpu-check.sh: relaylens on one GPU from a source checkout, within 8 minutes (issue 51).
#
#   bash scripts/gpu-check.sh            # on the GPU machine, in the repository root
#
# 1. installs the wheels carried in .whl/ (what the machine's image lacks: see docs/how-to/gpu.md) into /tmp/site and
#    runs relaylens from the source tree (PYTHONPATH), so the pyproject pins (torch>=2.13) are not checked;
# 2. prints the versions; 3. times one relocate_selection at Llama-3.1-8B shape (32k history, B2048 / B8192; target
#    <= 5 ms); 4. the GPU test tier (tests/gpu, float32 / bfloat16 / float16); 5. relaylens model check on a random
#    Qwen2.5-0.5B-shaped model in float32 and bfloat16; 6. bench roofline --device cuda; 7. a short bench overhead at
#    Llama-3.1-8B shape (random weights); the decoding step dynamic vs static (eager and inductor-compiled) against
#    the weights-read floor (scripts/decoding_step_timing.py) runs after the tier. Each step has its own timeout and
#    one failure does not stop the rest.
# Results: $OUT (or ./gpu-check-out) holds gpu-check.log, one log per step and the JSON / CSV each step writes.
# Without CUDA the GPU steps say so and are skipped (a dry run of the script itself).
set -u
export PYTHONUNBUFFERED=1 RELAYLENS_SMOKE=1 TOKENIZERS_PARALLELISM=false
OUT_DIR="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu-check.log"
PY="${PYTHON:-python3}"
START=$(date +%s)
DEADLINE=${GPU_CHECK_SECONDS:-470}  # the whole script ends within this many seconds (each step's timeout is cut to fit)
say() { echo "[gpu-check +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
step() {  # step NAME SECONDS COMMAND...: run with a timeout, log to $OUT_DIR/NAME.log, never stop the script
    local name=$1 limit=$2; shift 2
    local left=$(( DEADLINE - ($(date +%s) - START) ))
    if [ "$left" -lt 15 ]; then say "$name: SKIPPED, the ${DEADLINE}s budget is spent"; echo "$name skipped" >>"$OUT_DIR/steps.txt"; return; fi
    if [ "$limit" -gt "$left" ]; then limit=$left; fi
    say "== $name (timeout ${limit}s): $*"
    timeout --kill-after=10 "$limit" "$@" >"$OUT_DIR/$name.log" 2>&1
    local rc=$?
    tail -n 40 "$OUT_DIR/$name.log" | tee -a "$LOG"
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then say "$name: TIMED OUT after ${limit}s"; else say "$name: exit $rc"; fi
    echo "$name $rc" >>"$OUT_DIR/steps.txt"
}

if compgen -G ".whl/*.whl" >/dev/null; then
    say "installing $(ls .whl/*.whl | wc -l) carried wheels into /tmp/site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        2>&1 | tail -n 5 | tee -a "$LOG"
    export PYTHONPATH="/tmp/site:$PWD"
else
    say "no .whl/ folder: using the installed packages"
    export PYTHONPATH="$PWD"
fi
"$PY" - <<'PYEOF' 2>&1 | tee -a "$LOG"
import importlib, platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
for name in ("transformers", "tokenizers", "accelerate", "numba", "gguf", "bm25s", "pandas", "typer", "relaylens"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"), getattr(module, "__file__", ""))
    except Exception as err:  # noqa: BLE001
        print(name, "NOT IMPORTABLE:", err)
PYEOF
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>&1 | tee -a "$LOG"
CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
if [ "$CUDA" != "1" ]; then
    say "NO CUDA on this machine: the GPU steps are skipped (dry run); the CPU smoke of each follows"
    step relocation_timing_cpu 120 "$PY" scripts/gpu_relocation_timing.py --device cpu --history 2048 --budgets 256 \
        --layers 4 --repeats 2 --out "$OUT_DIR"
    step gpu_tier_skips 120 "$PY" -m pytest -q -p no:randomly -p no:cacheprovider -rs tests/gpu
    step decoding_step_cpu 150 "$PY" scripts/decoding_step_timing.py --device cpu --dtype float32 \
        --model "random:qwen2.5-0.5b?num_hidden_layers=2" --kept 256 --batches 1,4 --steps 8 --repeats 1 \
        --out "$OUT_DIR"
    step model_check_cpu 200 "$PY" -m relaylens.cli model check "random:qwen2.5-0.5b?num_hidden_layers=2" --device cpu \
        --dtype float32 --history-tokens 200
    step roofline_quick_cpu 120 "$PY" -m relaylens.cli bench roofline --quick --model \
        "random:llama-3.1-8b?num_hidden_layers=1&hidden_size=256&intermediate_size=512&num_attention_heads=2&num_key_value_heads=2&vocab_size=1024" \
        --device cpu --dtype float32 --out "$OUT_DIR/roofline"
    say "dry run done"; exit 0
fi

# the order is the priority: each step's timeout keeps the whole run under ~8 minutes on an H200
step relocation_timing 90 "$PY" scripts/gpu_relocation_timing.py --device cuda --out "$OUT_DIR"
step gpu_tier 120 "$PY" -m pytest -q -p no:randomly -p no:cacheprovider -x --tb=short -rs tests/gpu \
    --junitxml="$OUT_DIR/gpu_tier.xml"
step decoding_step 120 "$PY" scripts/decoding_step_timing.py --device cuda --dtype bfloat16 \
    --model random:llama-3.1-8b --kept 8192 --batches 1,12 --steps 32 --repeats 2 --compile inductor --out "$OUT_DIR"
step model_check_float32 50 "$PY" -m relaylens.cli model check random:qwen2.5-0.5b --device cuda --dtype float32 \
    --history-tokens 700
step model_check_bfloat16 50 "$PY" -m relaylens.cli model check random:qwen2.5-0.5b --device cuda --dtype bfloat16 \
    --history-tokens 700
step roofline 50 "$PY" -m relaylens.cli bench roofline --model random:llama-3.1-8b --device cuda --dtype bfloat16 \
    --lengths 2048,8192 --repeats 2 --out "$OUT_DIR/roofline"
step long_records 40 "$PY" -m relaylens.cli data synth --n 2 --seed 0 --history-tokens 32000 \
    --tokenizer random:llama-3.1-8b --out "$OUT_DIR/long_records.json"
step overhead_8b 150 "$PY" -m relaylens.cli bench overhead --model random:llama-3.1-8b --device cuda --dtype bfloat16 \
    --data "$OUT_DIR/long_records.json" --records 2 --repeats 1 --steps 64 --budgets 2048,8192 --selectors snapkv \
    --prefill-chunk 0 --out "$OUT_DIR/overhead"
say "done in $(( $(date +%s) - START ))s; per step: $(tr '\n' ' ' <"$OUT_DIR/steps.txt")"
