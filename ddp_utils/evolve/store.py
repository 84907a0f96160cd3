"""The study store of ``train.py --evolve``: Optuna's database storage, the study's slots, claiming a trial.

One study holds every trial of an evolution, whichever worker (process, node) runs it: SQLite in the evolve
directory by default (``runs/evolve/exp/study.db``), or any database URL Optuna's storage takes (PostgreSQL
across nodes). What this module adds to Optuna's storage, and why:

- **Slots.** The worker that creates the study enqueues all N trials at once (waiting, the first with the
  ``--hyp`` values unchanged, as YOLOv5's first generation) and records what the study is (the data, the
  search space, N, the starting hyperparameters). A worker takes the next waiting trial with the storage's
  atomic WAITING -> RUNNING update, so N trials are run between all workers, each once, however many start.
- **Preemption.** A trial stopped by a signal goes back to waiting (its ``last.pt`` saved, its number kept):
  the next worker to start continues it. A worker killed hard stops beating its heartbeat; after the grace
  period (:func:`grace_period`: longer than the stall watchdog's timeout and a torchrun restart, so a job that
  restarts takes its own trial back first) any worker fails the trial (Optuna's ``fail_stale_trials``, one
  winner) and queues one retry with the same values, which continues from the trial's last save. A failed
  trial is never a result.
- **Identity.** A study made with other data, another search space or another N is refused in one line.
"""

from __future__ import annotations

import json
import math
import random
import re
import socket
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
import sqlalchemy.event
import sqlalchemy.exc
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from ..log import LOGGER

STUDY_FILE = "study.db"  # the default store, in the evolve directory
IDENTITY = "ddp_utils.evolve"  # the study's user attribute: what it was made with
READY = "ddp_utils.evolve.ready"  # set once every slot is enqueued
OBJECTIVE = "fitness"  # the objective's name in the study (the dashboard's axis and columns)
MAX_RETRIES = 3  # a trial whose worker was lost is tried again at most this often
RESTART_S = 120.0  # torchrun's restart of a job the stall watchdog ended, until its rank 0 claims again
SCHEMES = ("sqlite", "postgresql", "mysql")


class StoreError(ValueError):
    """A study store that cannot be used: an unknown or unreachable URL, or a study made for something else."""


def default_storage_url(evolve_dir: Path) -> str:
    """The embedded store: a SQLite file in the evolve directory.

    Examples:
        >>> default_storage_url(Path("/runs/evolve/exp"))
        'sqlite:////runs/evolve/exp/study.db'
    """
    return f"sqlite:///{(Path(evolve_dir).resolve() / STUDY_FILE).as_posix()}"


def shown_url(url: str) -> str:
    """``url`` with any password masked, for messages.

    Examples:
        >>> shown_url("postgresql://me:secret@db:5432/evolve")
        'postgresql://me:***@db:5432/evolve'
    """
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def check_storage_url(url: str) -> None:
    """Refuse a URL that is no database Optuna can keep a study in (before anything connects or is written).

    Raises:
        StoreError: one line naming the URL and the forms that work.

    Examples:
        >>> check_storage_url("postgresql://u@127.0.0.1:5432/db")
        >>> try:
        ...     check_storage_url("runs/study.db")
        ... except StoreError as exc:
        ...     print(str(exc)[:80])
        --evolve-storage runs/study.db: not a database URL; give sqlite:///PATH/study.db
    """
    scheme = url.split("://", 1)[0].split("+", 1)[0] if "://" in url else ""
    if scheme not in SCHEMES:
        raise StoreError(
            f"--evolve-storage {shown_url(url)}: not a database URL; give sqlite:///PATH/study.db or "
            "postgresql://USER@HOST:PORT/DATABASE"
        )


def grace_period(heartbeat: float, stall_timeout: float | None) -> int:
    """Seconds a running trial's heartbeat may be silent before any worker fails it and queues a retry.

    A frozen rank 0 stops its heartbeat at once; the other ranks' stall watchdog ends the job after
    ``stall_timeout``, torchrun restarts it (:data:`RESTART_S`) and the new rank 0 takes its trial back. The grace
    outlasts all of that plus one heartbeat interval (the last beat may be that old when the freeze comes), so no
    other worker fails a trial whose own job is coming back; never under two intervals (Optuna's usual grace).
    ``stall_timeout`` None: the watchdog is off (a restart still comes after a crash).

    Examples:
        >>> grace_period(60, 120), grace_period(60, None), grace_period(600, 120)
        (300, 180, 1200)
    """
    interval = max(int(round(heartbeat)), 1)
    return max(2 * interval, math.ceil(interval + (stall_timeout or 0.0) + RESTART_S))


