"""Data yamls: resolution, errors, downloads over a local HTTP server, zip safety, generators, hyps."""

from __future__ import annotations

import hashlib
import threading
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from ddp_utils.data.config import check_dataset, datasets_dir
from ddp_utils.data.labels import find_images
from ddp_utils.downloads import DownloadError
from ddp_utils.hyp import load_hyp
from ddp_utils.yamls import DataConfigError, asset_dir
from tests.http_server import serve
from tests.multiproc import describe, launch, records

HYP_KEYS = [
    "lr0",
    "lrf",
    "momentum",
    "weight_decay",
    "warmup_epochs",
    "warmup_momentum",
    "warmup_bias_lr",
    "box",
    "cls",
    "cls_pw",
    "obj",
    "obj_pw",
    "iou_t",
    "anchor_t",
    "fl_gamma",
    "hsv_h",
    "hsv_s",
    "hsv_v",
    "degrees",
    "translate",
    "scale",
    "shear",
    "perspective",
    "flipud",
    "fliplr",
    "mosaic",
    "mixup",
    "copy_paste",
]


@pytest.fixture
def datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "datasets"
    monkeypatch.setenv("DDP_UTILS_DATASETS_DIR", str(directory))
    return directory


def write_yaml(path: Path, content: dict | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False))
    return path


def jpeg(seed: int = 0) -> bytes:
    img = np.random.default_rng(seed).integers(0, 255, (24, 32, 3), dtype=np.uint8)
    return cv2.imencode(".jpg", img)[1].tobytes()


