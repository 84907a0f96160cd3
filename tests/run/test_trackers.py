"""The trackers for real: MLflow on a local sqlite store, Weights & Biases offline (its run file read back)."""

from __future__ import annotations

import json
import logging
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_utils.run.loggers import RESULTS_COLUMNS, ResultsLogger
from ddp_utils.run.trackers import Trackers

PARAMS = {"opt": {"epochs": 3, "imgsz": 128, "freeze": [0]}, "hyp": {"lr0": 0.01, "box": 0.05}}


def values(epoch: int) -> dict[str, float]:
    return {column: 0.1 * (epoch + 1) for column in RESULTS_COLUMNS[1:]}


def weights(save_dir: Path) -> list[Path]:
    (save_dir / "weights").mkdir(parents=True, exist_ok=True)
    paths = [save_dir / "weights" / "best.pt", save_dir / "weights" / "last.pt"]
    for path in paths:
        path.write_bytes(b"weights")
    return paths


@pytest.fixture
def mlflow_project(tmp_path, monkeypatch):
    """A project directory whose MLflow store is the local default (``<project>/mlflow.db``), and mlflow."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    project = tmp_path / "runs" / "train"
    project.mkdir(parents=True)
    return mlflow, project


def mlflow_runs(mlflow, project: Path) -> list:
    """The runs of the project's experiment, read back from its sqlite store."""
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    return client.search_runs([client.get_experiment_by_name(str(project)).experiment_id])


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_mlflow_gets_params_metrics_per_epoch_and_the_weights_and_a_resume_continues_its_run(mlflow_project):
    mlflow, project = mlflow_project
    save_dir = project / "exp"
    save_dir.mkdir()
    logger = ResultsLogger(save_dir, tensorboard=False, trackers=Trackers(["mlflow"], save_dir, project, PARAMS))
    for epoch in (0, 1):
        logger.log(epoch, values(epoch))
    logger.close(finished=False)  # stopped, to be resumed
    resumed = Trackers(["mlflow"], save_dir, project, PARAMS)
    resumed.log(2, values(2))
    resumed.log_weights(weights(save_dir))
    resumed.close()

    (run,) = mlflow_runs(mlflow, project)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    assert run.info.run_name == "exp" and run.info.status == "FINISHED"
    assert run.data.params["hyp/lr0"] == "0.01" and run.data.params["opt/freeze"] == "[0]"
    history = client.get_metric_history(run.info.run_id, "metrics/mAP_0.5:0.95")
    assert [(m.step, round(m.value, 6)) for m in history] == [(0, 0.1), (1, 0.2), (2, 0.3)]
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id, "weights")) == [
        "weights/best.pt",
        "weights/last.pt",
    ]
    assert (project / "mlartifacts").is_dir()


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_process_that_ends_with_its_mlflow_run_open_ends_it_failed(mlflow_project):
    mlflow, project = mlflow_project
    save_dir = project / "exp"
    save_dir.mkdir()
    code = (
        "from pathlib import Path; from ddp_utils.run.trackers import Trackers; "
        f"t = Trackers(['mlflow'], Path({str(save_dir)!r}), Path({str(project)!r}), {{}}); t.log(0, {{'x': 1.0}}); "
        "raise RuntimeError('a finish step failed')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)  # inherits no URI
    assert done.returncode == 1 and "a finish step failed" in done.stderr, done.stderr[-2000:]

    (run,) = mlflow_runs(mlflow, project)
    assert run.info.status == "FAILED"


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_an_error_or_a_second_ctrl_c_leaving_the_logger_ends_the_mlflow_run_failed_or_killed(mlflow_project):
    mlflow, project = mlflow_project
    for name, error in (("exp", RuntimeError("out of memory")), ("exp2", KeyboardInterrupt())):
        save_dir = project / name
        save_dir.mkdir()
        logger = ResultsLogger(save_dir, tensorboard=False, trackers=Trackers(["mlflow"], save_dir, project, PARAMS))
        with pytest.raises(type(error)), logger:
            logger.log(0, values(0))
            raise error
        assert logger.trackers is None  # closed: a later close() is a no-op

    runs = mlflow_runs(mlflow, project)
    assert {run.info.run_name: run.info.status for run in runs} == {"exp": "FAILED", "exp2": "KILLED"}


def wandb_records(run_file: Path) -> list:
    """The records of a W&B run file (a LevelDB-style log of protobuf records, after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2

    raw, pos, block, records, pending = run_file.read_bytes(), 7, 32768, [], b""
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        pending, pos = pending + raw[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_wandb_offline_writes_config_metrics_per_epoch_and_the_weights(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    save_dir = tmp_path / "runs" / "train" / "exp"
    save_dir.mkdir(parents=True)
    trackers = Trackers(["wandb"], save_dir, tmp_path / "runs" / "train", PARAMS)
    for epoch in (0, 1):
        trackers.log(epoch, values(epoch))
    trackers.log_weights(weights(save_dir))
    trackers.close()

    (run_file,) = (save_dir / "wandb").glob("offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 30  # wandb's own process writes the file: wait for its last record
    records = wandb_records(run_file)
    while not any(r.HasField("exit") for r in records) and time.monotonic() < deadline:
        time.sleep(0.2)
        records = wandb_records(run_file)
    history = [  # keys with a "/" come as nested keys
        {item.key or "/".join(item.nested_key): item.value_json for item in r.history.item}
        for r in records
        if r.HasField("history")
    ]
    assert [(h["epoch"], h["metrics/mAP_0.5"]) for h in history] == [("0", "0.1"), ("1", "0.2")]
    (run,) = [r.run for r in records if r.HasField("run")]
    config = {item.key: item.value_json for item in run.config.update}
    assert run.display_name == "exp" and json.loads(config["hyp"])["lr0"] == 0.01
    (artifact,) = [r.artifact for r in records if r.HasField("artifact")]
    assert artifact.type == "model" and sorted(e.path for e in artifact.manifest.contents) == ["best.pt", "last.pt"]


def test_a_tracker_that_cannot_start_or_fails_later_is_one_warning_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuch://store")  # a store mlflow cannot open
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        trackers = Trackers(["wandb", "mlflow"], tmp_path / "exp", tmp_path, PARAMS)
    messages = [r.getMessage() for r in caplog.records]
    assert trackers.active == [] and len(messages) == 2, messages
    assert messages[0] == "wandb: not installed, so not tracking this run (pip install 'ddp_utils[wandb]')"
    assert messages[1].startswith("mlflow: ") and "not tracking this run" in messages[1]

    class Broken:
        name = "broken"

        def log(self, epoch, row):
            raise OSError("No space left on device")

    trackers.active = [Broken()]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        trackers.log(0, values(0))
        trackers.log(1, values(1))  # dropped after the first failure: one warning
    assert [r.getMessage() for r in caplog.records] == [
        "broken: log failed (OSError: No space left on device); no longer tracking"
    ]
    assert trackers.active == []