def open_storage(url: str, heartbeat: float = 60.0, grace: int | None = None) -> RDBStorage:
    """Optuna's database storage at ``url``, with heartbeats (a lost worker's trial is failed and retried).

    Args:
        url: a SQLAlchemy URL: ``sqlite:///path``, ``postgresql://user@host:port/db``, ``mysql://...``.
        heartbeat: seconds between a running trial's heartbeats.
        grace: seconds a trial's heartbeat may be silent before it is failed (:func:`grace_period`); None: twice
            the heartbeat.

    Raises:
        StoreError: an unknown scheme, a driver that is not installed, a server that does not answer (one line).
    """
    check_storage_url(url)
    scheme = url.split("://", 1)[0]
    connect = {"timeout": 60} if scheme.startswith("sqlite") else {"connect_timeout": 10}
    if scheme.startswith("mysql"):
        connect = {"connect_timeout": 10}
    interval = max(int(round(heartbeat)), 1)
    try:
        for attempt in range(5):
            try:
                with warnings.catch_warnings():  # heartbeats are "experimental" since Optuna 2.9
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    storage = RDBStorage(
                        url,
                        engine_kwargs={"connect_args": connect, "pool_pre_ping": True},
                        heartbeat_interval=interval,
                        grace_period=grace or 2 * interval,
                        heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(MAX_RETRIES, True),
                    )
                    if scheme.startswith("sqlite"):
                        serialize_sqlite(storage.engine)
                    return storage
            except (
                sqlalchemy.exc.IntegrityError,
                sqlalchemy.exc.ProgrammingError,
                sqlalchemy.exc.OperationalError,
            ) as exc:
                # workers starting together on a new database race to create its tables: the loser finds them made
                racing = not isinstance(exc, sqlalchemy.exc.OperationalError) or "already exists" in str(exc)
                if attempt == 4 or not racing:
                    raise
                time.sleep(0.2 + random.random())
    except Exception as exc:  # SQLAlchemy's, the driver's: what the server said is the useful part
        reason = " ".join(str(exc).split("\n")[0].split())[:300] or type(exc).__name__
        raise StoreError(
            f"--evolve-storage {shown_url(url)}: cannot open the study store ({type(exc).__name__}: {reason}); "
            "check the URL, that the server runs and that its driver is installed (pip install 'ddp_utils[evolve]')"
        ) from None