def make_zip(path: Path, members: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, content in members.items():
            zf.writestr(name, content)
    return path


def dataset_members(top: str = "ds/") -> dict[str, bytes]:
    return {
        f"{top}images/train/a.jpg": jpeg(1),
        f"{top}images/train/b.jpg": jpeg(2),
        f"{top}labels/train/a.txt": b"0 0.5 0.5 0.2 0.2\n",
        f"{top}images/val/c.jpg": jpeg(3),
    }


# --- a local HTTP server ------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path):
    """(directory it serves, base URL, list of requested paths)."""
    www = tmp_path / "www"
    www.mkdir()
    with serve(www) as (url, requests):
        yield www, url, requests


def leftovers(directory: Path) -> list[Path]:
    return list(directory.glob(".*partial*")) if directory.exists() else []


# --- resolution ---------------------------------------------------------------------------------


def test_bare_name_resolves_to_the_shipped_yaml_and_its_generator_runs(datasets: Path) -> None:
    data = check_dataset("shapes.yaml")
    assert Path(data["yaml_file"]) == asset_dir("data") / "shapes.yaml"
    assert data["path"] == str(datasets / "shapes")
    assert data["names"] == {0: "circle", 1: "square", 2: "triangle", 3: "star"} and data["nc"] == 4
    shipped = yaml.safe_load((asset_dir("data") / "shapes.yaml").read_text())
    assert len(find_images(data["train"])) == shipped["n_train"]
    assert len(find_images(data["val"])) == shipped["n_val"]
    assert data["test"] is None and data["n_train"] == shipped["n_train"]
    stamp = (datasets / "shapes" / "shapes.json").stat().st_mtime_ns
    again = check_dataset("shapes")  # no suffix; made once, not again
    assert again["train"] == data["train"]
    assert (datasets / "shapes" / "shapes.json").stat().st_mtime_ns == stamp


def test_path_rules(tmp_path: Path, datasets: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data" / "ds" / "images").mkdir(parents=True)
    base = {"train": "images", "val": "images", "names": ["a"]}

    beside = write_yaml(tmp_path / "cfg" / "beside.yaml", {"path": "../data/ds", **base})
    assert check_dataset(beside)["train"] == str(tmp_path / "data" / "ds" / "images")
    assert check_dataset(str(beside))["yaml_file"] == str(beside)

    no_path = write_yaml(tmp_path / "data" / "ds" / "here.yaml", base)
    assert check_dataset(no_path)["path"] == str(tmp_path / "data" / "ds")

    (datasets / "ds2" / "images").mkdir(parents=True)
    fallback = write_yaml(tmp_path / "cfg" / "fallback.yaml", {"path": "../datasets/ds2", **base})
    assert check_dataset(fallback)["path"] == str(datasets / "ds2")

    monkeypatch.chdir(tmp_path / "data")
    listed = {"path": "ds", "train": ["images", "images"], "val": "images", "names": {"0": "a"}}
    out = check_dataset(listed)
    assert out["train"] == [str(tmp_path / "data" / "ds" / "images")] * 2 and out["yaml_file"] is None
    assert datasets_dir() == datasets


def test_names_forms(tmp_path: Path) -> None:
    base = {"path": str(tmp_path), "train": ".", "val": "."}
    assert check_dataset({**base, "names": ["x", "y"]})["names"] == {0: "x", 1: "y"}
    assert check_dataset({**base, "names": {1: "y", 0: "x"}, "nc": 2})["names"] == {0: "x", 1: "y"}
    assert check_dataset({**base, "nc": 3})["names"] == {0: "class0", 1: "class1", 2: "class2"}


BAD_YAMLS = {
    "no_val": ("train: images\nnames: [a]\n", "'val'"),
    "no_train": ("val: images\nnames: [a]\n", "'train'"),
    "no_names": ("train: images\nval: images\n", "'names'"),
    "nc_mismatch": ("train: images\nval: images\nnames: [a, b]\nnc: 3\n", "'nc' is 3 but 'names' has 2"),
    "nc_not_int": ("train: images\nval: images\nnc: three\n", "'nc'"),
    "names_gap": ("train: images\nval: images\nnames: {0: a, 2: b}\n", "'names' ids"),
    "names_type": ("train: images\nval: images\nnames: 7\n", "'names'"),
    "not_mapping": ("- train\n- val\n", "expected a mapping"),
    "syntax": ("train: [images\nval: images\n", "not valid YAML"),
    "missing_dir": ("path: /nonexistent/ddp_utils_test\ntrain: images\nval: images\nnames: [a]\n", "'train'"),
    "script_download": ("train: nope\nval: nope\nnames: [a]\ndownload: bash get_data.sh\n", "'download'"),
    "dest_escapes": (
        "train: nope\nval: nope\nnames: [a]\ndownload: [{url: 'http://127.0.0.1:9/x.zip', dest: ../up}]\n",
        "dest '../up'",
    ),
    "python_download": ("train: nope\nval: nope\nnames: [a]\ndownload: \"import os; os.remove('x')\"\n", "'download'"),
}


@pytest.mark.parametrize("case", sorted(BAD_YAMLS))
def test_bad_yaml_errors_name_the_key_and_the_file(tmp_path: Path, datasets: Path, case: str) -> None:
    content, expected = BAD_YAMLS[case]
    file = write_yaml(tmp_path / f"{case}.yaml", content)
    with pytest.raises((DataConfigError, FileNotFoundError)) as info:
        check_dataset(file)
    assert str(file) in str(info.value) and expected in str(info.value), str(info.value)
    assert not (tmp_path / "x").exists()


def test_missing_yaml_names_the_places_looked_at() -> None:
    with pytest.raises(FileNotFoundError, match="no_such_data.yaml"):
        check_dataset("no_such_data.yaml")


def test_shipped_coco_yamls_describe_the_real_datasets(datasets: Path) -> None:
    coco128 = yaml.safe_load((asset_dir("data") / "coco128.yaml").read_text())
    coco = yaml.safe_load((asset_dir("data") / "coco.yaml").read_text())
    assert coco128["download"] == "https://github.com/ultralytics/assets/releases/download/v0.0.0/coco128.zip"
    assert coco128["train"] == coco128["val"] == "images/train2017"
    urls = [item["url"] for item in coco["download"]]
    assert urls[0] == "https://github.com/ultralytics/assets/releases/download/v0.0.0/coco2017labels.zip"
    assert [u.rsplit("/", 1)[1] for u in urls[1:]] == ["train2017.zip", "val2017.zip", "test2017.zip"]
    assert (coco["train"], coco["val"], coco["test"]) == ("train2017.txt", "val2017.txt", "test-dev2017.txt")
    for data in (coco, coco128):
        assert len(data["names"]) == 80 and data["names"][0] == "person" and data["names"][79] == "toothbrush"
    for name in ("coco.yaml", "coco128.yaml"):  # never downloads in tests
        with pytest.raises(FileNotFoundError, match="autodownload is off"):
            check_dataset(name, autodownload=False)
    assert not datasets.exists() or not any(datasets.iterdir())


# --- downloads ----------------------------------------------------------------------------------


def test_download_zip_over_http_with_checksum(tmp_path: Path, datasets: Path, server) -> None:
    www, url, requests = server
    archive = make_zip(www / "ds.zip", dataset_members("ds/"))
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    file = write_yaml(
        tmp_path / "ds.yaml",
        {
            "path": "ds",
            "train": "images/train",
            "val": "images/val",
            "names": ["thing"],
            "download": [{"url": f"{url}/ds.zip", "sha256": digest}],
        },
    )
    data = check_dataset(file)
    assert data["path"] == str(datasets / "ds")
    assert sorted(Path(p).name for p in find_images(data["train"])) == ["a.jpg", "b.jpg"]
    assert (datasets / "ds" / "labels" / "train" / "a.txt").read_text() == "0 0.5 0.5 0.2 0.2\n"
    assert not (datasets / "ds" / "ds").exists(), "the archive's top folder is not nested again"
    assert leftovers(datasets) == []
    check_dataset(file)
    assert requests == ["/ds.zip"], "a present dataset is not fetched again"


def test_download_several_zips_with_destinations(tmp_path: Path, datasets: Path, server) -> None:
    """The COCO pattern: labels and image lists in one archive, images in others."""
    www, url, _ = server
    make_zip(
        www / "labels.zip",
        {
            "coco/labels/train2017/a.txt": b"0 0.5 0.5 0.2 0.2\n",
            "coco/train2017.txt": b"./images/train2017/a.jpg\n",
            "coco/val2017.txt": b"./images/val2017/b.jpg\n",
        },
    )
    make_zip(www / "train2017.zip", {"train2017/a.jpg": jpeg(1)})
    make_zip(www / "val2017.zip", {"val2017/b.jpg": jpeg(2)})
    file = write_yaml(
        tmp_path / "coco.yaml",
        {
            "path": "coco",
            "train": "train2017.txt",
            "val": "val2017.txt",
            "names": ["a"],
            "download": [
                f"{url}/labels.zip",
                {"url": f"{url}/train2017.zip", "dest": "images"},
                {"url": f"{url}/val2017.zip", "dest": "images"},
            ],
        },
    )
    data = check_dataset(file)
    assert find_images(data["train"]) == [str(datasets / "coco" / "images" / "train2017" / "a.jpg")]
    assert find_images(data["val"]) == [str(datasets / "coco" / "images" / "val2017" / "b.jpg")]
    assert leftovers(datasets) == []


def test_two_nodes_downloading_into_one_shared_root_both_succeed(tmp_path: Path, datasets: Path, server) -> None:
    www, url, requests = server
    make_zip(www / "ds.zip", dataset_members("ds/"))
    file = write_yaml(
        tmp_path / "ds.yaml",
        {"path": "ds", "train": "images/train", "val": "images/val", "names": ["x"], "download": f"{url}/slow/ds.zip"},
    )
    start = threading.Barrier(2)
    results: list[object] = []

    def node() -> None:
        start.wait()
        try:
            results.append(check_dataset(file)["train"])
        except Exception as exc:  # collected for the assertion below
            results.append(exc)

    threads = [threading.Thread(target=node) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == [str(datasets / "ds" / "images" / "train")] * 2, results
    assert len(requests) == 2, "both fetched: the second merged into the first's copy"
    assert sorted(p.name for p in (datasets / "ds" / "images" / "train").iterdir()) == ["a.jpg", "b.jpg"]
    assert leftovers(datasets) == []


def test_checksum_mismatch_leaves_no_dataset(tmp_path: Path, datasets: Path, server) -> None:
    www, url, _ = server
    make_zip(www / "ds.zip", dataset_members("ds/"))
    file = write_yaml(
        tmp_path / "ds.yaml",
        {
            "path": "ds",
            "train": "images/train",
            "val": "images/val",
            "names": ["thing"],
            "download": [{"url": f"{url}/ds.zip", "sha256": "0" * 64}],
        },
    )
    with pytest.raises(DownloadError, match=r"ds\.zip: sha256 mismatch"):
        check_dataset(file)
    assert not (datasets / "ds").exists() and leftovers(datasets) == []


def test_interrupted_download_leaves_no_dataset(tmp_path: Path, datasets: Path, server) -> None:
    www, url, _ = server
    make_zip(www / "ds.zip", dataset_members("ds/"))
    file = write_yaml(
        tmp_path / "ds.yaml",
        {"path": "ds", "train": "images/train", "val": "images/val", "names": ["x"], "download": f"{url}/cut/ds.zip"},
    )
    with pytest.raises(DownloadError, match=r"cut/ds\.zip: incomplete, got \d+ of \d+ bytes"):
        check_dataset(file)
    assert not (datasets / "ds").exists() and leftovers(datasets) == []


@pytest.mark.parametrize(
    "evil", ["../evil.txt", "ds/../../evil.txt", "/tmp/ddp_utils_zip_slip_evil.txt", "C:\\evil.txt"]
)
def test_zip_slip_is_refused_and_nothing_is_written(tmp_path: Path, datasets: Path, server, evil: str) -> None:
    www, url, _ = server
    members = dataset_members("ds/")
    members[evil] = b"owned"
    make_zip(www / "evil.zip", members)
    file = write_yaml(
        tmp_path / "ds.yaml",
        {"path": "ds", "train": "images/train", "val": "images/val", "names": ["x"], "download": f"{url}/evil.zip"},
    )
    with pytest.raises(DownloadError, match="outside the dataset directory"):
        check_dataset(file)
    assert not (datasets / "ds").exists() and leftovers(datasets) == []
    assert not list(tmp_path.rglob("*evil*.txt")) and not Path("/tmp/ddp_utils_zip_slip_evil.txt").exists()


def test_not_a_zip_is_a_clear_error(tmp_path: Path, datasets: Path, server) -> None:
    www, url, _ = server
    (www / "page.zip").write_text("<html>not found</html>")
    file = write_yaml(
        tmp_path / "ds.yaml",
        {"path": "ds", "train": "images/train", "val": "images/val", "names": ["x"], "download": f"{url}/page.zip"},
    )
    with pytest.raises(DownloadError, match="page.zip: not a zip archive"):
        check_dataset(file)


def test_http_error_names_the_url(tmp_path: Path, datasets: Path, server) -> None:
    _, url, _ = server
    file = write_yaml(
        tmp_path / "ds.yaml",
        {"path": "ds", "train": "images/train", "val": "images/val", "names": ["x"], "download": f"{url}/gone.zip"},
    )
    with pytest.raises(DownloadError, match=r"gone\.zip: HTTP Error 404"):
        check_dataset(file)
    assert not (datasets / "ds").exists() and leftovers(datasets) == []


def test_archive_with_the_wrong_layout_is_reported(tmp_path: Path, datasets: Path, server) -> None:
    www, url, _ = server
    make_zip(www / "other.zip", {"other/images/x.jpg": jpeg()})
    file = write_yaml(
        tmp_path / "ds.yaml",
        {"path": "ds", "train": "images/train", "val": "images/val", "names": ["x"], "download": f"{url}/other.zip"},
    )
    with pytest.raises(FileNotFoundError, match="still missing after the download"):
        check_dataset(file)


# --- hyperparameters ----------------------------------------------------------------------------


def test_load_hyp_shipped_and_by_path(tmp_path: Path) -> None:
    low = load_hyp("hyp.scratch-low.yaml")
    assert list(low) == HYP_KEYS
    assert (low["lr0"], low["lrf"], low["momentum"], low["weight_decay"]) == (0.01, 0.01, 0.937, 0.0005)
    assert (low["box"], low["cls"], low["obj"], low["anchor_t"], low["mixup"]) == (0.05, 0.5, 1.0, 4.0, 0.0)
    shapes = load_hyp("hyp.shapes")
    # the optional training keys train.py reads (YOLOv5 fixes them at 64 and 100)
    assert set(shapes) == set(HYP_KEYS) | {"nbs", "warmup_min_iters"}
    assert shapes["mixup"] == 0.0 and shapes["lr0"] > low["lr0"]
    own = write_yaml(tmp_path / "mine.yaml", {"lr0": 0.1})
    assert load_hyp(own) == {"lr0": 0.1}
    bad = write_yaml(tmp_path / "bad.yaml", "lr0: fast\n")
    with pytest.raises(DataConfigError, match=r"bad\.yaml: key 'lr0'"):
        load_hyp(bad)


# --- once per node, in a real process group ------------------------------------------------------


def _generator_yaml(tmp_path: Path, fail: bool) -> Path:
    return write_yaml(
        tmp_path / "gen.yaml",
        {
            "path": str(tmp_path / "gen"),
            "train": "images/train",
            "val": "images/val",
            "names": ["circle", "square", "triangle", "star"],
            "download": "tests.workers.data_config_scenarios:counting_generator",
            "counter": str(tmp_path / "calls.txt"),
            "fail": fail,
        },
    )


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_download_runs_once_per_node(tmp_path: Path) -> None:
    workers = launch(
        "tests.workers.data_config_scenarios:check_dataset_once",
        nprocs=2,
        timeout=120,
        args=(str(_generator_yaml(tmp_path, fail=False)),),
        env={"DDP_UTILS_TRUSTED_GENERATORS": "tests.workers"},
    )
    assert all(w.returncode == 0 for w in workers), describe(workers)
    recs = records(workers)
    assert all("error" not in r for r in recs), describe(workers)
    assert all(r["found"] == ["000000.jpg", "000001.jpg"] for r in recs)
    assert len((tmp_path / "calls.txt").read_text().splitlines()) == 1, "the generator ran more than once"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_failed_download_fails_every_rank_promptly(tmp_path: Path) -> None:
    workers = launch(
        "tests.workers.data_config_scenarios:check_dataset_once",
        nprocs=2,
        timeout=120,
        args=(str(_generator_yaml(tmp_path, fail=True)),),
        env={"DDP_UTILS_TRUSTED_GENERATORS": "tests.workers"},
    )
    by_rank = {r["rank"]: r for r in records(workers)}
    assert "generator failed on purpose" in by_rank[0]["error"], describe(workers)
    assert "RankFailedError" in by_rank[1]["error"] and "generator failed on purpose" in by_rank[1]["error"]
    assert by_rank[1]["seconds"] < 30
    assert len((tmp_path / "calls.txt").read_text().splitlines()) == 1
    assert not (tmp_path / "gen").exists()


def test_yaml_text_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    file = write_yaml(
        tmp_path / "evil.yaml",
        f"train: !!python/object/apply:os.system ['touch {marker}']\nval: x\nnames: [a]\n",
    )
    with pytest.raises(DataConfigError, match="not valid YAML"):
        check_dataset(file)
    assert not marker.exists()
