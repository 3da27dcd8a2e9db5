#!/usr/bin/env bash
# scripts/run.sh — the main job: install what is missing, build, and run a
# peercached node in the foreground on its embedded defaults (or with the
# options given, e.g. ./scripts/run.sh --rpc-port 0). Ctrl-C stops it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh" build
"$root/scripts/build.sh" "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
exec "$root/build/server/peercached" "$@"
