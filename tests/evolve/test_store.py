"""The study store: N slots claimed once each by any number of workers, a stopped trial continued, a lost worker's
trial failed and retried once, a study made for another evolution refused; on SQLite and on a real PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import optuna
import pytest

from ddp_utils.evolve.settings import EvolveSettings
from ddp_utils.evolve.store import (
    StoreError,
    check_storage_url,
    claim,
    grace_period,
    open_storage,
    open_study,
    pause,
    results_count,
    trial_id,
)
from ddp_utils.evolve.study import Evolution
from tests.multiproc import REPO_ROOT, collect, describe, free_port, launcher_env
from tests.workers.evolve_scenarios import identity, study_for
from train import parse_opt

SCENARIOS = "tests.workers.evolve_scenarios"
POSTGRES_ENV, REQUIRE_POSTGRES = "TEST_POSTGRES_URL", "REQUIRE_POSTGRES"  # no DDP_UTILS_: conftest drops those

optuna.logging.set_verbosity(optuna.logging.WARNING)


def postgres_url() -> str:
    """The test server's URL (.ci/postgres starts one), or skip; with $REQUIRE_POSTGRES set, a missing one fails."""
    url = os.environ.get(POSTGRES_ENV, "")
    if not url:
        message = f"no PostgreSQL server for the tests: start one with .ci/postgres and set ${POSTGRES_ENV}"
        if os.environ.get(REQUIRE_POSTGRES, "").strip() not in ("", "0"):
            pytest.fail(f"{message} (${REQUIRE_POSTGRES} is set: these tests must run here)", pytrace=False)
        pytest.skip(message)
    return url


def workers(count: int, *args: str, timeout: float = 120) -> list[dict]:
    procs = [
        subprocess.Popen([sys.executable, "-m", "tests.multiproc", *args], cwd=REPO_ROOT, env=launcher_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        for _ in range(count)
    ]  # fmt: skip
    done = collect(procs, time.monotonic(), timeout, args[0])
    assert all(w.returncode == 0 for w in done), describe(done)
    return [json.loads(w.stdout.strip().splitlines()[-1]) for w in done]


def assert_each_slot_once(url: str, name: str, generations: int, count: int) -> None:
    ran = workers(count, f"{SCENARIOS}:claim_loop", url, name, str(generations), "0.05")
    numbers = sorted(n for r in ran for n in r["ran"])
    assert numbers == list(range(generations)), ran  # every trial once, none twice, none more
    _, study = study_for(url, name, generations)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * generations
    assert results_count(study) == (generations, generations)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_three_workers_on_one_sqlite_store_run_each_trial_once(tmp_path):
    assert_each_slot_once(f"sqlite:///{tmp_path / 'study.db'}", "exp", 12, 3)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_three_workers_on_postgresql_run_each_trial_once():
    assert_each_slot_once(postgres_url(), f"claims-{os.getpid()}-{time.time_ns()}", 12, 3)


def test_a_stopped_trial_goes_back_to_the_queue_and_is_taken_before_new_ones(tmp_path):
    storage, study = study_for(f"sqlite:///{tmp_path / 'study.db'}", "exp", 3)
    first = claim(study, storage, "a")
    value = first.suggest_float("lr0", 1e-5, 0.1)
    assert first.number == 0 and value == 0.01  # the first trial: the starting values
    second = claim(study, storage, "a")
    pause(storage, first)
    again = claim(study, storage, "b")
    assert again.number == 0 and again.suggest_float("lr0", 1e-5, 0.1) == value  # its values kept
    assert {second.number, claim(study, storage, "b").number} == {1, 2}
    assert claim(study, storage, "b") is None


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_lost_workers_trial_is_failed_once_and_retried_with_its_values_never_a_result(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    (gone,) = workers(1, f"{SCENARIOS}:claim_and_vanish", url, "exp", "2", "1")
    storage, study = study_for(url, "exp", 2, heartbeat=1)
    time.sleep(3)  # past the grace period (twice the heartbeat) with no heartbeat
    taken = [claim(study, storage, "w1"), claim(study, storage, "w2"), claim(study, storage, "w3")]
    lost = study.trials[gone["claimed"]]
    assert lost.state == optuna.trial.TrialState.FAIL  # failed by the first claim: one winner
    retry = next(t for t in study.trials if t.system_attrs.get("failed_trial") == lost.number)
    assert retry.params == lost.params and retry.user_attrs["dir"] == "/nonexistent/trials/0"
    assert sorted(t.number for t in taken if t is not None) == [1, retry.number]  # the slot left, and the retry
    assert taken[2] is None and len(study.trials) == 3  # one retry, not one per worker that saw it
    assert results_count(study) == (0, 2)  # the failure that was retried is no result and takes no slot


def test_a_study_made_for_another_evolution_is_refused_in_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study_for(url, "exp", 3)
    with pytest.raises(StoreError, match=r"^study 'exp' in sqlite:///.* made with another N \(--evolve\) \(3, now 4\)"):
        study_for(url, "exp", 4)
    storage = open_storage(url)
    other = identity(3) | {"data": {"yaml": "coco.yaml"}}
    with pytest.raises(StoreError, match=r"was made with another dataset \({'yaml': 'tiny.yaml'}, now {'yaml': 'coco"):
        open_study(storage, "exp", other, {"lr0": 0.01}, optuna.samplers.RandomSampler(), optuna.pruners.NopPruner())


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("study.db", r"^--evolve-storage study.db: not a database URL; give sqlite:///PATH/study.db or postgresql://"),
        ("redis://127.0.0.1/0", r"^--evolve-storage redis://127.0.0.1/0: not a database URL"),
    ],
)
def test_a_url_that_is_no_database_is_refused_before_connecting(url, message):
    with pytest.raises(StoreError, match=message):
        check_storage_url(url)


