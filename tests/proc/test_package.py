"""The Debian packages (issue 19, item 1) and the systemd units (item 2), from
this build tree without touching the machine: cpack builds the four packages
into a temporary directory; their control fields (names, versions, the
dependencies, each a real Debian package) and contents (the conffile, the
library's SONAME, the units, the shim) are checked with dpkg-deb; they are
unpacked into a clean root, and the node starts from the unpacked files with
the packaged sample config (ports and socket moved to the test's own), the
packaged CLI asks it `info`, the packaged shim talks to it through the
packaged library, a program compiles against the -dev package through its
pkg-config file, and the node stops by PID. The maintainer script makes the
peercache user through systemd-sysusers or adduser, once, without systemd;
the sysusers.d entry makes that user in a scratch root; the units pass
`systemd-analyze verify` (when it exists) and carry what the node needs."""
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import BUILD, PEERCACHED, SANITIZED, clean_env, report

NAMES = ["peercached", "libpeercache0", "libpeercache-dev", "python3-peercache"]


def need(tool):
    path = shutil.which(tool)
    if not path:
        pytest.skip("%s is not installed (scripts/deps.sh test installs it)" % tool)
    return path


def project_version():
    out = subprocess.run([PEERCACHED, "--version"], capture_output=True, text=True,
                         env=clean_env()).stdout
    return re.match(r"peercached (\S+) ", out).group(1)


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    """{package name: .deb path}, built by cpack from this build tree."""
    need("cpack")
    need("dpkg-deb")
    need("dpkg-shlibdeps")  # CPACK_DEBIAN_PACKAGE_SHLIBDEPS (dpkg-dev)
    # Written by include(CPack) when the tree is configured (a build of a
    # tree configured before packaging/Package.cmake existed re-runs cmake).
    assert os.path.exists(os.path.join(BUILD, "CPackConfig.cmake")), BUILD
    out = tmp_path_factory.mktemp("debs")
    t0 = time.monotonic()
    res = subprocess.run(["cpack", "-G", "DEB", "-B", str(out)], cwd=BUILD,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    report("cpack -G DEB: 4 packages in %.1f s" % (time.monotonic() - t0))
    found = {}
    for name in os.listdir(str(out)):
        if name.endswith(".deb"):
            found[name.split("_")[0]] = str(out / name)
    assert sorted(found) == sorted(NAMES), (found, res.stdout)
    return found


@pytest.fixture(scope="module")
def root(debs, tmp_path_factory):
    """A clean root with every package unpacked (dpkg-deb -x: no scripts)."""
    r = tmp_path_factory.mktemp("root")
    for deb in debs.values():
        subprocess.run(["dpkg-deb", "-x", deb, str(r)], check=True)
    return str(r)


def field(deb, name):
    return subprocess.run(["dpkg-deb", "-f", deb, name], capture_output=True, text=True,
                          check=True).stdout.strip()


def depends(deb):
    """Depends as {package: version constraint or ''}."""
    out = {}
    for dep in field(deb, "Depends").split(","):
        m = re.match(r"\s*([a-z0-9.+-]+)\s*(?:\((.*)\))?\s*$", dep)
        assert m, dep
        out[m.group(1)] = m.group(2) or ""
    return out


def contents(deb):
    """{path: (mode letter, link target)} of a package's files."""
    out = {}
    lines = subprocess.run(["dpkg-deb", "-c", deb], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    for line in lines:
        parts = line.split(None, 5)
        name = parts[5]
        target = ""
        if " -> " in name:
            name, target = name.split(" -> ")
        out[name[1:]] = (parts[0][0], target)
    return out


def libdir(files):
    """The library directory (/usr/lib or /usr/lib/<multiarch>)."""
    for path in files:
        if path.endswith("/libpeercache.so.0"):
            return os.path.dirname(path)
    raise AssertionError("no libpeercache.so.0 in %s" % sorted(files))


def test_control_fields(debs):
    version = project_version() + "-1"
    for name, deb in debs.items():
        assert field(deb, "Package") == name
        assert field(deb, "Version") == version, name
        assert field(deb, "Maintainer"), name
        assert field(deb, "Description").splitlines()[0].startswith("PeerCache"), name
    assert field(debs["python3-peercache"], "Architecture") == "all"
    server = depends(debs["peercached"])
    # What peercached links (dpkg-shlibdeps found them), the library of the
    # same build, and adduser for the maintainer script.
    for dep in ("libc6", "liburing2", "libibverbs1", "librdmacm1", "libxxhash0", "adduser"):
        assert dep in server, (dep, server)
    assert server["libpeercache0"] == "= " + version, server
    for name in ("libpeercache-dev", "python3-peercache"):
        assert depends(debs[name])["libpeercache0"] == "= " + version, name
    assert "python3" in depends(debs["python3-peercache"])
    assert "libc6" in depends(debs["libpeercache0"])
    # Every dependency is a real Debian package: each is installed here,
    # since this tree was built and linked against them.
    names = set()
    for name in ("peercached", "libpeercache0", "python3-peercache"):
        names |= set(depends(debs[name]))
    names -= set(NAMES)
    res = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\n"] + sorted(names),
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert set(res.stdout.split()) == names, res.stdout


def test_contents(debs, root):
    server = contents(debs["peercached"])
    for path in ("/usr/bin/peercached", "/usr/bin/peercache", "/etc/peercache/peercached.conf",
                 "/usr/lib/systemd/system/peercached.service",
                 "/usr/lib/systemd/system/peercached@.service",
                 "/usr/lib/sysusers.d/peercache.conf", "/usr/share/doc/peercache/README.md",
                 "/usr/share/doc/peercache/prometheus/peercache.rules.yml"):
        assert path in server, (path, sorted(server))
    if os.path.exists(os.path.join(BUILD, "bench", "tool", "peercache-bench")):
        assert "/usr/bin/peercache-bench" in server
    assert not any("libpeercache" in p for p in server), sorted(server)
    conffiles = subprocess.run(["dpkg-deb", "--ctrl-tarfile", debs["peercached"]],
                               capture_output=True, check=True).stdout
    ctrl = subprocess.run(["tar", "-xO", "./conffiles"], input=conffiles,
                          capture_output=True, check=True).stdout.decode()
    assert ctrl.split() == ["/etc/peercache/peercached.conf"], ctrl

    lib = contents(debs["libpeercache0"])
    d = libdir(lib)
    real = [p for p, (kind, _) in lib.items() if kind == "-"]
    assert len(real) == 1 and real[0].startswith(d + "/libpeercache.so.0."), sorted(lib)
    assert lib[d + "/libpeercache.so.0"] == ("l", os.path.basename(real[0]))
    readelf = need("readelf")
    dyn = subprocess.run([readelf, "-d", root + real[0]], capture_output=True, text=True,
                         check=True).stdout
    assert "Library soname: [libpeercache.so.0]" in dyn, dyn

    dev = contents(debs["libpeercache-dev"])
    assert dev[d + "/libpeercache.so"] == ("l", "libpeercache.so.0"), sorted(dev)
    assert "/usr/include/peercache.h" in dev
    assert d + "/pkgconfig/peercache.pc" in dev

    py = contents(debs["python3-peercache"])
    site = "/usr/lib/python3/dist-packages"
    for name in ("__init__.py", "client.py", "store.py", "_hicache.py"):
        assert "%s/peercache/%s" % (site, name) in py, sorted(py)
    assert not any("__pycache__" in p for p in py), sorted(py)


def start_installed(root, tmp_path, env=None):
    """The unpacked peercached with the packaged sample config; the test's
    ports, socket and a small pool override what would touch the machine."""
    sock = str(tmp_path / "node.sock")
    log = open(str(tmp_path / "node.log"), "wb")
    argv = [os.path.join(root, "usr/bin/peercached"),
            "--config", os.path.join(root, "etc/peercache/peercached.conf"),
            "--rpc-port", "0", "--data-port", "0", "--meta-port", "0", "--metrics-port", "0",
            "--socket", sock, "--threads", "1", "--pool-size", "64mb",
            "--pool-prefault", "false"]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=clean_env(env))
    log.close()
    return proc, sock, str(tmp_path / "node.log")


def wait_ready(proc, log, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with open(log, errors="replace") as f:
            text = f.read()
        if re.search(r"\] node \S+ ready \(", text):
            return text
        assert proc.poll() is None, text
        time.sleep(0.05)
    raise AssertionError("the installed node did not get ready:\n" + text)


def test_installed_node_cli_and_shim(root, tmp_path):
    exe = os.path.join(root, "usr/bin/peercached")
    res = subprocess.run([exe, "--version"], capture_output=True, text=True, env=clean_env())
    assert res.returncode == 0 and res.stdout.startswith("peercached " + project_version()), res
    # The node and the CLI link the project statically: no library path.
    for name in ("peercached", "peercache"):
        ldd = subprocess.run(["ldd", os.path.join(root, "usr/bin", name)],
                             capture_output=True, text=True).stdout
        assert "libpeercache" not in ldd and "not found" not in ldd, ldd

    proc, sock, log = start_installed(root, tmp_path)
    try:
        text = wait_ready(proc, log)
        assert "mode p2p" in text, text  # the sample config was read
        cli = os.path.join(root, "usr/bin/peercache")
        res = subprocess.run([cli, "--node", sock, "info"], capture_output=True, text=True,
                             env=clean_env(), timeout=60)
        assert res.returncode == 0, res.stderr
        node_id = re.search(r"\] node (\S+) ready \(", text).group(1)
        assert node_id in res.stdout, res.stdout

        bench = os.path.join(root, "usr/bin/peercache-bench")
        if os.path.exists(bench):
            # Its RUNPATH ($ORIGIN/../lib...) finds the packaged library.
            ldd = subprocess.run(["ldd", bench], capture_output=True, text=True).stdout
            assert re.search(r"libpeercache\.so\.0 => %s/" % re.escape(root), ldd), ldd
            res = subprocess.run([bench, "--help"], capture_output=True, text=True,
                                 env=clean_env(), timeout=60)
            assert res.returncode == 0, res.stderr

        if SANITIZED:
            print("skipped the shim part: the sanitized libpeercache needs the ASan "
                  "runtime preloaded into Python (the shim tests do that)")
        else:
            site = os.path.join(root, "usr/lib/python3/dist-packages")
            lib = [os.path.join(d, "libpeercache.so.0")
                   for d, _, files in os.walk(os.path.join(root, "usr/lib"))
                   if "libpeercache.so.0" in files][0]
            # -I: none of the developer's paths; the unpacked site only.
            code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
                    "import importlib.metadata, peercache, peercache.client as c\n"
                    "assert peercache.__file__.startswith(sys.argv[1]), peercache.__file__\n"
                    "cl = c.Client(sys.argv[2])\n"
                    "print(importlib.metadata.version('peercache'), cl.info().get('node', ''),\n"
                    "      c.library()._name)\n"
                    "cl.close()\n")
            res = subprocess.run(["/usr/bin/python3", "-I", "-c", code, site, sock],
                                 capture_output=True, text=True, timeout=60,
                                 env=clean_env({"PEERCACHE_LIBRARY": lib}))
            assert res.returncode == 0, res.stderr
            assert res.stdout.split()[0] == project_version(), res.stdout
            assert res.stdout.split()[-1] == lib, res.stdout
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, open(log).read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_dev_package_builds_a_client(root, tmp_path):
    need("pkg-config")
    cc = need("cc")
    pcdir = [d for d, _, files in os.walk(os.path.join(root, "usr/lib"))
             if "peercache.pc" in files][0]
    env = clean_env({"PKG_CONFIG_PATH": pcdir, "PKG_CONFIG_SYSROOT_DIR": root})
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "peercache"],
                           capture_output=True, text=True, env=env)
    assert flags.returncode == 0, flags.stderr
    assert "-lpeercache" in flags.stdout, flags.stdout
    src = tmp_path / "use.c"
    src.write_text('#include <peercache.h>\n'
                   'int main(void) { return pcache_open == 0; }\n')
    exe = str(tmp_path / "use")
    res = subprocess.run([cc, str(src), "-o", exe] + flags.stdout.split(),
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    lib = os.path.dirname(pcdir)
    res = subprocess.run([exe], env=clean_env({"LD_LIBRARY_PATH": lib}))
    assert res.returncode == 0


def stub(bindir, name, body):
    path = os.path.join(bindir, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\nPATH=/usr/bin:/bin\necho \"%s $*\" >> \"$CALLS\"\n%s\n" % (name, body))
    os.chmod(path, 0o755)


def run_postinst(debs, tmp_path, tools):
    """peercached's postinst with PATH holding only stubs of the tools it
    may call (tools: name -> shell body); returns the calls made."""
    script = tmp_path / "postinst"
    ctrl = subprocess.run(["dpkg-deb", "--ctrl-tarfile", debs["peercached"]],
                          capture_output=True, check=True).stdout
    script.write_bytes(subprocess.run(["tar", "-xO", "./postinst"], input=ctrl,
                                      capture_output=True, check=True).stdout)
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name in os.listdir(str(bindir)):
        os.unlink(str(bindir / name))
    for name, body in tools.items():
        stub(str(bindir), name, body)
    calls = tmp_path / "calls"
    calls.write_text("")
    res = subprocess.run(["/bin/sh", str(script), "configure", ""], capture_output=True,
                         text=True, env={"PATH": str(bindir), "CALLS": str(calls),
                                         "STATE": str(tmp_path / "state")})
    assert res.returncode == 0, res.stderr
    return [c for c in calls.read_text().splitlines()
            if not c.startswith("getent") and not c.startswith("systemctl")]


def test_postinst_makes_the_user_once(debs, tmp_path):
    # "getent passwd/group" answers from $STATE, which the stubs fill in.
    getent = 'grep -q "^$1:$2$" "$STATE" 2>/dev/null'
    made = 'echo "passwd:peercache" >> "$STATE"; echo "group:peercache" >> "$STATE"'
    # With systemd-sysusers (a systemd host, running or not).
    tools = {"getent": getent, "systemd-sysusers": made, "systemctl": "",
             "adduser": "exit 1", "addgroup": "exit 1"}
    assert run_postinst(debs, tmp_path, tools) == ["systemd-sysusers peercache.conf"]
    assert run_postinst(debs, tmp_path, tools) == []  # idempotent
    # Without systemd at all: adduser.
    os.unlink(str(tmp_path / "state"))
    tools = {"getent": getent, "addgroup": 'echo "group:peercache" >> "$STATE"',
             "adduser": 'echo "passwd:peercache" >> "$STATE"'}
    calls = run_postinst(debs, tmp_path, tools)
    assert calls[0] == "addgroup --system --quiet peercache", calls
    assert calls[1].startswith("adduser --system --quiet --ingroup peercache "), calls
    assert calls[1].endswith(" peercache") and len(calls) == 2, calls
    assert run_postinst(debs, tmp_path, tools) == []


def test_sysusers_entry(root, tmp_path):
    tool = need("systemd-sysusers")
    scratch = tmp_path / "sysroot"
    (scratch / "etc").mkdir(parents=True)
    res = subprocess.run([tool, "--root", str(scratch),
                          os.path.join(root, "usr/lib/sysusers.d/peercache.conf")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    passwd = (scratch / "etc/passwd").read_text()
    group = (scratch / "etc/group").read_text()
    m = re.search(r"^peercache:x:(\d+):(\d+):[^:]*:([^:]*):([^:\n]*)$", passwd, re.M)
    assert m, passwd
    assert re.search(r"^peercache:x:%s:" % m.group(2), group, re.M), group
    assert int(m.group(1)) < 1000 and m.group(4).endswith("nologin"), m.group(0)


def unit(root, name):
    """A unit file as {key: [values]} over all sections."""
    keys = {}
    with open(os.path.join(root, "usr/lib/systemd/system", name)) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith(("#", "[")):
                k, _, v = line.partition("=")
                keys.setdefault(k, []).append(v)
    return keys


def sample_socket(root):
    with open(os.path.join(root, "etc/peercache/peercached.conf")) as f:
        m = re.search(r"^#?socket\s*=\s*(\S+)", f.read(), re.M)
    return m.group(1)


def test_unit_keys(root):
    one = unit(root, "peercached.service")
    many = unit(root, "peercached@.service")
    for u in (one, many):
        assert u["Type"] == ["notify"]
        assert u["User"] == ["peercache"] and u["Group"] == ["peercache"]
        assert u["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
        assert u["Restart"] == ["on-failure"]
        assert u["LimitMEMLOCK"] == ["infinity"]
        for k in ("NoNewPrivileges", "ProtectHome", "PrivateTmp"):
            assert u[k] == ["yes"], k
        assert u["ProtectSystem"] == ["strict"]
        assert u["StateDirectory"], u
        assert u["WantedBy"] == ["multi-user.target"]
    assert one["ExecStart"] == ["/usr/bin/peercached --config /etc/peercache/peercached.conf"]
    # The sample config's socket lives in the unit's RuntimeDirectory.
    assert os.path.dirname(sample_socket(root)) == "/run/" + one["RuntimeDirectory"][0]
    assert many["ExecStart"] == ["/usr/bin/peercached --config /etc/peercache/%i.conf"]
    env = dict(e.split("=", 1) for e in many["Environment"])
    assert os.path.dirname(env["PEERCACHE_SOCKET"]) == "/run/" + many["RuntimeDirectory"][0]
    assert "%i" in many["RuntimeDirectory"][0]


def test_units_verify(root, tmp_path):
    tool = shutil.which("systemd-analyze")
    if not tool:
        pytest.skip("systemd-analyze is not installed (package systemd)")
    # verify checks that ExecStart's program exists: point it at the
    # unpacked one (the only change), under the same unit names.
    exe = os.path.join(root, "usr/bin/peercached")
    paths = []
    for name, as_name in (("peercached.service", "peercached.service"),
                          ("peercached@.service", "peercached@test.service")):
        with open(os.path.join(root, "usr/lib/systemd/system", name)) as f:
            text = f.read()
        assert "ExecStart=/usr/bin/peercached " in text
        path = tmp_path / as_name
        path.write_text(text.replace("ExecStart=/usr/bin/peercached ", "ExecStart=%s " % exe))
        paths.append(str(path))
    res = subprocess.run([tool, "verify", "--man=no"] + paths, capture_output=True,
                         text=True, timeout=120)
    # verify exits 0 on keys it ignores: any line about our files fails.
    lines = [l for l in (res.stdout + res.stderr).splitlines() if "peercached" in l]
    assert res.returncode == 0 and not lines, res.stdout + res.stderr
    # It does catch a bad key (so an empty answer means something).
    bad = tmp_path / "bad" / "peercached.service"
    bad.parent.mkdir()
    bad.write_text(open(paths[0]).read().replace("Type=notify", "Type=notifyy"))
    res = subprocess.run([tool, "verify", "--man=no", str(bad)], capture_output=True,
                         text=True, timeout=120)
    assert "notifyy" in res.stdout + res.stderr


def test_unit_under_systemd():
    comm = open("/proc/1/comm").read().strip()
    if comm != "systemd":
        pytest.skip("PID 1 is %r, not systemd: the units cannot be started here "
                    "(the readiness protocol is tested against a listener in "
                    "test_sdnotify.py)" % comm)
    pytest.skip("systemd runs as PID 1, but starting a unit would change the "
                "machine (a user, /run, /var/lib): not done by the test suite")
