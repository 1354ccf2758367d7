"""`arbiter demo` (short, on the session's sandbox) and `arbiter queues`."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from arbiter.cli.demo import TENANTS
from arbiter.sandbox import Sandbox
from tests.e2e.helpers import delete_tenants, run_arbiter

NAMES = [tenant.name for tenant in TENANTS]


@pytest.fixture
def demo_cleanup(sandbox: Sandbox) -> Iterator[None]:
    yield
    # Waits, so that no demo pod holds capacity when the next test starts.
    delete_tenants(sandbox, NAMES, NAMES, wait=90)


def test_demo_runs_on_a_cluster_and_reports(sandbox: Sandbox, demo_cleanup: None) -> None:
    result = run_arbiter("demo", "--no-sandbox", "--kubeconfig", str(sandbox.kubeconfig),
                         "--duration", "24", "--load", "0.3", "--plain",
                         "--snapshot-every", "6", timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    # Snapshots, not redraws: no terminal control sequences, several tables.
    assert "\x1b[" not in out
    frames = re.findall(r"kube-arbiter demo  t=\s*(\d+)s / 24s   Jobs: (\d+)/(\d+) submitted, "
                        r"(\d+) admitted, (\d+) completed", out)
    assert len(frames) >= 3, out
    last = frames[-1]
    assert last[1] == last[2]  # every planned Job was submitted
    assert int(last[3]) > 0
    for name in NAMES:
        assert re.search(rf"^{re.escape(name)}\s+\d\s", out, re.MULTILINE), out
    # The summary: one line per tenant with jobs, admitted and completed.
    summary = out[out.index("Summary after"):]
    for tenant in TENANTS:
        row = re.search(rf"^  {re.escape(tenant.name)}\s+{tenant.weight}\s+(\d+)\s+(\d+)\s+(\d+)",
                        summary, re.MULTILINE)
        assert row is not None, summary
        jobs, admitted, completed = map(int, row.groups())
        assert jobs > 0 and 0 < admitted <= jobs and completed <= admitted
    # Shares converge: while a tenant had Jobs waiting, its dominant share was
    # on average its deserved (weighted DRF) share, within 0.1 (about one
    # Job's share: admission is by whole Jobs). Which tenants wait depends on
    # timing (a quick cluster may keep up with two of them): at least one.
    converged = re.findall(rf"^  ({'|'.join(map(re.escape, NAMES))})\s.*\s(\d\.\d\d)\s+"
                           r"(\d\.\d\d)$", summary, re.MULTILINE)
    assert converged, summary
    for name, share, deserved in converged:
        assert abs(float(share) - float(deserved)) <= 0.1, (name, share, deserved, summary)
    assert "Explore:" in out and "arbiter queues" in out
    assert "[demo] tenant ci: weight 1, guarantee cpu" in result.stderr

    # `arbiter queues` shows the same queues, once.
    table = run_arbiter("queues", "--kubeconfig", str(sandbox.kubeconfig), timeout=60)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:5] == ["QUEUE", "WEIGHT", "GUARANTEE", "ALLOCATED", "DESERVED"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(NAMES) <= set(rows)
    assert rows["ml-training"].split()[1] == "3"
    assert rows["ci"].split()[2] == "cpu"  # its guarantee