@pytest.mark.timeout(60)
def test_an_unreachable_server_is_one_line_naming_the_url_with_its_password_masked():
    url = f"postgresql://me:secret@127.0.0.1:{free_port()}/nothing"
    with pytest.raises(StoreError) as caught:
        open_storage(url)
    message = str(caught.value)
    assert message.startswith(f"--evolve-storage postgresql://me:***@127.0.0.1:{url.split(':')[3]}")
    assert "cannot open the study store (OperationalError" in message and "secret" not in message
    assert "\n" not in message


def test_a_trial_another_worker_took_and_finished_after_this_one_read_the_queue_is_passed_over(tmp_path):
    """Worker a reads the queue (trials 0, 1 waiting); before it marks trial 0 running, worker b (its own connection)
    claims trial 0 and finishes it. a takes trial 1: Optuna's refusal to update a finished trial is no crash (CI's
    three SQLite workers met it once in a slow tier)."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage, study = study_for(url, "exp", 2)
    other_storage, other_study = study_for(url, "exp", 2)
    beat = storage.record_heartbeat

    def beat_after_b_finished_it(trial_id):
        if not other_study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
            taken = claim(other_study, other_storage, "b")
            taken.suggest_float("lr0", 1e-5, 0.1)
            other_study.tell(taken, 0.5)
        beat(trial_id)

    storage.record_heartbeat = beat_after_b_finished_it
    mine = claim(study, storage, "a")
    assert mine is not None and mine.number == 1
    states = [t.state for t in study.get_trials()]
    assert states == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING]
    assert claim(study, storage, "a") is None


def test_a_restarted_job_takes_its_own_silent_trial_back_and_costs_no_retry(tmp_path):
    """Rank 0 froze: its trial's heartbeat stopped past the grace; the job's restart (same launch key) continues
    that trial, before its own claim (or anyone's) fails it for the silence: no failure, no retry, no new slot."""
    storage, study = study_for(f"sqlite:///{tmp_path / 'study.db'}", "exp", 3, heartbeat=1)
    first = claim(study, storage, "job-a")
    time.sleep(3.5)  # silent past the grace (twice the 1 s heartbeat, as open_storage has it by default), with a margin
    again = claim(study, storage, "job-a", restarted=True)
    assert again.number == first.number == 0
    running, waiting = optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING
    assert [t.state for t in study.get_trials()] == [running, waiting, waiting]  # 3 trials: no retry queued
    other = claim(study, storage, "job-b")  # the heartbeat taken back is fresh: another worker leaves it alone
    assert other.number == 1 and study.get_trials()[0].state == running


def test_a_restart_that_comes_after_the_grace_takes_its_trials_retry_before_new_slots(tmp_path):
    """Another worker failed the silent trial first and queued its retry (number 3): the restarted job takes that
    retry, which continues the trial's run, not the next new slot."""
    storage, study = study_for(f"sqlite:///{tmp_path / 'study.db'}", "exp", 3, heartbeat=1)
    claim(study, storage, "job-a").set_user_attr("dir", "/runs/evolve/exp/trials/0")
    time.sleep(3.5)  # past the 2 s grace with a margin for a loaded host (was 2.5: failed once under load)
    assert claim(study, storage, "job-b").number == 1  # it failed trial 0 and queued the retry
    back = claim(study, storage, "job-a", restarted=True)
    frozen = study.get_trials()[back.number]
    assert back.number == 3 and frozen.system_attrs["failed_trial"] == 0
    assert frozen.user_attrs["dir"] == "/runs/evolve/exp/trials/0"  # where trial 0 saved: it continues there
    assert claim(study, storage, "job-c").number == 2


def test_the_grace_outlasts_the_stall_timeout_and_a_restart(tmp_path, monkeypatch):
    """The default 60 s heartbeat used to give 120 s of grace, less than the stall watchdog's 120 s plus torchrun's
    restart: another worker failed a frozen job's trial before the restart could take it back."""
    assert grace_period(60, 120) == 60 + 120 + 120 and grace_period(60, None) == 180
    monkeypatch.setenv("DDP_UTILS_STALL_TIMEOUT", "200")
    argv = ["--evolve", "2", "--project", str(tmp_path), "--evolve-heartbeat", "30"]
    settings = EvolveSettings.from_options(parse_opt(argv))
    assert settings.grace == 30 + 200 + 120
    evolution = Evolution.open(settings, "job-a")
    assert evolution.storage.grace_period == settings.grace  # what fail_stale_trials reads


def test_the_studys_objective_is_named_fitness_for_the_dashboard(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    _, study = study_for(url, "exp", 2)
    assert study.metric_names == ["fitness"]  # Optuna's dashboard says "Objective 0" for an unnamed one
    assert optuna.load_study(study_name="exp", storage=url).metric_names == ["fitness"]  # in the store, for all
    bare = optuna.create_study(storage=url, study_name="older", direction="maximize")  # one made before the name
    assert bare.metric_names is None
    bare.set_user_attr("ddp_utils.evolve", identity(2))
    bare.set_user_attr("ddp_utils.evolve.ready", True)
    storage = open_storage(url)
    opened = open_study(storage, "older", identity(2), {"lr0": 0.01}, optuna.samplers.RandomSampler(),
                        optuna.pruners.NopPruner())  # fmt: skip
    assert opened.metric_names == ["fitness"]


def test_heartbeat_ids_are_the_storages(tmp_path):
    storage, study = study_for(f"sqlite:///{tmp_path / 'study.db'}", "exp", 1)
    trial = claim(study, storage, "a")
    assert storage.get_trial(trial_id(trial)).number == trial.number


def test_a_new_study_says_it_is_queuing_its_trials_and_how_far_it_got(tmp_path, caplog, monkeypatch):
    """``--evolve 100000`` queued its rows for minutes before printing anything (now at most 10,000: the options)."""
    import logging

    from ddp_utils.evolve import store

    monkeypatch.setattr(store, "QUEUE_NOTE", 4)  # the real thresholds: 100 trials, a line every 10 s
    monkeypatch.setattr(store, "NOTE_EVERY_S", 0.0)
    caplog.set_level(logging.INFO, logger="ddp_utils")
    _, study = study_for(f"sqlite:///{tmp_path / 'study.db'}", "exp", 5)
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == "evolve: new study 'exp': queuing its 5 trials in the store, one row each"
    assert said[1:] == [f"evolve: {n}/5 trials queued" for n in range(2, 6)]
    assert len(study.trials) == 5


@pytest.mark.timeout(60)
def test_a_worker_waits_for_a_creator_still_queuing_past_the_wait_and_says_so(tmp_path, caplog):
    """10,000 slots take minutes on a slow disk: a second worker gave up after 120 s ("never set up completely")
    while the first was still queuing. It waits as long as slots keep coming, and fails only when they stop."""
    import logging
    import threading

    from ddp_utils.evolve.store import IDENTITY, READY

    url = f"sqlite:///{tmp_path / 'study.db'}"
    creator = optuna.create_study(storage=open_storage(url), study_name="exp", direction="maximize")
    creator.set_user_attr(IDENTITY, identity(6))

    def queue_slowly() -> None:  # 6 slots over 3 s, with a wait of 1 s
        for _ in range(6):
            creator.enqueue_trial({})
            time.sleep(0.5)
        creator.set_user_attr(READY, True)

    thread = threading.Thread(target=queue_slowly)
    thread.start()
    caplog.set_level(logging.INFO, logger="ddp_utils")
    try:
        study = open_study(open_storage(url), "exp", identity(6), {"lr0": 0.01}, optuna.samplers.RandomSampler(),
                           optuna.pruners.NopPruner(), wait=1.0)  # fmt: skip
    finally:
        thread.join()
    assert len(study.trials) == 6
    said = [r.getMessage() for r in caplog.records]
    assert any(re.match(r"evolve: another worker is setting study 'exp' up \(\d/6 trials queued\): waiting", m)
               for m in said), said  # fmt: skip
    optuna.create_study(storage=open_storage(url), study_name="stalled").set_user_attr(IDENTITY, identity(2))
    with pytest.raises(StoreError, match=r"^study 'stalled' .* was never set up completely"):  # nothing comes
        open_study(open_storage(url), "stalled", identity(2), {"lr0": 0.01}, optuna.samplers.RandomSampler(),
                   optuna.pruners.NopPruner(), wait=1.0)  # fmt: skip