def serialize_sqlite(engine: sqlalchemy.engine.Engine) -> None:
    """Make every SQLite transaction take the write lock when it begins (``BEGIN IMMEDIATE``).

    SQLite ignores ``SELECT ... FOR UPDATE``: two workers could both read a trial as waiting, then both mark it
    running, one after the other, and both train it. Taking the lock at the start makes the read and the update
    one step (SQLAlchemy's recipe for serializable SQLite); the connections made so far are dropped.
    """

    @sqlalchemy.event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None  # the driver's own BEGIN would come first

    @sqlalchemy.event.listens_for(engine, "begin")
    def _begin_immediate(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()


def open_study(
    storage: RDBStorage,
    name: str,
    identity: Mapping[str, Any],
    first: Mapping[str, float],
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner,
    wait: float = 120.0,
) -> optuna.Study:
    """The study ``name``: made with its N slots when new, else checked against ``identity``.

    Args:
        storage: the store (:func:`open_storage`).
        name: the study's name (``--name``).
        identity: what the study is: data, search space, N (``generations``), starting hyperparameters.
        first: the first trial's values (the ``--hyp`` yaml's, within the limits).
        sampler: Optuna's sampler, for this worker.
        pruner: Optuna's pruner, for this worker.
        wait: seconds to wait for another worker that is creating the study.

    Raises:
        StoreError: the study was made with other data, space, N or hyperparameters, or not by train.py --evolve.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(
            storage=storage, study_name=name, direction="maximize", sampler=sampler, pruner=pruner
        )
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(storage=storage, study_name=name, sampler=sampler, pruner=pruner)
        _wait_ready(study, name, identity, storage, wait)
        if study.metric_names is None:  # a study made before its objective had a name
            name_objective(study)
        return study
    name_objective(study)
    study.set_user_attr(IDENTITY, json.loads(json.dumps(dict(identity))))
    queue_slots(study, name, first, int(identity["generations"]))
    study.set_user_attr(READY, True)
    return study


QUEUE_NOTE = 100  # a new study of this many trials or more says it is queuing them (a few ms to 50 ms a row)
NOTE_EVERY_S = 10.0  # and how far it got, this often


def queue_slots(study: optuna.Study, name: str, first: Mapping[str, float], generations: int) -> None:
    """Enqueue the new study's ``generations`` slots, the first with ``first``; a long queue says how far it got."""
    if generations >= QUEUE_NOTE:
        LOGGER.info(f"evolve: new study {name!r}: queuing its {generations:,} trials in the store, one row each")
    noted = time.monotonic()
    study.enqueue_trial(dict(first))
    for queued in range(2, generations + 1):
        study.enqueue_trial({})
        if time.monotonic() - noted > NOTE_EVERY_S:
            noted = time.monotonic()
            LOGGER.info(f"evolve: {queued:,}/{generations:,} trials queued")


def name_objective(study: optuna.Study) -> None:
    """Name the study's objective ``fitness`` (YOLOv5's: 0.1 mAP@0.5 + 0.9 mAP@0.5:0.95), as Optuna's dashboard
    labels it; unnamed, it says "Objective 0"."""
    with warnings.catch_warnings():  # "experimental" in Optuna 3.2 to 5
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([OBJECTIVE])


def _wait_ready(study: optuna.Study, name: str, identity: Mapping[str, Any], storage: RDBStorage, wait: float) -> None:
    """Check a loaded study's identity, waiting for the worker that is still enqueueing its slots: as long as it
    adds some within ``wait`` seconds (10,000 slots take minutes on a slow disk), saying so every little while."""
    deadline, said, seen, study_id = time.monotonic() + wait, 0.0, -1, storage.get_study_id_from_name(name)
    while True:
        attrs, queued = study.user_attrs, storage.get_n_trials(study_id)
        if IDENTITY in attrs:
            check_identity(name, attrs[IDENTITY], identity, storage.url)
            if attrs.get(READY):
                return
        elif queued:
            raise StoreError(
                f"study {name!r} in {shown_url(storage.url)} was not made by train.py --evolve: "
                "give another --name (the study's name) or another --evolve-storage"
            )
        if queued > seen:  # the worker creating it is still at work
            deadline, seen = time.monotonic() + wait, queued
        if time.monotonic() > deadline:
            raise StoreError(
                f"study {name!r} in {shown_url(storage.url)} was never set up completely (the worker creating it "
                "stopped): give another --name, or delete the study (optuna delete-study)"
            )
        if IDENTITY in attrs and time.monotonic() - said > NOTE_EVERY_S:
            said, total = time.monotonic(), int(attrs[IDENTITY].get("generations", 0))
            LOGGER.info(f"evolve: another worker is setting study {name!r} up ({queued:,}/{total:,} trials queued): "
                        "waiting for it")  # fmt: skip
        time.sleep(0.5)


def check_identity(name: str, recorded: Mapping[str, Any], wanted: Mapping[str, Any], url: str = "") -> None:
    """Refuse a study recorded with other data, search space, N or starting hyperparameters.

    Raises:
        StoreError: one line naming what differs and what to do.

    Examples:
        >>> recorded, now = {"data": {"train": "a"}, "generations": 4}, {"data": {"train": "b"}, "generations": 4}
        >>> try:
        ...     check_identity("exp", recorded, now)
        ... except StoreError as exc:
        ...     print(str(exc)[:99])
        study 'exp' was made with another dataset ({'train': 'a'}, now {'train': 'b'}): give another --name
    """
    wanted = json.loads(json.dumps(dict(wanted)))
    what = {"data": "another dataset", "space": "another search space (--evolve-hyps)", "generations": "another N "
            "(--evolve)", "hyp": "other starting hyperparameters (--hyp)"}  # fmt: skip
    for key, words in what.items():
        if recorded.get(key) != wanted.get(key):
            where = f" in {shown_url(url)}" if url else ""
            raise StoreError(
                f"study {name!r}{where} was made with {words} ({_brief(recorded.get(key))}, now "
                f"{_brief(wanted.get(key))}): give another --name for a new study, or the study's own settings to "
                "continue it"
            )


def _brief(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 120 else text[:117] + "..."


def trial_id(trial: FrozenTrial | optuna.Trial) -> int:
    """The storage's id of a trial (Optuna's frozen trials keep it privately)."""
    return trial._trial_id


def claim(study: optuna.Study, storage: RDBStorage, launch: str, restarted: bool = False) -> optuna.Trial | None:
    """The next trial for this worker, marked running in the store; None when no trial is left to start.

    On a restart of the same job (``restarted``: torchrun's elastic restart, a SLURM requeue) it first takes back
    the trial this launch was running, before anything can fail it for its silent heartbeat (the restart's own
    claim included); or, when another worker failed it already, that trial's retry. Then it fails lost workers'
    trials (a stale heartbeat; each gets one retry, waiting) and takes the waiting trial with the lowest number:
    a stopped one before new ones. Rank 0 only.

    Args:
        launch: this job's launch key (:func:`~ddp_utils.distributed.launch_key`), recorded on the trial.
    """
    own = take_back(study, storage, launch) if restarted else None
    if own is not None:
        return own
    with warnings.catch_warnings():  # "experimental" since Optuna 2.9, and what its own optimize loop calls
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    for frozen in sorted(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)), key=lambda t: t.number):
        storage.record_heartbeat(trial_id(frozen))  # fresh before it runs: no worker takes it for a lost one
        if _start(storage, frozen):
            trial = optuna.Trial(study, trial_id(frozen))
            trial.set_user_attr("launch", launch)
            trial.set_user_attr("host", socket.gethostname())
            return trial
    return None


