"""reactor_nice: the reactor threads (and only they) run at the configured
nice value; a value the process may not take is logged and the node serves
on at its own priority."""
import os
import shutil
import subprocess

import pytest

from conftest import RpcClient


def thread_nice(pid):
    """{thread name: [nice values]} of a process, from /proc."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
            stat = f.read()
        # comm may hold spaces: the fields after it start past the last ')'.
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out.setdefault(name, []).append(int(fields[16]))  # field 19: nice
    return out


def test_reactor_threads_take_the_nice_value(node_factory):
    # The node inherits the runner's nice value (CI may run at 10, say).
    # setpriority sets an absolute value, and raising it needs no
    # privilege: the reactors take base + 5, every other thread keeps base.
    base = os.nice(0)
    if base >= 19:
        pytest.skip("the runner is at nice 19: no higher value to set")
    want = min(19, base + 5)
    n = node_factory("--reactor-nice", str(want), "--threads", "2")
    assert RpcClient(n.endpoint("rpc")).call("node.health")[0] is None
    nice = thread_nice(n.proc.pid)
    assert nice.get("pc-r0") == [want] and nice.get("pc-r1") == [want], (base, nice)
    others = [v for k, vs in nice.items() if not k.startswith("pc-r") for v in vs]
    assert others and all(v == base for v in others), (base, nice)
    n.wait_for("reactor threads run at nice %d" % want)
    assert n.stop() == 0


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) not installed")
def test_a_refused_nice_value_is_logged_and_the_node_serves(node_factory):
    # Without CAP_SYS_NICE a negative nice is refused (EACCES/EPERM).
    n = node_factory("--reactor-nice", "-5", "--threads", "1",
                     wrap=["setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice"])
    n.wait_for("cannot set nice -5")
    assert RpcClient(n.endpoint("rpc")).call("node.health")[0] is None
    assert thread_nice(n.proc.pid).get("pc-r0") == [os.nice(0)]
    assert n.stop() == 0
