"""train.py's options checked before anything starts: combinations and every numeric option's range."""

from __future__ import annotations

import argparse
import sys

import pytest
import torch
import yaml

from ddp_utils.run import option_checks
from ddp_utils.run import options as options_module
from ddp_utils.run.options import OptionError, batch_image_bytes, check_options, yolov5_option_notes
from train import parse_opt


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--imgsz", "-5"], "--imgsz -5: give the image size in pixels"),
        (["--imgsz", "0"], "--imgsz 0: give the image size in pixels"),
        (["--workers", "-1"], "--workers -1: give a number of loader workers >= 0"),
        (["--patience", "-3"], "--patience -3: give epochs without improvement >= 0"),
        (["--save-interval", "-1"], "--save-interval -1.0: give minutes >= 0"),
        (["--save-interval", "nan"], "--save-interval nan: give minutes >= 0"),
        (["--label-smoothing", "1"], "--label-smoothing 1.0: give a value in [0, 1)"),
        (["--freeze", "10", "-1"], "--freeze 10 -1: give layer counts or indices >= 0"),
        (["--seed", "-7"], "--seed -7: give a seed >= 0"),
        (["--seed", "99999999999999999999"], "--seed 99999999999999999999: give a seed >= 0 and at most 2**63 - 1"),
        (["--epochs", "0"], "--epochs 0: train at least one epoch"),
        (["--batch-size", "0"], "--batch-size 0: give the total batch size"),
        # torch wraps a limit past cuDNN's C int (2**31 -> negative, 2**40 -> 0: "all"), and fails past 2**64
        (["--cudnn-benchmark-limit", "99999999999999999999"], "--cudnn-benchmark-limit 99999999999999999999: give"),
        (["--cudnn-benchmark-limit", "2147483648"], "--cudnn-benchmark-limit 2147483648: give the algorithms to try"),
        (["--cudnn-benchmark-limit", "-1"], "--cudnn-benchmark-limit -1: give the algorithms to try per convolution"),
        (["--evolve-heartbeat", "inf"], "--evolve-heartbeat inf: give seconds > 0 and at most 86400"),
        (["--evolve-heartbeat", "nan"], "--evolve-heartbeat nan: give seconds > 0"),
        (["--evolve", "99999999999999999999"], "--evolve 99999999999999999999: give the number of trials"),
        (["--evolve", "10001"], "--evolve 10001: give the number of trials, at least 1 and at most 10,000"),
        (["--requeue-signal", "9"], "--requeue-signal 9: SIGKILL cannot be caught"),
        (["--requeue-signal", "KILL"], "--requeue-signal KILL: SIGKILL cannot be caught"),
        (["--requeue-signal", "SIGSTOP"], "--requeue-signal SIGSTOP: SIGSTOP cannot be caught"),
        (["--requeue-signal", "19"], "--requeue-signal 19: SIGSTOP cannot be caught"),
        (["--requeue-signal", "USR9"], "--requeue-signal='USR9' is no signal"),
    ],
)
def test_a_value_out_of_range_is_one_line_naming_the_option_and_the_value(args, message):
    with pytest.raises(OptionError) as info:
        check_options(parse_opt(args), world_size=1)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
    assert isinstance(info.value, ValueError) and info.value.option == args[0]


@pytest.mark.parametrize(
    "args",
    [[], ["--imgsz", "320", "--workers", "0", "--patience", "0", "--save-period", "-1", "--save-interval", "0"],
     ["--save-period", "5", "--label-smoothing", "0.1", "--freeze", "10", "--seed", "0"], ["--save-period", "0"]],
)  # fmt: skip
def test_the_defaults_and_sensible_values_pass(args):  # --save-period below 1 is "never", as in YOLOv5
    check_options(parse_opt(args), world_size=1)


@pytest.mark.parametrize(
    "args",
    [["--cudnn-benchmark-limit", "0"], ["--cudnn-benchmark-limit", "2147483647"], ["--evolve", "10000"],
     ["--evolve-heartbeat", "86400"], ["--requeue-signal", "USR2"], ["--requeue-signal", "12"],
     ["--requeue-signal", "none"]],
)  # fmt: skip
def test_the_edges_of_the_ranges_pass(args):
    check_options(parse_opt(args), world_size=1)


def test_an_uncatchable_requeue_signal_from_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("DDP_UTILS_REQUEUE_SIGNAL", "KILL")
    with pytest.raises(OptionError, match=r"^DDP_UTILS_REQUEUE_SIGNAL=KILL: SIGKILL cannot be caught .* use USR1"):
        check_options(parse_opt([]), world_size=1)


