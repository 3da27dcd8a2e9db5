"""bench/bench_results.py — what the Python benches that write a JSON
results file share (republish_bench.py, discovery_scale.py): the spread of
a figure over rounds and the document itself, stamped with the git
revision, the host and its load average before and after.

Pure helpers, no state; the caller picks the file name prefix and the
fields.
"""
import datetime
import json
import os
import statistics
import subprocess


def stamp():
    """A UTC timestamp for file names: 20260101T120000Z."""
    return datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y%m%dT%H%M%SZ")


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def spread(rows, keys):
    """{key: {min, median, max}} over the rows that have the key."""
    out = {}
    for k in keys:
        vals = [r[k] for r in rows if r.get(k) is not None]
        if vals:
            out[k] = {"min": min(vals), "median": statistics.median(vals),
                      "max": max(vals)}
    return out


def git_rev():
    try:
        return subprocess.run(["git", "-C", os.path.dirname(
            os.path.abspath(__file__)), "describe", "--always", "--dirty"],
            capture_output=True, text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def write(results_dir, bench, prefix, ts, loads, params, **parts):
    """Write {bench, timestamp, git_rev, host, params, **parts} to
    results_dir/<prefix>-<ts>.json; loads = (before, after); the path."""
    doc = {"bench": bench, "timestamp": ts, "git_rev": git_rev(),
           "host": {"kernel": os.uname().release, "cpus": os.cpu_count(),
                    "loadavg_start": " ".join(loads[0]),
                    "loadavg_end": " ".join(loads[1])},
           "params": params}
    doc.update(parts)
    os.makedirs(results_dir, exist_ok=True)
    out = os.path.join(results_dir, "%s-%s.json" % (prefix, ts))
    with open(out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    return out
