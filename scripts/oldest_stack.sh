#!/usr/bin/env bash
# Proves the oldest supported stack (README "Supported stacks"): under PyTorch 2.3 (torch==2.3.1,
# whose own pip dependency is triton 2.3.1) every CPU variant passes the correctness gate, and the
# probe offers nothing this stack lacks (no FlexAttention, SDPA GQA by expansion, no Triton
# kernels: they need triton >= 3.0). GPU variants under 2.3 are not covered (needs such a GPU).
# Optuna (>= 5.0, the search's) is not installed: the tests run here import none of it.
#
# Makes a venv ($VENV, default /tmp/venv-oldest), installs torch 2.3.1 (the CPU wheel index when
# reachable, else PyPI: ~2.5 GB with its CUDA wheels) and the tests' other deps (never a second
# torch), prints the versions and the probe, then runs the CPU correctness tests.
# Takes ~6 min on 2 cores: ~3.5 min install (2.5 GB download at 30 MB/s), 2.5 min of tests; a
# second run reuses the venv. Extra arguments go to pytest (e.g. `-x`).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-/tmp/venv-oldest}
export PIP_CONFIG_FILE=/dev/null  # this machine's pip config caps torch to the local 2.13 wheel
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
PY="$VENV/bin/python"
pip() { "$PY" -m pip install -q "$@"; }

if ! "$PY" -c "import torch; assert torch.__version__.startswith('2.3.1')" 2>/dev/null; then
    pip --retries 0 --timeout 10 --index-url https://download.pytorch.org/whl/cpu \
        "torch==2.3.1" "numpy<2" 2>/dev/null || pip "torch==2.3.1" "numpy<2"
fi
# What the selected tests import; transformers < 4.48 still supports torch 2.3 (the reference is
# checked against its LLaMA). torch==2.3.1 is repeated so pip can never swap it.
pip "torch==2.3.1" "numpy<2" pytest pytest-timeout tqdm safetensors "transformers>=4.45,<4.48"
pip --no-deps -e .

"$PY" - <<'EOF'
import dataclasses, importlib.metadata as md, json, torch
from variants.probe import _triton_version, probe_capabilities

def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None

print(f"torch {torch.__version__}, triton {version('triton')}, numpy {version('numpy')}")
caps = probe_capabilities("cpu", json.load(open("tests/data/tiny_config.json")))
print(f"probe cpu: has_flex={caps.has_flex} has_enable_gqa={caps.has_enable_gqa} "
      f"can_compile={caps.can_compile} triton_version={caps.triton_version}")
# The same stack on a GPU (fields a CUDA probe would read): are our Triton kernels offered?
gpu = dataclasses.replace(caps, device="cuda:0", device_type="cuda", compute_capability=(9, 0),
                          triton_version=_triton_version(), config_dtype="float16")
print(f"probe as cuda: triton_version={gpu.triton_version} attention choices "
      f"{gpu.choices('attention', {'cache': 'slab'})} layers {gpu.choices('layers', {})}")
EOF

# Tests needing triton >= 3.0 (kernels/, layers/test_triton_stack.py, prefill graphs) or a GPU
# are left out: this stack does not offer them.
exec "$PY" -m pytest -m "not gpu" -p no:cacheprovider \
    tests/variants/test_all_variants.py tests/variants/test_probe.py \
    tests/variants/attention tests/variants/cache tests/evaluator tests/variants/test_render.py \
    tests/variants/execution/test_compiled.py \
    tests/variants/layers/test_block.py tests/variants/layers/test_projections.py \
    tests/variants/layers/test_rmsnorm.py tests/variants/layers/test_rope.py \
    tests/variants/test_engine.py tests/variants/test_weights.py tests/variants/test_spec.py \
    tests/variants/test_hf_checkpoint.py tests/variants/test_weight_readers.py \
    "$@"