def test_epochs_and_imgsz_read_as_yolov5s_defaults_and_the_data_yamls_train_defaults_still_apply(tmp_path):
    """A YOLOv5 user's script reads ``parse_opt(True).epochs`` (100) and ``.imgsz`` (640); left at those defaults,
    the data yaml's train_defaults still choose, and a value given on the command line wins, even 100."""
    opt = parse_opt(True)
    assert (opt.epochs, opt.imgsz) == (100, 640) and isinstance(opt.epochs, int) and opt.epochs * 2 == 200
    data = tmp_path / "tiny.yaml"
    data.write_text(f"path: {tmp_path / 'tiny'}\ntrain: images\nval: images\nnames: {{0: a}}\n"
                    "train_defaults: {epochs: 7, imgsz: 96}\n")  # fmt: skip
    (tmp_path / "tiny" / "images").mkdir(parents=True)
    from ddp_utils.distributed import DistInfo
    from ddp_utils.run.start import start_run

    info = DistInfo(rank=0, world_size=1, local_rank=0, local_world_size=1)
    left = start_run(parse_opt(["--data", str(data)]), info, torch.device("cpu"), None)
    assert (left.epochs, left.imgsz) == (7, 96)  # the data yaml's
    given = start_run(parse_opt(["--data", str(data), "--epochs", "100", "--imgsz", "640"]), info, "cpu", None)
    assert (given.epochs, given.imgsz) == (100, 640) and type(given.options()["epochs"]) is int
    assert yaml.safe_load(yaml.safe_dump(vars(parse_opt([]))))["epochs"] == 100  # opt.yaml-safe as it is


@pytest.mark.parametrize("where", ["--hyp", "train.run(hyp=dict)", "the data yaml's train_defaults"])
def test_a_hyp_with_anchors_is_refused_in_a_plain_run_as_under_evolve(tmp_path, where):
    """YOLOv5 builds its model with hyp['anchors'] anchors per output and computes them with AutoAnchor; with no
    AutoAnchor here the key was ignored without a word. ``anchors: 0`` is YOLOv5's "ignore", and passes."""
    hyp = tmp_path / "hyp.yaml"
    hyp.write_text("lr0: 0.01\nanchors: 3\n")
    data = tmp_path / "data.yaml"
    data.write_text(f"path: {tmp_path}\ntrain: images\nval: images\nnames: {{0: a}}\n"
                    f"train_defaults: {{hyp: {hyp}}}\n")  # fmt: skip
    if where == "--hyp":
        opt = parse_opt(["--hyp", str(hyp)])
    elif where == "the data yaml's train_defaults":
        opt = parse_opt(["--data", str(data)])
    else:
        opt = argparse.Namespace(**{**vars(parse_opt([])), "hyp": {"lr0": 0.01, "anchors": 3}})
    with pytest.raises(OptionError, match=r"^--hyp .*anchors: 3: YOLOv5 builds its model .* no AutoAnchor") as info:
        check_options(opt, world_size=1)
    assert info.value.option == "--hyp"
    hyp.write_text("lr0: 0.01\nanchors: 0\n")
    check_options(parse_opt(["--hyp", str(hyp)]), world_size=1)


# YOLOv5's train.py options (its parse_opt, v7.0 and master), each with a value it takes
YOLOV5_COMMAND = (
    "--weights yolov5s.pt --cfg yolov5s.yaml --data coco128.yaml --hyp hyp.scratch-low.yaml --epochs 3 --batch-size 16 "
    "--imgsz 640 --rect --resume --nosave --noval --noautoanchor --noplots --bucket b --cache ram --image-weights "
    "--device cpu --multi-scale --single-cls --optimizer SGD --sync-bn --workers 8 --project runs/train --name exp "
    "--exist-ok --quad --cos-lr --label-smoothing 0.1 --patience 100 --freeze 10 --save-period 5 --seed 0 "
    "--local_rank -1 --entity me --upload_dataset --bbox_interval 2 --artifact_alias latest --ndjson-console "
    "--ndjson-file"
)


def test_every_yolov5_train_option_parses_and_those_that_do_nothing_say_so():
    opt = parse_opt(YOLOV5_COMMAND.split())
    notes = yolov5_option_notes(opt)
    named = [note.split(":")[0] for note in notes]
    assert named == ["--noautoanchor", "--bucket", "--upload-dataset", "--bbox-interval",
                     "--ndjson-console", "--ndjson-file"]  # fmt: skip
    assert all("accepted for YOLOv5 compatibility, does nothing here (" in note for note in notes)
    assert yolov5_option_notes(parse_opt([])) == []  # nothing said when none is given


def test_evolve_takes_yolov5s_bare_form_and_refuses_zero_trials_in_one_line():
    assert parse_opt(["--evolve"]).evolve == 300  # YOLOv5's const
    check_options(parse_opt(["--evolve", "4"]), world_size=1)
    with pytest.raises(ValueError, match=r"^--evolve 0: give the number of trials, at least 1"):
        check_options(parse_opt(["--evolve", "0"]), world_size=1)


