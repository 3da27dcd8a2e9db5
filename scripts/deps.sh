#!/usr/bin/env bash
# scripts/deps.sh — install the Debian packages PeerCache needs, if missing.
#
# Usage: scripts/deps.sh build|test|bench
#   build  compiler, CMake and the libraries peercached links
#   test   build + Criterion, pytest and msgpack for Python, clang (fuzzing),
#          promtool (prometheus), headless Chromium (dashboard tests), etcd
#          (etcd-server: the etcd discovery backend's tests), and
#          torch, numpy, pip and setuptools (the SGLang shim's tests),
#          redis-server and memcached (peercache-bench's baseline targets'
#          test, test_pcb_baseline), dpkg-dev (dpkg-shlibdeps for cpack's
#          Debian packages) and systemd (systemd-analyze verify and
#          systemd-sysusers on the units; nothing is started): test_package
#   bench  build + redis and memcached (side-by-side baselines), fio (the
#          disk tier's baseline)
# Only missing packages are installed (apt-get, as root or through sudo);
# when everything is present this prints nothing and touches nothing.
set -euo pipefail

build_pkgs=(build-essential cmake pkg-config git liburing-dev libibverbs-dev
            librdmacm-dev libmsgpack-dev libxxhash-dev)
test_pkgs=(libcriterion-dev python3 python3-pytest python3-msgpack clang
           llvm libclang-rt-14-dev prometheus chromium fonts-dejavu-core curl
           python3-torch python3-numpy python3-pip python3-setuptools
           etcd-server redis-server memcached dpkg-dev systemd)
bench_pkgs=(redis-server redis-tools memcached fio)

case "${1:-build}" in
  build) want=("${build_pkgs[@]}") ;;
  test)  want=("${build_pkgs[@]}" "${test_pkgs[@]}") ;;
  bench) want=("${build_pkgs[@]}" "${bench_pkgs[@]}") ;;
  *) echo "usage: $0 build|test|bench" >&2; exit 2 ;;
esac

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "deps: missing Debian packages: ${missing[*]}" >&2
  echo "deps: run as root: apt-get install -y ${missing[*]}" >&2
  exit 1
fi

echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt_install() {
  "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}" >&2
}
# A fresh machine has no package lists yet: update once when needed.
if ! apt_install; then
  "${sudo[@]}" apt-get update >&2
  apt_install
fi
