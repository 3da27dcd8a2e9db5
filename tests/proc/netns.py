"""Test networks for the discovery fault tests (test_discovery_netns.py).

NetnsNet: network namespaces the test creates and deletes itself. A "hub"
namespace holds two bridges (br0, and br1 for the far side of a
partition); every node has a namespace of its own whose eth0 is one end of
a veth pair, the other end a port of br0 in the hub. Addresses are in
10.213.0.0/24 and exist only inside these namespaces: nothing the test
sends leaves them. Faults:
- link down/up: the node's hub port goes down (its eth0 loses carrier:
  silence both ways, the process and its Unix socket live on);
- partition: the ports of one group move to br1 (an L2 split: frames
  between the groups are dropped silently); heal moves them back;
- mute: one node's frames to one other node go to a MAC no port has (a
  permanent neighbour entry in the sender's namespace): lost one way, the
  rest of the network unchanged.

LoopNet: the same interface on 127.0.0.1 where namespaces are not
available (not root, no `ip netns`). Faults are emulated only in part: a
link down freezes the node (SIGSTOP: silent to the others, but the node
itself does not notice that the others went quiet), a partition freezes
the group that does not hold the head (only the other side serves).

Names carry the pytest pid and a counter, so parallel runs do not collide.
"""
import itertools
import os
import shutil
import signal
import subprocess

from conftest import free_ports, freeze

_seq = itertools.count()


def _ip(*args, check=True):
    return subprocess.run(["ip"] + list(args), capture_output=True,
                          text=True, timeout=30, check=check)


def netns_unavailable():
    """None when the test can build namespaces, else why not."""
    if os.environ.get("PEERCACHE_NETNS") == "off":
        return "PEERCACHE_NETNS=off"
    if os.geteuid() != 0:
        return "not root (ip netns needs CAP_SYS_ADMIN)"
    if not shutil.which("ip"):
        return "no ip (iproute2)"
    probe = "pcprobe%d" % os.getpid()
    try:
        r = _ip("netns", "add", probe, check=False)
        if r.returncode != 0:
            return "ip netns add: " + r.stderr.strip()
        r = _ip("-n", probe, "link", "add", "v0", "type", "veth",
                "peer", "name", "v1", check=False)
        if r.returncode != 0:
            return "veth: " + r.stderr.strip()
        r = _ip("-n", probe, "link", "add", "b0", "type", "bridge",
                check=False)
        if r.returncode != 0:
            return "bridge: " + r.stderr.strip()
        return None
    finally:
        _ip("netns", "del", probe, check=False)


class NetnsNet:
    kind = "netns"
    emulated = ""

    def __init__(self):
        self.tag = "pc%dt%d" % (os.getpid(), next(_seq))
        self.hub = self.tag + "h"
        self.spaces = []
        self.addrs = {}
        _ip("netns", "del", self.hub, check=False)  # a stale one
        _ip("netns", "add", self.hub)
        self.spaces.append(self.hub)
        for br in ("br0", "br1"):
            _ip("-n", self.hub, "link", "add", br, "type", "bridge")
            _ip("-n", self.hub, "link", "set", br, "up")

    def add(self, i):
        """Namespace, address and wrap (a command that execs the node in
        its namespace: ip netns exec does not fork) of node i."""
        ns = "%sn%d" % (self.tag, i)
        _ip("netns", "del", ns, check=False)
        # a restart: the old port goes with the old namespace, but the
        # kernel may not have removed it yet
        _ip("-n", self.hub, "link", "del", "v%d" % i, check=False)
        _ip("netns", "add", ns)
        self.spaces.append(ns)
        addr = "10.213.0.%d" % (i + 1)
        _ip("-n", self.hub, "link", "add", "v%d" % i, "type", "veth",
            "peer", "name", "eth0", "netns", ns)
        _ip("-n", self.hub, "link", "set", "v%d" % i, "master", "br0", "up")
        _ip("-n", ns, "addr", "add", addr + "/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        self.addrs[i] = addr
        return addr, ("ip", "netns", "exec", ns)

    def ports(self, i):
        """rpc, meta and data ports: the defaults, each node has its own
        addresses."""
        return 31999, 31998, 32000

    def link(self, i, up, node=None):
        _ip("-n", self.hub, "link", "set", "v%d" % i, "up" if up else "down")

    def _move(self, ports, bridge):
        """The ports of nodes `ports` to `bridge` in one ip process (one
        batch: the moves come microseconds apart, not one process start
        apart, so a side is cut, or joined, at one moment)."""
        cmds = "".join("link set v%d master %s\n" % (i, bridge)
                       for i in ports)
        subprocess.run(["ip", "-n", self.hub, "-batch", "-"], input=cmds,
                       capture_output=True, text=True, timeout=30,
                       check=True)

    def partition(self, far, nodes=None):
        self._move(far, "br1")

    def heal(self, far, nodes=None):
        self._move(far, "br0")

    def mute(self, i, j, on=True):
        """Node i's frames to node j are lost (on) or delivered again
        (off: the entry goes, ARP finds j again)."""
        ns = "%sn%d" % (self.tag, i)
        if on:
            _ip("-n", ns, "neigh", "replace", self.addrs[j], "lladdr",
                "02:00:00:00:00:01", "dev", "eth0", "nud", "permanent")
        else:
            _ip("-n", ns, "neigh", "del", self.addrs[j], "dev", "eth0")

    def close(self):
        for ns in reversed(self.spaces):
            _ip("netns", "del", ns, check=False)
        self.spaces = []


class LoopNet:
    kind = "loopback"
    emulated = ("link down = SIGSTOP of the node, partition = SIGSTOP of "
                "the side without the head (loopback cannot drop traffic)")

    def __init__(self):
        self.port_of = {}

    def add(self, i):
        return "127.0.0.1", ()

    def ports(self, i):
        if i not in self.port_of:
            self.port_of[i] = tuple(free_ports(2)) + (0,)
        return self.port_of[i]

    def link(self, i, up, node=None):
        if up:
            os.kill(node.proc.pid, signal.SIGCONT)
        else:
            freeze(node.proc.pid)

    def partition(self, far, nodes):
        for n in nodes:
            freeze(n.proc.pid)

    def heal(self, far, nodes):
        for n in nodes:
            os.kill(n.proc.pid, signal.SIGCONT)

    def close(self):
        pass
