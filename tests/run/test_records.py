"""Records opens a run's records in one order and closes them in the reverse one (ddp_utils/run/records.py)."""

from __future__ import annotations

import pytest

from ddp_utils.run.records import Records


class Part:
    """A record that writes down when it opens and closes (and can refuse to open)."""

    def __init__(self, name: str, journal: list, fails: bool = False) -> None:
        self.name, self.journal, self.fails = name, journal, fails

    def __enter__(self):
        if self.fails:
            raise OSError(f"{self.name} cannot open")
        self.journal.append(f"open {self.name}")
        return self

    def __exit__(self, *exc):
        self.journal.append(f"close {self.name}" + (" after an error" if exc[0] else ""))
        return False


def records(journal: list, failing: str = "") -> Records:
    watchdog, logger, control = (Part(n, journal, n == failing) for n in ("watchdog", "logger", "control"))
    return Records(logger=logger, stopper=None, saves=None, control=control, watchdog=watchdog)


def test_the_watchdog_opens_first_and_closes_last_and_an_error_reaches_every_record():
    journal: list = []
    with pytest.raises(RuntimeError, match="in the epochs"), records(journal):
        journal.append("epochs")
        raise RuntimeError("in the epochs")
    assert journal == [
        "open watchdog",
        "open logger",
        "open control",
        "epochs",
        "close control after an error",
        "close logger after an error",
        "close watchdog after an error",
    ]


def test_a_record_that_cannot_open_closes_those_already_open():
    journal: list = []
    with pytest.raises(OSError, match="control cannot open"), records(journal, failing="control"):
        journal.append("epochs")  # never reached
    assert journal == ["open watchdog", "open logger", "close logger after an error", "close watchdog after an error"]


class Saves:
    def __init__(self, journal: list) -> None:
        self.journal = journal

    def stop(self, fit, stats) -> None:  # saves, then waits for every write
        self.journal.append(("stop save", stats))

    def finish(self, fit) -> None:  # waits for every write (the final save's among them)
        self.journal.append("wait for the final save")


@pytest.mark.parametrize("reason", [None, "signal"])
def test_the_writes_finish_with_a_stops_last_pt_or_the_final_save_waited_for(reason):
    journal: list = []
    control = type("Control", (), {"reason": reason})()
    done = Records(logger=None, stopper=None, saves=Saves(journal), control=control, watchdog=None)
    done.finish_writes(fit=None, stats="the unfinished epoch")
    assert journal == ([("stop save", "the unfinished epoch")] if reason else ["wait for the final save"])
