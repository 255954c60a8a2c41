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
# Installed, without importing it (transformers takes seconds to import).
findable() {
    "$PYTHON" -c "import importlib.util as u, sys; sys.exit(u.find_spec(sys.argv[1]) is None)" \
        "$1" 2>/dev/null
}

# The modules named that do not import, a line each: one interpreter for all (one each took
# seconds of the budget, torch imported again and again).
missing() {
    "$PYTHON" -c '
import importlib, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception:
        print(name)
' "$@" 2>/dev/null
}

# Whether the target is a Hugging Face folder (its weights are not the course's model.pt), whose
# judge is transformers' own model of its architecture.
hf_folder() {
    local config="" weights="" prev=""
    for arg in "$@"; do
        case $prev in --model-config) config=$arg ;; --weight-dir) weights=$arg ;; esac
        case $arg in --model-config=*) config=${arg#*=} ;; --weight-dir=*) weights=${arg#*=} ;; esac
        prev=$arg
    done
    [[ -n $config && ! -e ${weights:-$(dirname "$config")}/model.pt ]]
}

# The budget is the user's wall clock: it counts from here, or from the end of an install.
started=${EPOCHREALTIME:-$(date +%s)}
if [[ " $* " != *" --help "* && " $* " != *" -h "* ]]; then
    absent=" $(missing torch numpy tqdm optuna evaluator variants search sweep | tr '\n' ' ')"
    if [[ $absent == *" torch "* ]]; then
        say "torch is missing: installing it"
        pip_install torch || { say "cannot install torch; giving up"; exit 1; }
    fi
    # Install only what is missing, one package at a time, never a second torch.
    for pkg in numpy tqdm optuna; do
        if [[ $absent == *" $pkg "* ]] && ! importable "$pkg"; then
            say "$pkg is missing: installing it"
            pip_install "$pkg" || say "could not install $pkg (offline?); going on without it"
        fi
    done
    if hf_folder "$@" && ! findable transformers; then
        say "transformers is missing (the judge of a Hugging Face folder): installing it"
        pip_install transformers || say "could not install transformers (offline?)"
        absent+="transformers "
    fi
    if [[ $absent =~ \ (evaluator|variants|search|sweep)\  ]]; then
        # `python -m` from the repository root finds the packages anyway; this makes the
        # installed project point here too, without touching its dependencies.
        pip_install --no-deps -e . >/dev/null 2>&1 || true
    fi
    [[ $absent == " " ]] || started=${EPOCHREALTIME:-$(date +%s)}
fi
export AUTOTUNER_STARTED_AT=${started/,/.}  # (a locale may write a decimal comma)

exec "$PYTHON" -m search run "$@"
