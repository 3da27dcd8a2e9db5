"""The configuration story for operators (issue 19, item 5): etc/peercached.conf
is the annotated sample generated from the settings table (`peercached
--print-config-sample`), so it cannot drift from the keys the node has; every
key is in it, commented out at its default; `peercached --check-config FILE`
checks a file alone and names the first error or the keys it changes."""
import os
import re

from conftest import BUILD, run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "etc", "peercached.conf")


def effective_keys():
    r = run("--print-config")
    assert r.returncode == 0, r.stderr
    return [line.split(" = ", 1)[0] for line in r.stdout.splitlines()]


def test_the_committed_sample_is_the_generated_one():
    r = run("--print-config-sample")
    assert r.returncode == 0, r.stderr
    with open(SAMPLE) as f:
        committed = f.read()
    assert r.stdout == committed, (
        "etc/peercached.conf differs from the settings table; regenerate it: "
        "%s/server/peercached --print-config-sample > etc/peercached.conf"
        % BUILD)


def test_every_key_is_in_the_sample_once_at_its_default():
    r = run("--print-config-sample")
    sample = r.stdout
    defaults = dict(line.split(" = ", 1) for line in
                    run("--print-config").stdout.splitlines())
    for key in effective_keys():
        lines = re.findall(r"^#%s =(.*)$" % re.escape(key), sample, re.M)
        assert len(lines) == 1, key
    # nothing in it is active: the file pins no value
    active = [line for line in sample.splitlines()
              if line.strip() and not line.startswith("#")]
    assert active == []
    # no line is too long; each key's help and allowed values above it
    assert all(len(line) <= 78 for line in sample.splitlines())
    assert "#pool_size = 4gb" in sample and defaults["pool_size"] == "4gb"
    text = re.sub(r"\n# ", " ", sample)  # comments unwrapped
    assert "(one of: p2p, slotmap)\n#mode = p2p" in text
    assert "(allowed: 0..65535)\n#rpc_port = 31999" in text


def test_every_section_heading_is_printed_in_order():
    sample = run("--print-config-sample").stdout
    titles = re.findall(r"^# ==== (.*)$", sample, re.M)
    src = open(os.path.join(ROOT, "common", "settings.c")).read()
    table = src[src.index("pc_cfg_section sections[]"):]
    want = re.findall(r'^\t\{"[a-z_]+", "([^"]+)"', table, re.M)
    assert titles == want and len(titles) >= 10


def test_check_config_accepts_the_sample_and_names_changed_keys(tmp_path):
    r = run("--check-config", SAMPLE)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(SAMPLE + ": ok (0 keys not at the default")
    conf = tmp_path / "node.conf"
    conf.write_text("pool_size = 8gb\n# a comment\nrpc_port = 4000\n")
    r = run("--check-config", str(conf))
    assert r.returncode == 0, r.stderr
    assert "ok (2 keys not at the default:" in r.stdout
    assert "\n  pool_size\n" in r.stdout and "\n  rpc_port\n" in r.stdout


def test_check_config_reports_the_first_error_with_its_line(tmp_path):
    conf = tmp_path / "bad.conf"
    conf.write_text("vnodes = 10\nrpc_port = 70000\n")
    r = run("--check-config", str(conf))
    assert r.returncode == 2
    assert "bad.conf:2" in r.stderr and "rpc_port" in r.stderr
    conf.write_text("pool_sise = 4gb\n")
    r = run("--check-config", str(conf))
    assert r.returncode == 2 and "pool_size" in r.stderr  # the suggestion
    r = run("--check-config", str(tmp_path / "missing.conf"))
    assert r.returncode == 2 and "missing.conf" in r.stderr
    r = run("--check-config")
    assert r.returncode == 2 and "needs a file path" in r.stderr


def test_check_config_checks_the_file_alone(tmp_path):
    conf = tmp_path / "node.conf"
    conf.write_text("threads = 2\n")
    # a bad environment or option does not make a good file bad
    r = run("--check-config", str(conf), env={"PEERCACHE_POOL_SIZE": "lots"})
    assert r.returncode == 0, r.stderr
    assert "\n  threads\n" in r.stdout and "pool_size" not in r.stdout
