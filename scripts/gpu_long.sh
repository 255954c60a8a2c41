#!/usr/bin/env bash
# A command longer than one device call (the default 20-minute run.sh): started in a session of
# its own, which outlives the call while the machine stays held, then waited for by later calls
# made back to back (the machine goes back when idle).
#
#   bash scripts/gpu_long.sh start NAME CMD...   copy the tree to /tmp/long/NAME, run CMD there
#   bash scripts/gpu_long.sh wait NAME [SECONDS]  wait up to SECONDS (570), print the log's tail,
#                                                 then "NAME: done rc=N" or "NAME: running"
#
# The copy keeps the run apart from the tree the next call copies over this one. Files the run
# writes stay under /tmp/long/NAME (copy them to $OUT to bring them back).
set -uo pipefail
cd "$(dirname "$0")/.."
action=${1:?start or wait}
name=${2:?a name}
dir=/tmp/long/$name
case $action in
start)
    shift 2
    rm -rf "$dir" && mkdir -p /tmp/long && cp -r . "$dir"
    (cd "$dir" && setsid nohup bash -c '"$@"; echo $? > rc' _ "$@" > log.txt 2>&1 < /dev/null &
        echo $! > "$dir/pid")
    echo "$name: started in $dir"
    ;;
wait)
    limit=${3:-570}
    for ((waited = 0; waited < limit; waited += 5)); do
        [ -f "$dir/rc" ] && break
        sleep 5
    done
    tail -n "${TAIL_LINES:-40}" "$dir/log.txt"
    if [ -f "$dir/rc" ]; then echo "$name: done rc=$(cat "$dir/rc")"; else echo "$name: running"; fi
    ;;
*)
    echo "gpu_long.sh: unknown action '$action' (start or wait)" >&2
    exit 2
    ;;
esac
