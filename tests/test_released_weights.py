"""--weights yolov5s.pt as YOLOv5 users type it: the release fetched by name (here from a server on 127.0.0.1).

The "release" is a checkpoint in YOLOv5's layout written by the stand-in classes of
tests/yolo/yolov5_standins.py; DDP_UTILS_YOLOV5_RELEASE_URL points the download at the local server.
"""

from __future__ import annotations

import re
import stat
import sys
from pathlib import Path

import pytest
import yaml

from ddp_utils.downloads import RELEASE_URL_ENV, WEIGHTS_DIR_ENV, YOLOV5_RELEASED, release_url, released_weights
from ddp_utils.run.checkpoint import load_pretrained
from ddp_utils.yamls import find_asset
from ddp_utils.yolo import Model

from .http_server import serve
from .test_train import describe, run, tiny_data_yaml, train_args, train_env
from .yolo import yolov5_standins as v5
from .yolo.test_foreign import CONFIGS, save_yolov5


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """(base URL of a server on 127.0.0.1 holding yolov5n.pt, the list of paths requested)."""
    www = tmp_path_factory.mktemp("release")
    model = v5.build(yaml.safe_load((CONFIGS / "yolov5n.yaml").read_text()))
    model.yaml_file = "yolov5n.yaml"  # as YOLOv5 records the yaml its model was built from
    save_yolov5(v5.yolov5_checkpoint(model), www / "yolov5n.pt")
    with serve(www) as (url, requests):
        yield url, requests


@pytest.fixture
def cache(tmp_path, monkeypatch, release):
    monkeypatch.chdir(tmp_path)  # no yolov5n.pt here
    monkeypatch.setenv(WEIGHTS_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(RELEASE_URL_ENV, release[0])
    release[1].clear()
    return tmp_path / "cache"


def test_release_names_and_url_are_yolov5s_v7_assets(monkeypatch):
    monkeypatch.delenv(RELEASE_URL_ENV, raising=False)
    assert YOLOV5_RELEASED == ("yolov5n.pt", "yolov5n6.pt", "yolov5s.pt", "yolov5s6.pt", "yolov5m.pt", "yolov5m6.pt",
                               "yolov5l.pt", "yolov5l6.pt", "yolov5x.pt", "yolov5x6.pt")  # fmt: skip
    assert release_url("yolov5x6.pt") == "https://github.com/ultralytics/yolov5/releases/download/v7.0/yolov5x6.pt"
    assert released_weights("weights/yolov5s.pt") is None and released_weights("best.pt") is None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_missing_release_weights_are_downloaded_once_into_the_cache_and_read_safely(cache, release):
    old = __import__("os").umask(0o022)
    try:
        ckpt = load_pretrained("yolov5n.pt")
    finally:
        __import__("os").umask(old)
    assert ckpt["foreign"] == "yolov5" and ckpt["model_cfg"]["yaml_file"] == "yolov5n.yaml"
    assert release[1] == ["/yolov5n.pt"]
    assert sorted(p.name for p in cache.iterdir()) == ["yolov5n.pt", "yolov5n.pt.sha256"]  # no temp file left
    assert stat.S_IMODE((cache / "yolov5n.pt").stat().st_mode) == 0o644
    assert load_pretrained("yolov5n.pt")["model"].keys() == ckpt["model"].keys()
    assert release[1] == ["/yolov5n.pt"]  # the second time from the cache
    assert not Path("yolov5n.pt").exists()


def test_a_damaged_cached_copy_is_fetched_again(cache, release, caplog):
    released_weights("yolov5n.pt")
    data = bytearray((cache / "yolov5n.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (cache / "yolov5n.pt").write_bytes(bytes(data))
    assert load_pretrained("yolov5n.pt")["foreign"] == "yolov5"
    assert release[1] == ["/yolov5n.pt", "/yolov5n.pt"]
    assert "sha256 differs" in caplog.text


def test_a_truncated_download_is_one_line_and_leaves_nothing(cache, release, monkeypatch):
    monkeypatch.setenv(RELEASE_URL_ENV, release[0] + "/cut")
    with pytest.raises(FileNotFoundError) as info:
        load_pretrained("yolov5n.pt")
    message = str(info.value)
    assert "\n" not in message and re.search(r"incomplete, got \d+ of \d+ bytes", message), message
    assert f"fetch {release[0]}/cut/yolov5n.pt by hand" in message
    assert not cache.exists() or not list(cache.iterdir())


def test_offline_is_one_line_naming_the_url_to_fetch_by_hand(cache, monkeypatch):
    monkeypatch.setenv(RELEASE_URL_ENV, "http://127.0.0.1:9/v7.0")  # nothing listens on port 9
    with pytest.raises(FileNotFoundError) as info:
        load_pretrained("yolov5s.pt")
    message = str(info.value)
    assert "\n" not in message and message.startswith("yolov5s.pt: no such file here"), message
    assert f"fetch http://127.0.0.1:9/v7.0/yolov5s.pt by hand and give its path, or put it in {cache}" in message
    with pytest.raises(FileNotFoundError, match="checkpoint yolov5q.pt does not exist"):
        load_pretrained("yolov5q.pt")  # not a release name: not fetched


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_yolov5s_repo_paths_of_shipped_yamls_find_ours(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        find_asset("configs/hyps", "data/hyps/hyp.scratch-low.yaml").read_bytes()
        == find_asset("configs/hyps", "hyp.scratch-low.yaml").read_bytes()
    )
    assert Model("models/yolov5s.yaml").yaml_file.endswith("configs/models/yolov5s.yaml")
    assert find_asset("data", "data/coco128.yaml").name == "coco128.yaml"
    with pytest.raises(FileNotFoundError):
        find_asset("configs/models", "elsewhere/yolov5s.yaml")  # only YOLOv5's own layout maps to ours
    mine = tmp_path / "models" / "yolov5s.yaml"  # a user's own file at that path wins
    mine.parent.mkdir()
    mine.write_text("nc: 1\n")
    assert find_asset("configs/models", "models/yolov5s.yaml") == Path("models/yolov5s.yaml")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_train_weights_by_release_name_with_yolov5s_yaml_paths(tmp_path, release):
    data = tiny_data_yaml(tmp_path)
    env = train_env()
    env.update({WEIGHTS_DIR_ENV: str(tmp_path / "cache"), RELEASE_URL_ENV: release[0]})
    args = train_args(data, tmp_path / "runs", "--epochs", "1", "--weights", "yolov5n.pt", "--hyp",
                      "data/hyps/hyp.scratch-low.yaml")  # fmt: skip
    result = run([sys.executable, *args], env, 380)
    assert result.returncode == 0, describe([result])
    assert re.search(r"^yolov5n\.yaml: overriding nc=80 with nc=4$", result.stderr, re.M), result.stderr
    assert re.search(r"^YOLOv5n summary: \d+ layers", result.stderr, re.M), result.stderr
    assert re.search(r"^transferred \d+/\d+ tensors from yolov5n\.pt$", result.stderr, re.M), result.stderr
    assert (tmp_path / "cache" / "yolov5n.pt").is_file()

    env[RELEASE_URL_ENV] = "http://127.0.0.1:9/v7.0"
    args[args.index("yolov5n.pt")] = "yolov5s.pt"
    offline = run([sys.executable, *args], env, 120)
    assert offline.returncode == 2, describe([offline])
    errors = [line for line in offline.stderr.splitlines() if "train.py: error:" in line]
    assert len(errors) == 1 and "fetch http://127.0.0.1:9/v7.0/yolov5s.pt by hand" in errors[0], describe([offline])
    assert "Traceback" not in offline.stderr
