#!/usr/bin/env bash
# The test entry (README): installs what the tests need when missing, then ruff and pytest.
# Honours PYTHON; extra arguments go to pytest (e.g. `bash scripts/test.sh -k render`).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    # The CPU build from the local file where one exists; a bare `pip install torch` would pull
    # a multi-GB CUDA build.
    "$PYTHON" -m pip install -q "torch==2.13.0" || "$PYTHON" -m pip install -q "torch>=2.3"
fi
DEV_MODULES="optuna, pytest, xdist, ruff, transformers, importlinter, hypothesis, nbclient, gguf, psycopg, variants"
if ! "$PYTHON" -c "import $DEV_MODULES" 2>/dev/null; then
    "$PYTHON" -m pip install -q -e ".[dev]"
fi
if ! "$PYTHON" -c "import triton" 2>/dev/null; then
    # Triton's interpreter runs our kernels' tests on the CPU; without it those tests skip.
    "$PYTHON" -m pip install -q triton || echo "triton not installable: kernel tests will skip"
fi

"$PYTHON" -m ruff check .
"$PYTHON" -m ruff format --check .
# The layering contracts of pyproject.toml: the judge imports nothing of what it judges.
lint-imports --no-cache
# Two workers (TEST_WORKERS; 0: none), a test file each at a time: the files' fixtures (one
# SmolLM2 import, one notebook kernel) stay within one worker. 41 -> 23 minutes on 2 cores.
workers=${TEST_WORKERS:-2}
parallel=()
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadfile)
exec "$PYTHON" -m pytest -m "not gpu" ${parallel[@]+"${parallel[@]}"} "$@"
