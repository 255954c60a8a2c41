#!/usr/bin/env bash
# A/B of the public traces between a base commit and the working tree, on one machine: hosts
# differ by a few percent, so only numbers from one machine compare.
#
#   bash scripts/ab_bench.sh prepare BASE [REV...]  # here: BASE's tree into .ab/base, each REV's
#                                            # into .ab/rev-REV (a bisection; ignored by git)
#   bash scripts/ab_bench.sh run [ROUNDS]    # on the GPU (carry .ab): every tree's engine of PRESET,
#                                            # each timed by its own tree's benchmark, alternately
#                                            # (each round starts one tree later),
#                                            # on the traces of SUITE (public, hidden, serving);
#                                            # HARNESS=base or head times both engines with that
#                                            # tree's benchmark instead (engine vs harness);
#                                            # BUDGET_GIB=8: each engine rendered with that
#                                            # memory budget, as run.sh writes it, where its
#                                            # tree's renderer takes one (else none, said);
#                                            # BENCH_ARGS: more flags for the benchmark (the
#                                            # ceilings given: --bandwidth-gbs 4008 --tflops 768);
#                                            # MODEL_CONFIG, WEIGHT_DIR: another model (toy
#                                            # weights generated where WEIGHT_DIR has none)
#
# Writes one JSON line per round, tree and trace to ${OUT:-.ab}/ab.jsonl and prints the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PRESET=${PRESET:-slab-triton-pdl-allgraphs}
SUITE=${SUITE:-public}
HARNESS=${HARNESS:-own}
MODEL_CONFIG=${MODEL_CONFIG:-target/model_config.json}
WEIGHT_DIR=${WEIGHT_DIR:-target/weights}
case "${1:-}" in
prepare)
    [ -n "${2:-}" ] || { echo "usage: ab_bench.sh prepare BASE [REV...]" >&2; exit 2; }
    rm -rf .ab/base .ab/rev-*
    shift
    for rev in "$@"; do
        dir=.ab/rev-$(git rev-parse --short "$rev")
        [ "$rev" = "$1" ] && dir=.ab/base
        mkdir -p "$dir"
        # sweep/ where the tree has it (it left search/ later)
        git archive "$rev" variants evaluator search target $(git ls-tree --name-only "$rev" sweep) \
            | tar -x -C "$dir"
        echo "$rev $(git rev-parse "$rev")" > "$dir/COMMIT"
    done
    ;;
run)
    [ -d .ab/base ] || { echo "error: no .ab/base: run 'ab_bench.sh prepare BASE' first" >&2; exit 2; }
    out=${OUT:-.ab}
    root=$PWD
    [ -f "$WEIGHT_DIR/model.pt" ] || "$PY" scripts/generate_toy_weights.py \
        --config "$MODEL_CONFIG" --output "$WEIGHT_DIR/model.pt" > /dev/null
    trees=(.ab/base $(ls -d .ab/rev-* 2>/dev/null || true) .)
    for tree in "${trees[@]}"; do
        (cd "$tree" && PYTHONPATH=$PWD "$PY" -c "
import inspect
from variants.presets import PRESETS; from variants.render import render_engine
budget = {}
if '${BUDGET_GIB:-}' and 'memory_budget_gib' in inspect.signature(render_engine).parameters:
    budget['memory_budget_gib'] = float('${BUDGET_GIB:-0}')
render_engine(PRESETS['$PRESET'], '$root/.ab/engine_${tree//[.\/]/}.py', **budget)
print('$tree: memory budget', budget.get('memory_budget_gib', 'none'), 'GiB')")
    done
    for round in $(seq 1 "${2:-3}"); do
        # each round starts one tree later: no tree always runs after the same one
        for i in "${!trees[@]}"; do
            tree=${trees[$(( (i + round - 1) % ${#trees[@]} ))]}
            name=${tree//[.\/]/}
            case $HARNESS in base) bench=.ab/base ;; head) bench=. ;; *) bench=$tree ;; esac
            log="$out/ab_${SUITE}_${HARNESS}_${round}_${name:-head}.log"
            rm -f .ab/last.json
            # one tree that fails (an old tree on this machine) leaves the others' numbers
            (cd "$bench" && PYTHONPATH=$PWD "$PY" evaluator/benchmark_throughput.py \
                --engine "$root/.ab/engine_$name.py" --model-config "$root/$MODEL_CONFIG" \
                --weight-dir "$root/$WEIGHT_DIR" --device cuda --suite "$SUITE" \
                --json "$root/.ab/last.json" ${BENCH_ARGS:-} > "$log" 2>&1) \
                || { echo "error: ${name:-head}'s benchmark failed: $log" >&2; continue; }
            "$PY" scripts/ab_rows.py add "$out/ab.jsonl" .ab/last.json "round=$round" \
                "tree=${name:-head}" "place=$i" "harness=$HARNESS"
        done
    done
    "$PY" scripts/ab_rows.py medians "$out/ab.jsonl"
    ;;
*)
    echo "usage: ab_bench.sh prepare BASE [REV...] | run [ROUNDS]" >&2
    exit 2
    ;;
esac
