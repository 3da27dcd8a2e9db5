"""The operator's guide and its alert rules (issue 19, item 4): the sample
Prometheus rules pass `promtool check rules` and their unit tests (`promtool
test rules`: each alert fires on the series that should raise it and not on
healthy ones); every metric they use is one a node really exports; every
alert is documented in docs/operations.md."""
import os
import re
import shutil
import subprocess

import pytest

from conftest import metrics_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(ROOT, "etc", "prometheus", "peercache.rules.yml")
RULE_TESTS = os.path.join(ROOT, "tests", "prometheus", "peercache.rules.test.yml")
GUIDE = os.path.join(ROOT, "docs", "operations.md")
PROMTOOL = shutil.which("promtool")

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian package "
    "prometheus; scripts/deps.sh test installs it)")


@needs_promtool
def test_promtool_accepts_the_rules():
    r = subprocess.run([PROMTOOL, "check", "rules", RULES],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


@needs_promtool
def test_the_rules_fire_when_they_should():
    r = subprocess.run([PROMTOOL, "test", "rules", RULE_TESTS],
                       capture_output=True, text=True, timeout=60,
                       cwd=os.path.dirname(RULE_TESTS))
    assert r.returncode == 0, r.stdout + r.stderr


def rules_text():
    with open(RULES) as f:
        return f.read()


def test_every_metric_in_the_rules_is_exported(node_factory, tmp_path):
    # the disk tier on, so that its metrics are there too
    node = node_factory("--pool-size", "64mb", "--disk-enabled",
                        "--disk-path", str(tmp_path / "disk"),
                        "--disk-size", "256mb")
    node.wait_for("ready")
    exported = {re.sub(r"\{.*", "", name) for name in metrics_of(node)}
    used = set(re.findall(r"\b(peercache_[a-z0-9_]+)", rules_text()))
    assert len(used) >= 10
    missing = sorted(used - exported)
    assert missing == [], missing


def test_every_alert_is_in_the_guide():
    alerts = re.findall(r"^\s*- alert: (\w+)$", rules_text(), re.M)
    assert len(alerts) >= 10
    with open(GUIDE) as f:
        guide = f.read()
    for a in alerts:
        assert "`%s`" % a in guide, a