def _start(storage: RDBStorage, frozen: FrozenTrial) -> bool:
    """Mark a waiting trial running; False when another worker took it first, or took it and finished it since
    this worker read the queue (Optuna raises for a finished trial where it returns False for a running one)."""
    try:
        return storage.set_trial_state_values(trial_id(frozen), state=TrialState.RUNNING)  # atomic: one worker wins
    except optuna.exceptions.UpdateFinishedTrialError:
        return False


def take_back(study: optuna.Study, storage: RDBStorage, launch: str) -> optuna.Trial | None:
    """The trial ``launch`` was running before its restart, running again (its heartbeat fresh), or None.

    Its running trial; else a waiting one of the launch (the retry another worker queued after failing it, which
    keeps its attributes, or one a signal put back), so the restart continues from the trial's last save.
    """
    mine = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
            if t.user_attrs.get("launch") == launch]  # fmt: skip
    for frozen in sorted(mine, key=lambda t: (t.state != TrialState.RUNNING, t.number)):
        storage.record_heartbeat(trial_id(frozen))  # first: no claim elsewhere takes it for a lost one now
        state = storage.get_trial(trial_id(frozen)).state
        if state == TrialState.RUNNING or (state == TrialState.WAITING and _start(storage, frozen)):
            LOGGER.info(f"evolve: trial {frozen.number} was this job's before its restart: continuing it")
            return optuna.Trial(study, trial_id(frozen))
    return None


def pause(storage: RDBStorage, trial: optuna.Trial) -> None:
    """Put a trial stopped by a signal back in the queue: the next worker continues it (its number kept)."""
    storage.set_trial_state_values(trial_id(trial), state=TrialState.WAITING)


def results_count(study: optuna.Study, trials: list[FrozenTrial] | None = None) -> tuple[int, int]:
    """(trials finished: complete, pruned or failed, not counting a failure that was retried; the study's N),
    of ``trials`` (one reading of the study) when given, else of the study now.

    Examples:
        >>> import optuna
        >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
        >>> study = optuna.create_study()
        >>> study.set_user_attr(IDENTITY, {"generations": 3})
        >>> study.add_trial(optuna.create_trial(value=1.0))
        >>> results_count(study)
        (1, 3)
    """
    trials = study.get_trials(deepcopy=False) if trials is None else trials
    retried = {t.system_attrs.get("failed_trial") for t in trials} - {None}
    finished = [t for t in trials if t.state.is_finished() and t.number not in retried]
    return len(finished), int(study.user_attrs.get(IDENTITY, {}).get("generations", 0))


__all__ = [
    "IDENTITY",
    "MAX_RETRIES",
    "STUDY_FILE",
    "StoreError",
    "check_identity",
    "check_storage_url",
    "claim",
    "default_storage_url",
    "grace_period",
    "open_storage",
    "open_study",
    "pause",
    "results_count",
    "shown_url",
    "take_back",
    "trial_id",
]
