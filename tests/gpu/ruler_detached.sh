#!/usr/bin/env bash
# Runs the cells of tests/gpu/ruler_cells.sh detached, one process per task x attention, so
# that a batch longer than one device command (10 minutes) runs on while later commands
# carry the next model or wait, and the cells of small models share the GPU:
#
#   ruler_detached.sh start RUN_DIR OUT_DIR N "MODEL.gguf[:TRAINED_CTX]" "TASK ..." "MULT ..."
#   ruler_detached.sh wait OUT_DIR SECONDS      until every run of OUT_DIR ends or SECONDS
#                                               pass; prints every cell so far and what runs
#   ruler_detached.sh stop OUT_DIR [PATTERN]    ends the runs whose TSV name holds PATTERN
#
# Each start copies RUN_DIR, conf/ and ruler_cells.sh into a tree of its own under OUT_DIR
# first: the next device command replaces the working tree the runs were started from, and
# a later start into the same OUT_DIR must not overwrite what runs. Cells go to
# OUT_DIR/MODEL.TASK.ATTENTION.tsv (ruler_cells.sh's columns). The environment of
# ruler_cells.sh passes through (FLASH_PROFILE, DCA_PROFILE, ATTNS, BACKEND, UBATCH;
# DEADLINE_S here defaults to none: every multiple asked for runs). Cells sharing the GPU
# report their own prefill tokens/s and seconds: shares of the GPU, not its rate for one.
set -uo pipefail
usage() { sed -n '2,16p' "$0"; exit 2; }
# a run's leader, not yet reaped, still answers kill -0: alive means not a zombie. One read
# of stat, since the process can end between two; the state follows the last ')' (the name
# may hold one).
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat:0:1}" != Z ]
}
[ $# -ge 2 ] || usage
mode=$1 out=$2
case $mode in
start)
  [ $# -eq 7 ] || usage
  run=$2 out=$3 n=$4 spec=$5 tasks=$6 mults=$7
  [ -x "$run/core/cli/tessera" ] || { echo "ruler_detached: no $run/core/cli/tessera" >&2; exit 1; }
  model=${spec%%:*}
  [ -f "$model" ] || { echo "ruler_detached: no model $model" >&2; exit 1; }
  # the runs start in the copy: paths from here made absolute
  spec=$(cd "$(dirname "$model")" && pwd)/$(basename "$spec")
  mkdir -p "$out" && out=$(cd "$out" && pwd)
  name=$(basename "$model" .gguf)
  for p in "$out/$name".*.pid; do
    [ -e "$p" ] && alive "$(cat "$p")" && { echo "ruler_detached: $(basename "$p" .pid) still" \
      "runs in $out: wait for it or stop it first" >&2; exit 1; }
  done
  tree=$(mktemp -d "$out/tree.XXXXXX") && mkdir -p "$tree/tests/gpu" &&
    cp -r "$run/." "$tree/run" && cp -r conf "$tree/" &&
    cp "$(dirname "$0")/ruler_cells.sh" "$tree/tests/gpu/" || exit 1
  started=0
  for task in $tasks; do
    for attn in ${ATTNS:-flash dca}; do
      base=$out/$name.$task.$attn
      # setsid as the background job itself, so that $! leads the run's process group
      (cd "$tree" || exit 1
        ATTNS=$attn DEADLINE_S=${DEADLINE_S:-2000000000} setsid nohup bash tests/gpu/ruler_cells.sh \
          run "$base.tsv" "$n" "$spec" "$task" "$mults" >"$base.log" 2>&1 </dev/null &
        echo $! >"$base.pid")
      started=$((started + 1))
    done
  done
  echo "started $started runs of $name in $out"
  ;;
wait)
  [ $# -eq 3 ] || usage
  running() { for p in "$out"/*.pid; do [ -e "$p" ] && alive "$(cat "$p")" && basename "$p" .pid; done; }
  end=$((SECONDS + $3))
  while [ $SECONDS -lt $end ] && [ -n "$(running)" ]; do sleep 5; done
  cat "$out"/*.tsv 2>/dev/null | awk 'NR == 1 || !/^model\t/'
  grep -h -A3 'deadline:\|cell failed' "$out"/*.log 2>/dev/null
  r=$(running)
  echo "running: ${r:-none}" | tr '\n' ' '; echo
  ;;
stop)
  for p in "$out"/*${3:-}*.pid; do
    [ -e "$p" ] && alive "$(cat "$p")" || continue
    # the run's process group: its bash loop and the cell it is in
    kill -- -"$(cat "$p")" 2>/dev/null && echo "stopped $(basename "$p" .pid)"
  done
  ;;
*) usage ;;
esac
