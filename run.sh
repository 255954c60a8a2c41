#!/usr/bin/env bash
# The main job: check the set-up, then search, choose, verify and write workspace/engine.py and
# workspace/results.log. Exits 0 only when the written engine passed verification.
#
#   bash run.sh [--model-config PATH] [--weight-dir DIR] [--device auto|cpu|cuda[:N]]
#               [--budget-minutes N] [--trials N] [--storage URL] [--study NAME] [--fresh]
#
# The target is /target/model_config.json + /target/weights when they exist, else target/ (toy
# weights are generated when missing). Budget: 20 minutes on a GPU, 5 on a CPU. All options:
# `bash run.sh --help`. Honours PYTHON (default python3).
set -uo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python

say() { echo "run.sh: $*" >&2; }

pip_install() {
    # Short timeouts: on an offline machine this fails fast and the job goes on without.
    "$PYTHON" -m pip install -q --disable-pip-version-check --retries 1 --timeout 15 "$@"
}

importable() { "$PYTHON" -c "import $1" >/dev/null 2>&1; }

if [[ " $* " != *" --help "* && " $* " != *" -h "* ]]; then
    if ! importable torch; then
        say "torch is missing: installing it"
        pip_install torch || { say "cannot install torch; giving up"; exit 1; }
    fi
    # Install only what is missing, one package at a time, never a second torch.
    for pkg in numpy tqdm optuna; do
        if ! importable "$pkg"; then
            say "$pkg is missing: installing it"
            pip_install "$pkg" || say "could not install $pkg (offline?); going on without it"
        fi
    done
    if ! importable evaluator || ! importable variants || ! importable search \
        || ! importable sweep; then
        # `python -m` from the repository root finds the packages anyway; this makes the
        # installed project point here too, without touching its dependencies.
        pip_install --no-deps -e . >/dev/null 2>&1 || true
    fi
fi

exec "$PYTHON" -m search run "$@"
