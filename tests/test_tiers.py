"""The two test tiers (root conftest.py): the guard that keeps slow tests out of the fast tier, and the split."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from .multiproc import REPO_ROOT


def _pytest(tmp_path, source: str, *args: str) -> subprocess.CompletedProcess:
    """Run pytest on one test file in ``tmp_path`` with this checkout's conftest.py and pyproject options."""
    (tmp_path / "conftest.py").write_text((REPO_ROOT / "conftest.py").read_text())
    (tmp_path / "pyproject.toml").write_text((REPO_ROOT / "pyproject.toml").read_text().replace(
        'testpaths = ["tests", "ddp_utils"]', 'testpaths = ["."]'))  # fmt: skip
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(source))
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", *args]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)


SAMPLE = """
    import time
    import pytest

    def test_quick():
        pass

    def test_unmarked_and_slow():
        time.sleep(0.5)

    @pytest.mark.slow
    def test_marked_slow():
        time.sleep(0.5)
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_unmarked_slow_test_fails_saying_to_mark_it(tmp_path):
    result = _pytest(tmp_path, SAMPLE, "--fast-tier-seconds", "0.2")  # the guard's 10 s, scaled down
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed, 1 passed, 1 deselected" in result.stdout, result.stdout
    assert "test_unmarked_and_slow took 0.5 s, more than the fast tier's 0.2 s: mark it @pytest.mark.slow" in (
        result.stdout
    )


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_slow_tier_runs_what_the_fast_one_leaves_out(tmp_path):
    result = _pytest(tmp_path, SAMPLE, "-m", "slow", "--fast-tier-seconds", "0.2")
    assert result.returncode == 0 and "1 passed, 2 deselected" in result.stdout, result.stdout + result.stderr
    unguarded = _pytest(tmp_path, SAMPLE, "--fast-tier-seconds", "0")  # 0: no guard, for a loaded host
    assert unguarded.returncode == 0 and "2 passed, 1 deselected" in unguarded.stdout, unguarded.stdout


def test_modules_that_run_train_py_are_in_the_slow_tier():
    import conftest

    for module in conftest.SLOW_MODULES:
        assert (REPO_ROOT / module).is_file(), module
    assert "tests/test_train.py" in conftest.SLOW_MODULES and "tests/test_slurm.py" in conftest.SLOW_MODULES
