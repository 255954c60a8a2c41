#!/usr/bin/env bash
# The course's public tests on an engine file: weights if missing, correctness, benchmark.
# Usage: bash scripts/run_public_tests.sh [ENGINE] [DEVICE]   (honours PYTHON, MODEL_CONFIG,
# WEIGHT_DIR; defaults: workspace/engine.py, cuda when available).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
ENGINE=${1:-workspace/engine.py}
DEVICE=${2:-$("$PYTHON" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")}
MODEL_CONFIG=${MODEL_CONFIG:-target/model_config.json}
WEIGHT_DIR=${WEIGHT_DIR:-target/weights}

if [ ! -f "$WEIGHT_DIR/model.pt" ]; then
    "$PYTHON" scripts/generate_toy_weights.py --config "$MODEL_CONFIG" --output "$WEIGHT_DIR/model.pt"
fi
"$PYTHON" evaluator/test_correctness.py --engine "$ENGINE" --model-config "$MODEL_CONFIG" \
    --weight-dir "$WEIGHT_DIR" --device "$DEVICE" --stress
"$PYTHON" evaluator/benchmark_throughput.py --engine "$ENGINE" --model-config "$MODEL_CONFIG" \
    --weight-dir "$WEIGHT_DIR" --device "$DEVICE"
