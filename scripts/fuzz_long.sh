#!/usr/bin/env bash
# scripts/fuzz_long.sh — run the libFuzzer targets for hours (the CI smoke
# in scripts/test.sh runs each for a minute). docs/reliability.md "Fuzzing".
#
# Usage: scripts/fuzz_long.sh [TIME [TARGET...]]
#   TIME     per target: seconds, or with a unit: 90m, 4h (default 4h)
#   TARGET   names as in tests/fuzz/fuzz_<name>.c (default: all of them)
# Environment:
#   PEERCACHE_FUZZ_JOBS  targets run at once (default: the core count)
#   PEERCACHE_FUZZ_WORK  work directory (default: build-fuzz/fuzz-long)
#
# Builds build-fuzz/ (clang), then runs every target for TIME, JOBS at a
# time, each from its committed seeds plus what earlier runs in the same
# work directory found (WORK/<target>/corpus: a long run can be resumed).
# At the end each target's corpus is merged (minimised: the inputs that
# add coverage) into WORK/<target>/merged. Nothing is written into the
# committed corpus (tests/fuzz/corpus/): review WORK/<target>/merged and
# copy what is worth keeping by hand. A crash leaves WORK/<target>/crash-*
# and its log WORK/<target>/fuzz.log; reproduce it with
#   build-fuzz/tests/fuzz/fuzz_<target> WORK/<target>/crash-...
# Prints one line per target (executions, crashes, corpus) and exits 1 if
# any target crashed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/fuzz_lib.sh
. "$root/scripts/fuzz_lib.sh"

time_arg=${1:-4h}
shift $(( $# > 0 ? 1 : 0 ))
case $time_arg in
  *h) secs=$(( ${time_arg%h} * 3600 )) ;;
  *m) secs=$(( ${time_arg%m} * 60 )) ;;
  *s) secs=${time_arg%s} ;;
  *) secs=$time_arg ;;
esac
if ! [[ $secs =~ ^[0-9]+$ ]] || [ "$secs" -eq 0 ]; then
  echo "fuzz_long: TIME must be seconds or Nm / Nh, not '$time_arg'" >&2
  exit 2
fi
targets=("$@")
[ ${#targets[@]} -eq 0 ] && mapfile -t targets < <(fuzz_targets)
jobs=${PEERCACHE_FUZZ_JOBS:-$(nproc)}
dir=$root/build-fuzz
work=${PEERCACHE_FUZZ_WORK:-$dir/fuzz-long}

echo "==> building the fuzz targets in $dir"
fuzz_build "$dir" || { echo "fuzz_long: build failed" >&2; exit 1; }
for t in "${targets[@]}"; do
  [ -x "$dir/tests/fuzz/fuzz_$t" ] || { echo "fuzz_long: no target '$t'" >&2; exit 2; }
done
echo "==> ${#targets[@]} targets, $secs s each, $jobs at a time, into $work"
echo "    (about $(( (${#targets[@]} + jobs - 1) / jobs * secs / 60 )) minutes)"

one() { # target: fuzz, then merge; the status is the fuzzing's
  local t=$1 w=$work/$1 rc
  mkdir -p "$w/corpus"
  mapfile -t seeds < <(fuzz_seeds "$t")
  fuzz_run "$dir/tests/fuzz/fuzz_$t" "$w/corpus" "$secs" "$w/fuzz.log" "${seeds[@]}"
  rc=$?
  # crashes land next to the corpus, not in it
  mv "$w/corpus"/crash-* "$w/corpus"/leak-* "$w/corpus"/timeout-* \
     "$w/corpus"/oom-* "$w/" 2>/dev/null
  rm -rf "$w/merged"; mkdir -p "$w/merged"
  "$dir/tests/fuzz/fuzz_$t" -merge=1 "$w/merged" "$w/corpus" "${seeds[@]}" \
    > "$w/merge.log" 2>&1
  return $rc
}

declare -A pid_of=()
declare -A rc_of=()
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n -p done_pid; rc=$?
    for k in "${!pid_of[@]}"; do [ "${pid_of[$k]}" = "$done_pid" ] && rc_of[$k]=$rc; done
    running=$((running - 1))
  fi
  echo "==> fuzz_$t for $secs s (log: $work/$t/fuzz.log)"
  one "$t" &
  pid_of[$t]=$!
  running=$((running + 1))
done
for t in "${targets[@]}"; do
  [ -n "${rc_of[$t]:-}" ] && continue
  wait "${pid_of[$t]}"; rc_of[$t]=$?
done

status=0
echo "==> summary ($secs s per target)"
for t in "${targets[@]}"; do
  w=$work/$t
  execs=$(fuzz_execs "$w/fuzz.log")
  corpus=$(find "$w/merged" -type f | wc -l)
  crashes=$(find "$w" -maxdepth 1 -name 'crash-*' -o -maxdepth 1 -name 'leak-*' \
            -o -maxdepth 1 -name 'timeout-*' -o -maxdepth 1 -name 'oom-*' | wc -l)
  if [ "${rc_of[$t]}" -eq 0 ]; then
    echo "    fuzz_$t: ${execs:-?} executions, no crash; merged corpus $corpus inputs ($w/merged)"
  else
    echo "    fuzz_$t: FAILED after ${execs:-?} executions: $crashes crash input(s) in $w, log $w/fuzz.log"
    status=1
  fi
done
exit $status
