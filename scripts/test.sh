#!/usr/bin/env bash
# scripts/test.sh — the whole test suite: install what is missing, build a
# normal tree (build/) and an AddressSanitizer+UBSan tree (build-asan/) with
# warnings as errors, and run every test in both (Criterion unit tests and
# process-level pytest). Exits non-zero on any failure or sanitizer report.
#
# Then a fuzz smoke: the libFuzzer targets (clang, build-fuzz/) run for
# PEERCACHE_FUZZ_SECONDS each (default 60) from the corpora in the repo
# (fuzz_rpc, fuzz_http, fuzz_data, fuzz_session, fuzz_pcb_json).
#
# Options (environment): PEERCACHE_TEST_ONLY=normal|asan|fuzz runs one part;
# CTEST_ARGS adds ctest arguments (e.g. "-R echo").
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh" test || exit 1

trees=(normal asan fuzz)
[ -n "${PEERCACHE_TEST_ONLY:-}" ] && trees=("$PEERCACHE_TEST_ONLY")

status=0
summary=()
for t in "${trees[@]}"; do
  if [ "$t" = fuzz ]; then
    dir=$root/build-fuzz
    echo "==> building fuzz targets in $dir"
    if ! "$root/scripts/build.sh" "$dir" -DCMAKE_C_COMPILER=clang -DPEERCACHE_FUZZ=ON \
         -DPEERCACHE_BUILD_TESTS=OFF -DPEERCACHE_BUILD_BENCH=OFF; then
      status=1; summary+=("fuzz: build failed"); continue
    fi
    secs=${PEERCACHE_FUZZ_SECONDS:-60}
    for target in rpc http data session pcb_json; do
      work=$dir/fuzz-work-$target; rm -rf "$work"; mkdir -p "$work"
      seeds=("$root/tests/fuzz/corpus/$target")
      [ "$target" = rpc ] && seeds+=("$root/tests/corpus/rpc-malformed")
      echo "==> fuzzing the $target decoder for $secs s"
      if "$dir/tests/fuzz/fuzz_$target" -max_total_time="$secs" -print_final_stats=1 \
           -artifact_prefix="$work/" "$work" "${seeds[@]}" > "$dir/fuzz-$target.log" 2>&1; then
        runs=$(grep -o 'number_of_executed_units: *[0-9]*' "$dir/fuzz-$target.log" | grep -o '[0-9]*$')
        summary+=("fuzz: fuzz_$target ran ${runs:-?} inputs in ${secs} s, no crash")
      else
        tail -40 "$dir/fuzz-$target.log"
        summary+=("fuzz: fuzz_$target FAILED (crash input in $work)"); status=1
      fi
    done
    continue
  fi
  case $t in
    normal) dir=$root/build; opts=(-DCMAKE_BUILD_TYPE=RelWithDebInfo) ;;
    asan)   dir=$root/build-asan; opts=(-DCMAKE_BUILD_TYPE=Debug -DPEERCACHE_SANITIZE=ON) ;;
    *) echo "unknown tree $t" >&2; exit 2 ;;
  esac
  echo "==> building $t tree in $dir"
  if ! "$root/scripts/build.sh" "$dir" "${opts[@]}"; then
    echo "==> build of the $t tree FAILED"
    status=1; summary+=("$t: build failed"); continue
  fi
  echo "==> testing $t tree"
  rm -f "$dir/test-artifacts/reports.txt"
  # shellcheck disable=SC2086
  (cd "$dir" && ctest --output-on-failure -j2 ${CTEST_ARGS:-}) | tee "$dir/ctest.log"
  rc=${PIPESTATUS[0]}
  # What tests report for the record (conftest.report: oracle counts,
  # measured times, skipped variants and why).
  if [ -s "$dir/test-artifacts/reports.txt" ]; then
    echo "==> reports of the $t tree's process tests"
    sed 's/^/    /' "$dir/test-artifacts/reports.txt"
  fi
  line=$(grep -E 'tests passed|tests failed' "$dir/ctest.log" | tail -1)
  summary+=("$t: ${line:-no summary}")
  [ "$rc" -ne 0 ] && status=1
done

echo
echo "==> summary"
for s in "${summary[@]}"; do echo "    $s"; done
if [ $status -eq 0 ]; then echo "==> ALL TESTS PASSED"; else echo "==> TESTS FAILED"; fi
exit $status
