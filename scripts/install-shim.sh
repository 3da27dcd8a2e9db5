#!/usr/bin/env bash
# scripts/install-shim.sh — install the SGLang shim (python/peercache, pure
# Python) where SGLang's Python imports it, with nothing but that Python:
# no pip, no setuptools, no network. The package files are copied, compiled
# to bytecode, and described by a dist-info directory (METADATA, RECORD,
# INSTALLER), so `importlib.metadata.version("peercache")` answers and
# `pip uninstall peercache` (where pip exists) removes exactly these files.
#
# Usage: scripts/install-shim.sh [--target DIR | --user | --system]
#                                [--python PY] [--with-lib [PATH]]
#   --target DIR   into DIR (created); use it with PYTHONPATH=DIR
#   --user         into PY's user site-packages (~/.local/lib/pythonX.Y/...)
#   --system       into PY's first site directory (Debian:
#                  /usr/local/lib/pythonX.Y/dist-packages) [the default]
#   --python PY    the interpreter SGLang runs under [/usr/bin/python3]
#   --with-lib     also copy libpeercache.so.0 into the package directory
#                  (found there first after $PEERCACHE_LIBRARY), for hosts
#                  where `cmake --install` did not put it on the library
#                  path; PATH defaults to <repo>/build/client/libpeercache.so.0
#
# An earlier copy in the same place is replaced. Prints the directory it
# installed into on stdout; messages go to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
py=/usr/bin/python3
mode=system
dest=
lib=

die() { echo "install-shim: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
	case $1 in
	--target) [ $# -ge 2 ] || die "--target needs a directory"
		mode=target; dest=$2; shift 2 ;;
	--user) mode=user; shift ;;
	--system) mode=system; shift ;;
	--python) [ $# -ge 2 ] || die "--python needs an interpreter"
		py=$2; shift 2 ;;
	--with-lib)
		if [ $# -ge 2 ] && [ "${2#--}" = "$2" ]; then lib=$2; shift 2
		else lib=$root/build/client/libpeercache.so.0; shift; fi ;;
	-h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument: $1 (see --help)" ;;
	esac
done

command -v "$py" >/dev/null 2>&1 || die "no interpreter $py"
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 9))' ||
	die "$py is older than Python 3.9"
src=$root/python/peercache
[ -f "$src/__init__.py" ] || die "no package at $src"
if [ -n "$lib" ]; then
	[ -f "$lib" ] || die "no library at $lib (build first: scripts/build.sh build)"
fi

case $mode in
target) mkdir -p "$dest"; dest=$(cd "$dest" && pwd) ;;
user) dest=$("$py" -c 'import site; print(site.getusersitepackages())') ;;
system) dest=$("$py" -c 'import site; print(site.getsitepackages()[0])') ;;
esac
mkdir -p "$dest" 2>/dev/null || die "cannot create $dest (run as root, or use --user / --target)"
[ -w "$dest" ] || die "cannot write $dest (run as root, or use --user / --target)"

version=$("$py" - "$src/__init__.py" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M)
if not m:
    sys.exit("install-shim: no __version__ in " + sys.argv[1])
print(m.group(1))
EOF
)

# The copy, the bytecode and the dist-info, in one Python run: a RECORD that
# lists what was written, with the hashes pip checks on uninstall.
"$py" - "$src" "$dest" "$version" "$lib" <<'EOF'
import base64, compileall, hashlib, os, shutil, sys

src, dest, version, lib = sys.argv[1:5]
pkg = os.path.join(dest, "peercache")
info = os.path.join(dest, "peercache-%s.dist-info" % version)
if not os.path.islink(pkg) and os.path.realpath(pkg) == os.path.realpath(src):
    sys.exit("install-shim: the target holds the source package itself (%s); "
             "install somewhere else" % src)
for old in os.listdir(dest):  # an earlier install of any version
    if old == "peercache" or (old.startswith("peercache-") and old.endswith(".dist-info")):
        path = os.path.join(dest, old)
        if os.path.islink(path):  # a development link: drop the link only
            os.unlink(path)
        else:
            shutil.rmtree(path)
os.makedirs(pkg)
for name in sorted(os.listdir(src)):
    if name.endswith(".py"):
        shutil.copy2(os.path.join(src, name), os.path.join(pkg, name))
if lib:
    shutil.copy2(lib, os.path.join(pkg, "libpeercache.so.0"))
if not compileall.compile_dir(pkg, quiet=1):
    sys.exit("install-shim: byte-compiling %s failed" % pkg)
os.makedirs(info)
with open(os.path.join(info, "METADATA"), "w") as f:
    f.write("Metadata-Version: 2.1\nName: peercache\nVersion: %s\n"
            "Summary: PeerCache: the L3 KV-cache store for SGLang HiCache "
            "(client shim)\nRequires-Python: >=3.9\n" % version)
with open(os.path.join(info, "INSTALLER"), "w") as f:
    f.write("peercache-install-shim\n")
with open(os.path.join(info, "top_level.txt"), "w") as f:
    f.write("peercache\n")
rows = []
for base in (pkg, info):
    for d, _, files in os.walk(base):
        for name in sorted(files):
            path = os.path.join(d, name)
            with open(path, "rb") as f:
                data = f.read()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            rows.append("%s,sha256=%s,%d" % (os.path.relpath(path, dest),
                                              digest.decode(), len(data)))
rows.append("%s,," % os.path.relpath(os.path.join(info, "RECORD"), dest))
with open(os.path.join(info, "RECORD"), "w") as f:
    f.write("\n".join(rows) + "\n")
EOF

echo "install-shim: peercache $version installed in $dest${lib:+ (with libpeercache)}" >&2
case $mode in
target) echo "install-shim: import it with PYTHONPATH=$dest" >&2 ;;
esac
echo "$dest"
