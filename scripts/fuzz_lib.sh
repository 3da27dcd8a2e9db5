# scripts/fuzz_lib.sh — what scripts/test.sh (the CI smoke) and
# scripts/fuzz_long.sh share about the libFuzzer targets; sourced, not run.
#
# fuzz_build DIR        build the fuzz tree (clang) in DIR
# fuzz_targets          the targets, one per tests/fuzz/fuzz_<name>.c
# fuzz_seeds NAME       the seed directories of target NAME (read-only)
# fuzz_run BIN WORK SECS LOG SEEDS...
#                       fuzz for SECS seconds: new inputs into WORK, a crash
#                       as WORK/crash-*; the exit status is libFuzzer's
# fuzz_execs LOG        the executions a run's log reports
fuzz_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

fuzz_build() {
  "$fuzz_root/scripts/build.sh" "$1" -DCMAKE_C_COMPILER=clang -DPEERCACHE_FUZZ=ON \
    -DPEERCACHE_BUILD_TESTS=OFF -DPEERCACHE_BUILD_BENCH=OFF
}

fuzz_targets() {
  local f
  for f in "$fuzz_root"/tests/fuzz/fuzz_*.c; do
    f=${f##*/fuzz_}
    echo "${f%.c}"
  done
}

fuzz_seeds() {
  echo "$fuzz_root/tests/fuzz/corpus/$1"
  # the RPC port's malformed-input corpus (tests/corpus/) seeds fuzz_rpc too
  [ "$1" = rpc ] && echo "$fuzz_root/tests/corpus/rpc-malformed"
  return 0
}

fuzz_run() {
  local bin=$1 work=$2 secs=$3 log=$4
  shift 4
  "$bin" -max_total_time="$secs" -print_final_stats=1 \
    -artifact_prefix="$work/" "$work" "$@" > "$log" 2>&1
}

fuzz_execs() {
  grep -o 'number_of_executed_units: *[0-9]*' "$1" | grep -o '[0-9]*$'
}
