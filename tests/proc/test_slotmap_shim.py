"""The SGLang shim (python/peercache) on three slotmap nodes (issue 15,
item 4): pages set through a shim on node A are found and read
byte-identical through a shim on node B, for v1 pools (MHA, MLA, page- and
layer-first, over shared memory) and the v2 sidecar pools (Mamba, the DSA
indexer, DeepSeek-V4's multi-buffer pools), with the shim tests' own
functions and checks; the keys' owners are all three nodes, so reads are
local and remote slot reads, and none is rejected. Apart from
test_slotmap.py because the shim loads libpeercache into the test process
(the sanitizer tree preloads its runtime for these: tests/CMakeLists.txt,
shim_tests)."""
import pytest

import test_shim
import test_shim_v2
from slot_hammer import slot_counters
from test_slotmap import CLASSES, slot_nodes


class _Counted:
    """A node handed to a shim test, which stops it itself: its slotmap
    counters are read just before."""

    def __init__(self, node):
        self.node, self.counters = node, None

    def __getattr__(self, name):
        return getattr(self.node, name)

    def stop(self, *a, **kw):
        self.counters = slot_counters([self.node])
        return self.node.stop(*a, **kw)


def _shim_on_three(node_factory, run):
    """run(cluster) with a cluster() stand-in that hands the shim test the
    first n of three slotmap nodes (its own arguments are the p2p pool's);
    the keys' owners are all three. Some of the test's reads were remote
    slot reads."""
    nodes, _ = slot_nodes(node_factory, 3, "--pool-size", "256mb", *CLASSES)
    handed = [_Counted(n) for n in nodes]
    run(lambda n, *args: handed[:n])
    handed[2].stop()
    assert sum(h.counters["remote_slot"] for h in handed) > 0
    assert sum(h.counters["rejected"] for h in handed) == 0


@pytest.mark.parametrize("layout", ["mha-page_first", "mla-page_first", "mha-layer_first"])
def test_shim_v1_on_slotmap(node_factory, layout):
    (entry,) = [p for p in test_shim.POOLS if p[0] == layout]
    _shim_on_three(node_factory, lambda cluster: test_shim.test_pages_cross_nodes_byte_identical(
        cluster, *entry, shm=True))


@pytest.mark.parametrize("scenario", ["mamba", "dsa-indexer", "deepseek-v4"])
def test_shim_v2_on_slotmap(node_factory, scenario):
    _shim_on_three(node_factory, lambda cluster: test_shim_v2.test_every_pool_kind_cross_node_byte_identical(
        cluster, scenario))
