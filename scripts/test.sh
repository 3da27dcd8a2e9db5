#!/usr/bin/env bash
# scripts/test.sh — the whole test suite: install what is missing, build a
# normal tree (build/) and an AddressSanitizer+UBSan tree (build-asan/) with
# warnings as errors, and run every test in both (Criterion unit tests and
# process-level pytest). Exits non-zero on any failure or sanitizer report.
#
# Options (environment): PEERCACHE_TEST_ONLY=normal|asan runs one tree;
# CTEST_ARGS adds ctest arguments (e.g. "-R echo").
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh" test || exit 1

trees=(normal asan)
[ -n "${PEERCACHE_TEST_ONLY:-}" ] && trees=("$PEERCACHE_TEST_ONLY")

status=0
summary=()
for t in "${trees[@]}"; do
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
  # shellcheck disable=SC2086
  (cd "$dir" && ctest --output-on-failure -j2 ${CTEST_ARGS:-}) | tee "$dir/ctest.log"
  rc=${PIPESTATUS[0]}
  line=$(grep -E 'tests passed|tests failed' "$dir/ctest.log" | tail -1)
  summary+=("$t: ${line:-no summary}")
  [ "$rc" -ne 0 ] && status=1
done

echo
echo "==> summary"
for s in "${summary[@]}"; do echo "    $s"; done
if [ $status -eq 0 ]; then echo "==> ALL TESTS PASSED"; else echo "==> TESTS FAILED"; fi
exit $status
