"""tests/slurm_cluster.py's verdict when no cluster starts: a skip that says why, a failure where CI requires SLURM."""

from __future__ import annotations

import pytest

from .slurm_cluster import REQUIRE_ENV, SlurmUnavailable, skip_or_fail


@pytest.mark.parametrize("value", [None, "", "0"])
def test_no_cluster_skips_saying_why_when_not_required(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(REQUIRE_ENV, raising=False)
    else:
        monkeypatch.setenv(REQUIRE_ENV, value)
    with pytest.raises(pytest.skip.Exception, match="no SLURM cluster on this machine: no slurmd on PATH"):
        skip_or_fail(SlurmUnavailable("no slurmd on PATH"))


def test_no_cluster_fails_where_slurm_is_required(monkeypatch):
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=r"no slurmd on PATH\n\(\$REQUIRE_SLURM is set"):
        skip_or_fail(SlurmUnavailable("no slurmd on PATH"))


def test_ci_requires_slurm():
    from .multiproc import REPO_ROOT

    lines = (REPO_ROOT / ".ci" / "run").read_text().splitlines()
    assert f"export {REQUIRE_ENV}=1" in lines
