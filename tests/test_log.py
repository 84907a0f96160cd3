"""ddp_utils.log: the library's logger as a host script sees it, each case in a fresh interpreter.

Logging is process-wide state, so every case imports ddp_utils in its own ``python -c``
and reads what reached stderr.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from .multiproc import REPO_ROOT, launcher_env

pytestmark = pytest.mark.timeout(300)


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = launcher_env(env)
    environ.pop("DDP_UTILS_VERBOSE", None)
    environ.update(env)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO_ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    return done


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


USER_LINES = """
    import ddp_utils as du
    du.LOGGER.info("user info line")
    du.LOGGER.warning("user warning line")
"""


@pytest.mark.slow
def test_a_plain_import_speaks_on_rank_0_without_set_logging_and_leaves_root_alone():
    done = run(
        USER_LINES
        + """
    import logging
    assert logging.getLogger().handlers == [] and logging.getLogger().level == logging.WARNING
    print(du.select_device("cpu"))
    """
    )
    assert lines(done.stderr)[:2] == ["user info line", "user warning line"]
    assert sum("torch" in line and "ddp_utils: Python" in line for line in lines(done.stderr)) == 1  # the banner
    assert done.stdout.strip() == "cpu"


@pytest.mark.slow
def test_the_label_scan_summary_reaches_a_yolov5_users_script(tmp_path):
    code = f"""
    from ddp_utils import create_dataloader, make_shapes_dataset
    root = make_shapes_dataset({str(tmp_path / "shapes")!r}, 4, 2, size=(64, 64))
    create_dataloader(str(root / "images" / "train"), 64, 2, 32, workers=0, prefix="train: ")
    """
    summary = [line for line in lines(run(code).stderr) if line.startswith("train: 4 images")]
    assert len(summary) == 1 and "4 found, 0 missing" in summary[0]


@pytest.mark.slow
def test_other_ranks_show_warnings_only_and_say_whose():
    done = run(USER_LINES, RANK="1", LOCAL_RANK="1", WORLD_SIZE="2")
    assert lines(done.stderr) == ["[rank 1] user warning line"]


@pytest.mark.slow
def test_rank_0_of_a_job_speaks_like_a_single_process():
    done = run(USER_LINES, RANK="0", LOCAL_RANK="0", WORLD_SIZE="2")
    assert lines(done.stderr) == ["user info line", "user warning line"]


@pytest.mark.slow
@pytest.mark.parametrize("quiet", ["0", "false", "off"])
def test_the_environment_variable_keeps_info_quiet(quiet):
    assert lines(run(USER_LINES, DDP_UTILS_VERBOSE=quiet).stderr) == ["user warning line"]


@pytest.mark.slow
def test_a_host_that_configures_the_root_logger_gets_each_line_once_in_its_own_format():
    code = """
    import logging
    logging.basicConfig(level=logging.INFO, format="HOST %(name)s %(levelname)s %(message)s")
    """
    done = run(code + USER_LINES)
    assert lines(done.stderr) == ["HOST ddp_utils INFO user info line", "HOST ddp_utils WARNING user warning line"]


@pytest.mark.slow
def test_a_handler_of_the_host_on_our_logger_replaces_ours():
    code = """
    import logging, sys
    import ddp_utils as du
    mine = logging.StreamHandler(sys.stdout)
    mine.setFormatter(logging.Formatter("MINE %(message)s"))
    du.LOGGER.addHandler(mine)
    """
    done = run(code + USER_LINES)
    assert lines(done.stdout) == ["MINE user info line", "MINE user warning line"]
    assert done.stderr.strip() == ""


@pytest.mark.slow
def test_a_null_handler_silences_it():
    code = """
    import logging
    logging.getLogger("ddp_utils").addHandler(logging.NullHandler())
    """
    assert run(code + USER_LINES).stderr.strip() == ""


@pytest.mark.slow
@pytest.mark.parametrize("calls", [1, 2])
def test_set_logging_after_import_prints_each_line_once(calls):
    code = """
    import logging
    logging.basicConfig(level=logging.INFO, format="HOST %(message)s")
    import ddp_utils as du
    """
    code = code.rstrip(" ") + "    du.set_logging()\n" * calls
    done = run(code + USER_LINES)
    assert lines(done.stderr) == ["user info line", "user warning line"]


@pytest.mark.slow
def test_set_logging_rank_and_verbosity_override_the_environment():
    code = """
    import ddp_utils as du
    du.set_logging(rank=2)
    du.LOGGER.info("hidden on rank 2")
    du.LOGGER.warning("shown")
    du.set_logging(rank=0, verbose=False)
    du.LOGGER.info("hidden: not verbose")
    du.set_logging(rank=0)
    du.LOGGER.info("shown again")
    """
    done = run(code, DDP_UTILS_VERBOSE="0")
    assert lines(done.stderr) == ["[rank 2] shown", "shown again"]


@pytest.mark.slow
def test_the_rank_is_read_when_a_line_is_logged_not_at_import():
    code = """
    import os
    import ddp_utils as du
    os.environ.update(RANK="3", LOCAL_RANK="1", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2")
    du.LOGGER.info("hidden")
    du.LOGGER.warning("late rank")
    """
    assert lines(run(code).stderr) == ["[rank 3] late rank"]


def test_in_process_the_logger_has_one_handler_of_ours():
    import ddp_utils as du

    du.set_logging(rank=-1)
    du.set_logging(rank=-1)
    ours = [h for h in du.LOGGER.handlers if getattr(h, "_ddp_utils", False)]
    assert len(ours) == 1
