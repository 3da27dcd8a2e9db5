#!/usr/bin/env bash
# scripts/test.sh — the whole test suite: install what is missing, build a
# normal tree (build/) and an AddressSanitizer+UBSan tree (build-asan/) with
# warnings as errors, and run every test in both (Criterion unit tests and
# process-level pytest). Exits non-zero on any failure or sanitizer report.
#
# Then a fuzz smoke: every libFuzzer target (tests/fuzz/fuzz_*.c; clang,
# build-fuzz/) runs for PEERCACHE_FUZZ_SECONDS (default 60) from its corpus
# in the repo, PEERCACHE_FUZZ_JOBS targets at a time (default 2: the CI
# machine's cores), so the smoke takes ceil(targets / 2) minutes. Long runs:
# scripts/fuzz_long.sh.
#
# Options (environment): PEERCACHE_TEST_ONLY=normal|asan|fuzz runs one part;
# CTEST_ARGS adds ctest arguments (e.g. "-R echo").
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/fuzz_lib.sh
. "$root/scripts/fuzz_lib.sh"
"$root/scripts/deps.sh" test || exit 1

trees=(normal asan fuzz)
[ -n "${PEERCACHE_TEST_ONLY:-}" ] && trees=("$PEERCACHE_TEST_ONLY")

status=0
summary=()
for t in "${trees[@]}"; do
  if [ "$t" = fuzz ]; then
    dir=$root/build-fuzz
    echo "==> building fuzz targets in $dir"
    if ! fuzz_build "$dir"; then
      status=1; summary+=("fuzz: build failed"); continue
    fi
    secs=${PEERCACHE_FUZZ_SECONDS:-60}
    jobs=${PEERCACHE_FUZZ_JOBS:-2}
    mapfile -t targets < <(fuzz_targets)
    # Each target in the background, at most $jobs at once; its status
    # goes to a file, read in target order for the summary.
    running=0
    for target in "${targets[@]}"; do
      if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
      work=$dir/fuzz-work-$target; rm -rf "$work"; mkdir -p "$work"
      echo "==> fuzzing the $target decoder for $secs s"
      mapfile -t seeds < <(fuzz_seeds "$target")
      ( fuzz_run "$dir/tests/fuzz/fuzz_$target" "$work" "$secs" \
          "$dir/fuzz-$target.log" "${seeds[@]}"
        echo $? > "$work.rc" ) &
      running=$((running + 1))
    done
    wait
    for target in "${targets[@]}"; do
      work=$dir/fuzz-work-$target
      if [ "$(cat "$work.rc" 2>/dev/null)" = 0 ]; then
        runs=$(fuzz_execs "$dir/fuzz-$target.log")
        summary+=("fuzz: fuzz_$target ran ${runs:-?} inputs in ${secs} s, no crash")
      else
        tail -40 "$dir/fuzz-$target.log"
        summary+=("fuzz: fuzz_$target FAILED (crash input in $work)"); status=1
      fi
      rm -f "$work.rc"
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
