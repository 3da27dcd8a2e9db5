"""The members metric (issue 12, item 7): peercache_member_info lists the
ring members. (Bytes read on every path: test_metrics_paths.py, which loads
libpeercache and so runs with the shim tests.)"""
from conftest import metrics_of


def member_series(node):
    return {k: v for k, v in metrics_of(node).items()
            if k.startswith("peercache_member_info{")}


def test_member_info_lists_the_ring(cluster):
    nodes = cluster(3)
    ids = sorted(n.endpoint("rpc") for n in nodes)
    for n in nodes:
        series = member_series(n)
        assert len(series) == 3 and set(series.values()) == {1.0}, series
        me = n.endpoint("rpc")
        for m in ids:
            self_ = "true" if m == me else "false"
            state = "self" if m == me else "alive"
            key = ('peercache_member_info{member="%s",addr="%s",self="%s",state="%s"}'
                   % (m, m, self_, state))
            assert key in series, (key, series)