def test_parse_opt_takes_yolov5s_known_keyword(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py", "--epochs", "3", "--not-an-option", "x"])
    assert parse_opt(known=True).epochs == 3  # YOLOv5's parse_opt(known=True): the unknown ones ignored
    assert parse_opt(True).epochs == 3  # its positional form
    assert parse_opt(["--epochs", "2", "--zzz"], known=True).epochs == 2
    with pytest.raises(SystemExit):
        parse_opt()  # without known, an unknown option is refused as on the command line


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [({"imgsz": -5}, "--imgsz"), ({"epochs": 0}, "--epochs"), ({"seed": 10**20}, "--seed"),
     ({"imgsz": 100_000}, "--imgsz"), ({"rect": True, "multi_scale": True}, "--rect")],
)  # fmt: skip
def test_train_run_from_python_raises_a_value_error_naming_the_option(monkeypatch, kwargs, option):
    import train

    monkeypatch.setattr(sys, "argv", ["train.py"])
    monkeypatch.setattr(train, "main", lambda opt: pytest.fail(f"main ran with {opt}"))
    with pytest.raises(OptionError) as info:
        train.run(**kwargs)
    assert isinstance(info.value, ValueError) and info.value.option == option
    assert str(info.value).startswith(option) and "\n" not in str(info.value)


@pytest.mark.parametrize(("kwargs", "error", "named"), [
    ({"data": "{tmp}/nonexistent.yaml"}, FileNotFoundError, "{tmp}/nonexistent.yaml: no such file"),
    ({"cfg": "{tmp}/no_model.yaml"}, FileNotFoundError, "{tmp}/no_model.yaml"),
    ({"weights": "{tmp}/no_weights.pt"}, FileNotFoundError, "{tmp}/no_weights.pt"),
])  # fmt: skip
def test_train_run_from_python_raises_a_missing_file_naming_it_and_the_interpreter_goes_on(
    monkeypatch, tmp_path, kwargs, error, named
):
    """What the command line says in one line and exit 2 is, from Python, the error itself: no SystemExit."""
    import train

    monkeypatch.setattr(sys, "argv", ["train.py"])
    given = {k: v.format(tmp=tmp_path) for k, v in kwargs.items()}
    project = tmp_path / "runs"
    with pytest.raises(error) as info:  # a SystemExit (BaseException) would fail this test, not pass it
        train.run(**given, device="cpu", project=str(project), epochs=1, imgsz=64, batch_size=2, workers=0)
    assert named.format(tmp=tmp_path) in str(info.value) and "\n" not in str(info.value)
    assert not project.exists()  # refused before any run directory


def test_the_command_line_still_says_a_missing_data_yaml_in_one_line_and_exits_2(tmp_path):
    """The other side of raising_user_errors: outside it, user_errors ends the process with code 2."""
    missing = FileNotFoundError(f"{tmp_path}/nonexistent.yaml: no such file")
    with pytest.raises(SystemExit) as info, options_module.user_errors():
        raise missing
    assert info.value.code == 2
    with options_module.raising_user_errors(), pytest.raises(FileNotFoundError) as raised, options_module.user_errors():
        raise missing
    assert raised.value is missing and options_module.is_user_error(missing)
    with pytest.raises(SystemExit), options_module.user_errors():  # the mode ends with its block
        raise FileNotFoundError("x")


def test_an_image_size_whose_batch_the_host_cannot_hold_is_refused(monkeypatch):
    room = (2 * 2**30, "the host's available memory")  # a host with 2 GiB to spare
    monkeypatch.setattr(option_checks, "memory_room", lambda: room)
    check_options(parse_opt(["--imgsz", "640", "--device", "cpu"]), world_size=1)  # 94 MiB: fits
    with pytest.raises(
        OptionError, match=r"^--imgsz 4096: one batch of 16 images .* needs at least 3.8 GiB .* 2.0 GiB more \(the host"
    ):
        check_options(parse_opt(["--imgsz", "4096", "--device", "cpu"]), world_size=1)
    check_options(parse_opt(["--imgsz", "4096", "--batch-size", "4", "--device", "cpu"]), world_size=1)  # 0.9 GiB
    with pytest.raises(OptionError, match=r"one batch of 4 images .* \(up to 1.5 x with --multi-scale\)"):
        check_options(parse_opt(["--imgsz", "4096", "--batch-size", "8", "--multi-scale", "--device", "cpu"]), 2)
    assert batch_image_bytes(4096, 16, float_copy=False) * 5 == batch_image_bytes(4096, 16)  # on a GPU: uint8 only


@pytest.mark.parametrize(
    ("code", "exc", "line"),
    [
        (2, FileNotFoundError("data x.yaml: no such file"), "train.py: error: data x.yaml: no such file"),
        (3, ValueError("training diverged at epoch 2, batch 4/4: ..."), "train.py: diverged: training diverged at"),
        (74, OSError("training ended after epoch 3 but could not save"), "train.py: save failed: training ended"),
    ],
)
def test_each_exit_code_prints_its_one_line_with_a_prefix_of_its_own(monkeypatch, code, exc, line):
    # argparse's "train.py: error:" is a mistake in the inputs' (exit 2), not a run that diverged (3) or whose
    # final or stop save failed (74): those printed it too
    from ddp_utils.log import LOGGER

    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    said = []
    monkeypatch.setattr(LOGGER, "error", said.append)
    with pytest.raises(SystemExit) as exited:
        options_module.exit_or_raise(exc, code=code)
    assert exited.value.code == code and len(said) == 1 and said[0] == options_module.EXIT_PREFIXES[code] + str(exc)
    assert said[0].startswith(line) and ("train.py: error:" in said[0]) is (code == 2)
