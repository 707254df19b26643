#!/usr/bin/env bash
# GPU check (device machine): the transformers-path analogue of paper Fig. 2-right (prefill time, base vs SwiftKV
# at 50% and 25% skipped) and Fig. 3 (combined throughput vs input length, 256 output tokens; base, SwiftKV 50%,
# SwiftKV 50% + 4-way AcrossKV, with the KV cache and allocator peak of each), on a Llama-3.1-8B-shaped model with
# random weights (speed does not depend on the weights), bf16, one GPU. No hub, no vLLM. ~6 minutes on one H200.
#
#   workflow/scripts/gpu_bench.sh [OUTDIR]          OUTDIR default: $OUT, else results/bench/gpu
#
# Needs python3 with CUDA torch, tqdm and transformers==5.24.0 (the SwiftKV classes are diffs on that version):
# if .whl/ holds wheels (e.g. transformers-5.24.0-py3-none-any.whl) they are installed to /tmp/site first.
# Smoke test on a CPU with a tiny config:
#   CONFIG=tiny.json DEVICE=cpu DTYPE=float32 PREFILL_LENGTHS="16 32" SERVE_LENGTHS="16" OUTPUT_LEN=4 \
#   NUM_REQUESTS=2 ACROSSKV=2 workflow/scripts/gpu_bench.sh /tmp/gpu-smoke
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-results/bench/gpu}}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
config=${CONFIG:-config/models/llama-3.1-8b-instruct.json}
device=${DEVICE:-cuda}
dtype=${DTYPE:-bfloat16}
g=${ACROSSKV:-4}
layers=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['num_hidden_layers'])" "$config")
l=$((layers / 2))

{
    echo "# $(date -u +%FT%TZ) $(hostname)"
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
} | tee "$out/environment.txt"

# Fig. 2-right: prefill forward (prompt -> next-token logits), l = L/2 and 3L/4 kept, interleaved repeats
python3 -m swiftkv.cli bench prefill "$config" --device "$device" --dtype "$dtype" \
    --lengths ${PREFILL_LENGTHS:-2048 8192 32768} --fractions 0.5 0.75 --warmup 2 --repeats 5 \
    --output "$out/prefill.json" 2>&1 | tee "$out/prefill.log"

# Fig. 3: batched generate(), combined (input + output) tokens/s, plus KV-cache bytes and CUDA allocator peak
python3 -m swiftkv.cli bench serve "$config" --engine hf --study throughput --device "$device" --dtype "$dtype" \
    --input-lens ${SERVE_LENGTHS:-2048 8192} --output-len "${OUTPUT_LEN:-256}" \
    --num-requests "${NUM_REQUESTS:-8}" --batch-size "${NUM_REQUESTS:-8}" --warmup 1 --repeats 3 \
    --variant base --variant "swiftkv-50=$l" --variant "swiftkv-50-acrosskv-$g=$l,$g" \
    --output "$out/throughput.json" 2>&1 | tee "$out/throughput.log"
echo "results in $out: environment.txt prefill.json throughput.json (+ logs)"
