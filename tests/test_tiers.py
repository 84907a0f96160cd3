"""The two test tiers (root conftest.py): the guard that keeps slow tests out of the fast tier, and the split."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from .multiproc import REPO_ROOT


def _pytest(tmp_path, source: str, *args: str, enforce: str | None = None) -> subprocess.CompletedProcess:
    """Run pytest on one test file in ``tmp_path`` with this checkout's conftest.py and pyproject options, with
    ``$REQUIRE_FAST_TIER`` set to ``enforce`` (None: unset, whatever the shell that runs this suite has)."""
    (tmp_path / "conftest.py").write_text((REPO_ROOT / "conftest.py").read_text())
    (tmp_path / "pyproject.toml").write_text((REPO_ROOT / "pyproject.toml").read_text().replace(
        'testpaths = ["tests", "ddp_utils"]', 'testpaths = ["."]'))  # fmt: skip
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(source))
    env = {name: value for name, value in os.environ.items() if name != "REQUIRE_FAST_TIER"}
    if enforce is not None:
        env["REQUIRE_FAST_TIER"] = enforce
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


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


NAMED = re.compile(r"^test_sample\.py::test_unmarked_and_slow took (\d+\.\d) s$", re.M)
ADVICE = "mark them @pytest.mark.slow (with a @pytest.mark.timeout) or make them faster"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_plain_run_names_an_unmarked_slow_test_and_passes(tmp_path):
    # the README's command on a loaded machine: the test over the limit (the guard's 10 s, scaled down) is named at
    # the end with its time, from an xdist worker as the README's command runs it, and the run passes
    result = _pytest(tmp_path, SAMPLE, "--fast-tier-seconds", "0.2", "-n", "2")
    output = result.stdout + result.stderr
    assert result.returncode == 0 and re.search(r"\b2 passed\b", result.stdout), output
    assert "over the fast tier's 0.2 s" in result.stdout and "failed" not in result.stdout, output
    named = NAMED.findall(result.stdout)
    assert len(named) == 1 and float(named[0]) >= 0.5, output
    assert "test_quick took" not in result.stdout and "test_marked_slow" not in result.stdout, output
    assert "1 test(s) not marked slow took more than 0.2 s and passed" in result.stdout and ADVICE in result.stdout
    quiet = _pytest(tmp_path, SAMPLE, "--fast-tier-seconds", "0.2", "-k", "quick")  # nothing over: no section
    assert quiet.returncode == 0 and "fast tier" not in quiet.stdout, quiet.stdout + quiet.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["REQUIRE_FAST_TIER=1 (CI)", "--enforce-fast-tier"])
def test_ci_and_the_developers_option_fail_an_unmarked_slow_test_saying_to_mark_it(tmp_path, how):
    if how == "--enforce-fast-tier":
        result = _pytest(tmp_path, SAMPLE, "--fast-tier-seconds", "0.2", "--enforce-fast-tier")
    else:
        result = _pytest(tmp_path, SAMPLE, "--fast-tier-seconds", "0.2", enforce="1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed, 1 passed, 1 deselected" in result.stdout, result.stdout
    assert re.search(
        r"test_unmarked_and_slow took \d+\.\d s, more than the fast tier's 0\.2 s: mark it @pytest\.mark\.slow",
        result.stdout,
    ), result.stdout
    assert len(NAMED.findall(result.stdout)) == 1 and "and failed (the tier is enforced here)" in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_slow_tier_runs_what_the_fast_one_leaves_out(tmp_path):
    result = _pytest(tmp_path, SAMPLE, "-m", "slow", "--fast-tier-seconds", "0.2", enforce="1")
    assert result.returncode == 0 and "1 passed, 2 deselected" in result.stdout, result.stdout + result.stderr
    unguarded = _pytest(tmp_path, SAMPLE, "--fast-tier-seconds", "0", enforce="1")  # 0: no limit at all
    assert unguarded.returncode == 0 and "2 passed, 1 deselected" in unguarded.stdout, unguarded.stdout
    assert "fast tier" not in unguarded.stdout, unguarded.stdout
    off = _pytest(tmp_path, SAMPLE, "--fast-tier-seconds", "0.2", enforce="0")  # "0": not enforced
    assert off.returncode == 0 and "2 passed, 1 deselected" in off.stdout, off.stdout


def test_ci_enforces_the_fast_tier_where_it_runs_the_readmes_test_command():
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    enforced, readme_tests = ci.find("\nexport REQUIRE_FAST_TIER=1\n"), ci.find('\neval "$test_cmd"\n')
    assert 0 < enforced < readme_tests, "CI must export REQUIRE_FAST_TIER=1 before it runs the README's test command"


def test_modules_that_run_train_py_are_in_the_slow_tier():
    import conftest

    for module in conftest.SLOW_MODULES:
        assert (REPO_ROOT / module).is_file(), module
    assert "tests/test_train.py" in conftest.SLOW_MODULES and "tests/test_slurm.py" in conftest.SLOW_MODULES
