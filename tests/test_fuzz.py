"""Property tests: any label file, data yaml or model yaml gets a result or one clear error naming
the file; yaml, caches and checkpoints from a stranger never run code.

"Clear" means one of the library's own error types (or FileNotFoundError for a missing path)
with the offending file in the message. An unhandled TypeError, KeyError or IndexError from
deep inside fails the property. Each property counts its cases; ``-s`` prints the totals.
"""

from __future__ import annotations

import copy
import os
import pickle
import shutil
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from ddp_utils.data import DataConfigError, check_dataset, load_hyp, load_labels, make_shapes_dataset
from ddp_utils.run.checkpoint import CheckpointError, load_checkpoint
from ddp_utils.yolo import Model, ModelConfigError

pytestmark = pytest.mark.timeout(180)  # a parser that hangs on some input fails here
CASES: Counter[str] = Counter()
FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    print("\nfuzz cases run: " + ", ".join(f"{k} {v}" for k, v in sorted(CASES.items())))


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory) -> Path:
    return make_shapes_dataset(tmp_path_factory.mktemp("fuzz") / "shapes", n_train=2, n_val=1, size=(32, 48))


# --- label files ---------------------------------------------------------------------------------

TOKENS = st.one_of(
    st.sampled_from(["0", "1", "0.5", "-0", "nan", "inf", "-inf", "1e400", "1e-400", "0x1p-2", "1_0", "+.5", "", ","]),
    st.integers(-3, 100).map(str),
    st.floats(allow_nan=True, allow_infinity=True, width=32).map(repr),
    st.floats(-0.2, 1.2).map(lambda v: f"{v:.6f}"),
    st.text(max_size=6),
)
LINES = st.lists(st.lists(TOKENS, max_size=12).map(" ".join), max_size=8).map("\n".join)
COORD = st.one_of(st.floats(0, 1, width=32).map(repr), st.floats(-0.02, 1.02).map(lambda v: f"{v:.4f}"))
BOX = st.tuples(st.integers(0, 9).map(str), COORD, COORD, COORD, COORD).map(list)
POLYGON = st.tuples(st.integers(0, 9).map(str), st.lists(st.tuples(COORD, COORD), min_size=3, max_size=6)).map(
    lambda cp: [cp[0], *(v for xy in cp[1] for v in xy)]
)
# mostly well-formed rows, one of them perhaps broken: these reach the deeper checks
ROWS = st.lists(st.one_of(BOX, BOX, POLYGON), min_size=1, max_size=6)
NEAR_VALID = st.builds(
    lambda rows, i, j, token, sep: sep.join(
        " ".join(token if (k, m) == (i, j) else v for m, v in enumerate(row)) for k, row in enumerate(rows)
    ),
    ROWS,
    st.integers(0, 8),
    st.integers(0, 12),
    TOKENS,
    st.sampled_from(["\n", "\r\n", "\n\n", "\t\n"]),
)
LABEL_BYTES = st.one_of(
    NEAR_VALID.map(str.encode),
    NEAR_VALID.map(str.encode),
    LINES.map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.binary(max_size=300),
    st.text(max_size=300).map(lambda s: s.encode("utf-8", "surrogatepass")),
)


@FUZZ
@given(content=LABEL_BYTES)
def test_any_label_file_gives_labels_or_a_message_naming_it(tiny_dataset: Path, content: bytes) -> None:
    CASES["label files"] += 1
    images = sorted(str(p) for p in (tiny_dataset / "images" / "train").glob("*.jpg"))
    fuzzed = Path(images[0].replace("/images/", "/labels/")).with_suffix(".txt")
    fuzzed.write_bytes(content)
    cache = tiny_dataset / "labels" / f"{uuid.uuid4().hex}.cache"
    try:
        result = load_labels(images, cache_path=cache, workers=1)
    finally:
        cache.unlink(missing_ok=True)
    assert images[1] in result.im_files, "the good image beside the fuzzed one was lost"
    if images[0] in result.im_files:
        CASES["label files: kept"] += 1
        boxes = result.labels[result.im_files.index(images[0])]
        assert boxes.dtype == np.float32 and boxes.ndim == 2 and boxes.shape[1] == 5
        assert np.isfinite(boxes).all() and (boxes[:, 0] >= 0).all() and (boxes[:, 0] == boxes[:, 0].round()).all()
        assert (boxes[:, 1:] >= 0).all() and (boxes[:, 1:] <= 1).all()
    else:
        CASES["label files: reported"] += 1
        assert result.counts["corrupt"] == 1
        assert any(str(fuzzed) in message for message in result.messages), result.messages


# --- data yamls ----------------------------------------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 100),
    st.sampled_from([10**6, 10**12, 2**63, -(2**63)]),  # nc: 10**12 once built 10**12 placeholder names
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from([".", "..", "/", "images/train", "~", "nope/", "a.txt", "0", "-1"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=6), st.integers(-2, 5)), inner, max_size=4),
    ),
    max_leaves=10,
)
DATA_KEYS = st.sampled_from(["path", "train", "val", "test", "names", "nc", "download", "extra"])
DATA_DICTS = st.dictionaries(st.one_of(DATA_KEYS, st.text(max_size=8)), VALUES, max_size=8)
# valid ones, then one key replaced: these reach the deeper checks
VALID_DATA = {"path": ".", "train": "images/train", "val": "images/val", "names": ["circle", "square"]}
MUTATED_DATA = st.builds(lambda key, value: {**VALID_DATA, key: value}, DATA_KEYS, VALUES)
YAML_TEXT = st.one_of(
    st.text(max_size=200),
    st.lists(st.tuples(DATA_KEYS, st.text(max_size=20)), max_size=6).map(
        lambda kv: "\n".join(f"{k}: {v}" for k, v in kv)
    ),
)


def _check_data_yaml(file: Path) -> None:
    try:
        result = check_dataset(file, autodownload=False)
    except (DataConfigError, FileNotFoundError) as exc:
        assert str(file) in str(exc), f"the error does not name {file}: {exc}"
        CASES[f"data yamls: {type(exc).__name__}"] += 1
        return
    CASES["data yamls: resolved"] += 1
    assert isinstance(result, dict) and result["yaml_file"] == str(file.resolve())
    assert isinstance(result["names"], dict) and result["nc"] == len(result["names"]) >= 1


@FUZZ
@given(content=st.one_of(DATA_DICTS, MUTATED_DATA))
# found by the fuzzer: "~user" of no such user (expanduser's RuntimeError), a NUL in a path (the OS's ValueError)
@example(content={**VALID_DATA, "path": "~nouser"})
@example(content={**VALID_DATA, "train": "~nouser/images"})
@example(content={**VALID_DATA, "path": "a\x00"})
@example(content={**VALID_DATA, "val": ["images/val", "b\x00"]})
def test_any_data_dict_in_a_yaml_gives_a_dict_or_an_error_naming_the_file(tiny_dataset: Path, content) -> None:
    CASES["data yamls (dicts)"] += 1
    file = tiny_dataset / f"fuzz-{uuid.uuid4().hex[:8]}.yaml"
    file.write_text(yaml.safe_dump(content))
    try:
        _check_data_yaml(file)
    finally:
        file.unlink()


@FUZZ
@given(text=YAML_TEXT)
def test_any_data_yaml_text_gives_a_dict_or_an_error_naming_the_file(tiny_dataset: Path, text: str) -> None:
    CASES["data yamls (text)"] += 1
    file = tiny_dataset / f"fuzz-{uuid.uuid4().hex[:8]}.yaml"
    file.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        _check_data_yaml(file)
    finally:
        file.unlink()


@FUZZ
@given(content=st.one_of(YAML_TEXT, st.dictionaries(st.text(max_size=8), VALUES, max_size=6).map(yaml.safe_dump)))
def test_any_hyp_yaml_gives_numbers_or_an_error_naming_the_file(tmp_path_factory, content: str) -> None:
    CASES["hyp yamls"] += 1
    file = tmp_path_factory.mktemp("hyps") / "hyp.fuzz.yaml"
    file.write_text(content, encoding="utf-8", errors="surrogatepass")
    try:
        hyp = load_hyp(file)
    except DataConfigError as exc:
        assert str(file) in str(exc), f"the error does not name {file}: {exc}"
        return
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in hyp.values())


@pytest.mark.timeout(30)
@pytest.mark.parametrize("nc", [10**6, 10**12, 2**63])
def test_absurd_class_count_is_refused_at_once(tmp_path: Path, nc: int) -> None:
    # without names, check_dataset once built nc placeholder names: 10**12 ran until memory ran out
    CASES["bad inputs (class counts)"] += 1
    (tmp_path / "images").mkdir()
    file = tmp_path / "data.yaml"
    file.write_text(f"train: images\nval: images\nnc: {nc}\n")
    with pytest.raises(DataConfigError, match=rf"key 'nc' is {nc}, more than") as info:
        check_dataset(file, autodownload=False)
    assert str(file) in str(info.value)


# --- model yamls ---------------------------------------------------------------------------------

TINY_MODEL = {
    "nc": 2,
    "depth_multiple": 0.33,
    "width_multiple": 0.0625,
    "anchors": [[10, 13, 16, 30], [30, 61, 62, 45]],
    "backbone": [
        [-1, 1, "Conv", [64, 3, 2]],
        [-1, 1, "Conv", [128, 3, 2]],
        [-1, 3, "C3", [128]],
        [-1, 1, "Conv", [256, 3, 2]],
        [-1, 1, "SPPF", [256, 5]],
    ],
    "head": [
        [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
        [[-1, 2], 1, "Concat", [1]],
        [-1, 1, "C3", [128, False]],
        [[-1, 4], 1, "Detect", ["nc", "anchors"]],
    ],
}
MODEL_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-4, 40),
    st.floats(-2, 40),
    st.sampled_from([float("nan"), float("inf"), 1e300]),
    st.sampled_from(["nc", "anchors", "None", "True", "nearest", "Conv", "C3", "Detect", "Concat", "nn.Upsample"]),
    st.text(max_size=8),
)
MODEL_VALUES = st.recursive(MODEL_SCALARS, lambda inner: st.lists(inner, max_size=5), max_leaves=8)


@st.composite
def mutated_models(draw) -> dict:
    cfg = copy.deepcopy(TINY_MODEL)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["top", "layer", "field", "arg"]))
        if where == "top":
            cfg[draw(st.sampled_from(["nc", "depth_multiple", "width_multiple", "anchors", "backbone", "head"]))] = (
                draw(MODEL_VALUES)
            )
            continue
        part = draw(st.sampled_from(["backbone", "head"]))
        if not isinstance(cfg.get(part), list) or not cfg[part]:
            continue
        i = draw(st.integers(0, len(cfg[part]) - 1))
        layer = cfg[part][i]
        if where == "layer" or not isinstance(layer, list) or len(layer) != 4:
            cfg[part][i] = draw(MODEL_VALUES)
        elif where == "field":
            layer[draw(st.integers(0, 3))] = draw(MODEL_VALUES)
        elif isinstance(layer[3], list) and layer[3]:
            layer[3][draw(st.integers(0, len(layer[3]) - 1))] = draw(MODEL_SCALARS)
    return cfg


@st.composite
def nudged_models(draw) -> dict:
    """One argument or count nudged to another small value: many of these still build."""
    cfg = copy.deepcopy(TINY_MODEL)
    layers = cfg["backbone"] + cfg["head"]
    layer = layers[draw(st.integers(0, len(layers) - 1))]
    if layer[3] and draw(st.booleans()):
        layer[3][draw(st.integers(0, len(layer[3]) - 1))] = draw(
            st.one_of(st.integers(-1, 9), st.sampled_from([64, 2]))
        )
    else:
        layer[1] = draw(st.integers(0, 4))
    if draw(st.booleans()):
        cfg[draw(st.sampled_from(["depth_multiple", "width_multiple"]))] = draw(st.floats(0.01, 1.0))
    return cfg


def affordable(cfg: Any) -> bool:
    """False for a model that is valid but too large to build in a test: a depth or width multiple above 1.5
    (yolov5x's are 1.33 and 1.25). A drawn width of 40 asks for 5120-channel 3x3 convolutions: gigabytes, built
    for many minutes in one example. Astronomical multiples (1e300, inf) are refused at once and stay in."""
    if not isinstance(cfg, dict):
        return True
    multiples = (cfg.get(k) for k in ("depth_multiple", "width_multiple"))
    return not any(isinstance(m, (int, float)) and not isinstance(m, bool) and 1.5 < m < 1e100 for m in multiples)


@pytest.mark.slow
@settings(FUZZ, max_examples=200)
@given(cfg=st.one_of(nudged_models(), mutated_models(), st.dictionaries(st.text(max_size=8), MODEL_VALUES, max_size=6)))
def test_any_model_yaml_gives_a_model_or_an_error_naming_the_file(tmp_path_factory, cfg: dict) -> None:
    assume(affordable(cfg))
    CASES["model yamls"] += 1
    file = tmp_path_factory.mktemp("models") / "fuzzed.yaml"
    file.write_text(yaml.safe_dump(cfg))
    try:
        model = Model(str(file))
    except ModelConfigError as exc:
        assert str(file) in str(exc), f"the error does not name {file}: {exc}"
        CASES["model yamls: refused"] += 1
        return
    assert isinstance(model, torch.nn.Module) and model.nc >= 1
    CASES["model yamls: built"] += 1


# --- nothing from a stranger runs code -----------------------------------------------------------


def _evil_yaml(marker: Path) -> str:
    return f"!!python/object/apply:os.system ['touch {marker}']"


def test_python_tags_in_any_yaml_are_refused_and_run_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    data = tmp_path / "data.yaml"
    data.write_text(f"train: {_evil_yaml(marker)}\nval: x\nnames: [a]\n")
    hyp = tmp_path / "hyp.yaml"
    hyp.write_text(f"lr0: {_evil_yaml(marker)}\n")
    model = tmp_path / "model.yaml"
    cfg = {**TINY_MODEL, "nc": "REPLACE"}
    model.write_text(yaml.safe_dump(cfg).replace("REPLACE", _evil_yaml(marker)))
    whole = tmp_path / "whole.yaml"
    whole.write_text(f"{_evil_yaml(marker)}\n")
    for call, file, error in [
        (check_dataset, data, DataConfigError),
        (check_dataset, whole, DataConfigError),
        (load_hyp, hyp, DataConfigError),
        (load_hyp, whole, DataConfigError),
        (Model, model, ModelConfigError),
        (Model, whole, ModelConfigError),
    ]:
        CASES["bad inputs (python tags)"] += 1
        with pytest.raises(error, match="not valid YAML") as info:
            call(str(file))
        assert str(file) in str(info.value)
    assert not marker.exists()


@pytest.mark.parametrize(
    "module",
    ["os.system", "__import__('os')", "eval", "builtins.exec", "torch.nn.Module", "subprocess.Popen", "Conv; rm"],
)
def test_model_yaml_modules_come_from_an_allow_list(tmp_path: Path, module: str) -> None:
    CASES["bad inputs (model modules)"] += 1
    cfg = copy.deepcopy(TINY_MODEL)
    cfg["backbone"][1] = [-1, 1, module, [str(tmp_path / "ran")]]
    file = tmp_path / "model.yaml"
    file.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ModelConfigError, match=r"layer 1 .*unknown module") as info:
        Model(str(file))
    assert str(file) in str(info.value)
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    "download",
    ["subprocess:Popen", "os:system", "builtins:exec", "tests.workers.data_config_scenarios:counting_generator"],
)
def test_data_yaml_generators_outside_ddp_utils_are_not_run(tmp_path: Path, download: str) -> None:
    # with the data dict's keys as argv, subprocess.Popen ran "/bin/sh -c 'touch <marker>' ..."
    CASES["bad inputs (download generators)"] += 1
    marker = tmp_path / "ran"
    file = tmp_path / "evil.yaml"
    file.write_text(
        yaml.safe_dump(
            {
                "/bin/sh": 1,
                "-c": 2,
                f"touch {marker}": 3,
                "train": "t",
                "val": "v",
                "names": ["a"],
                "download": download,
            },
            sort_keys=False,
        )
    )
    with pytest.raises(DataConfigError, match=r"key 'download': generator .* outside ddp_utils .*TRUSTED") as info:
        check_dataset(file)
    assert str(file) in str(info.value)
    assert not marker.exists()


@FUZZ
@given(download=st.from_regex(r"[A-Za-z_][\w.]{0,12}:[A-Za-z_]\w{0,8}", fullmatch=True))
def test_no_generator_outside_ddp_utils_is_imported(tiny_dataset: Path, download: str) -> None:
    module = download.split(":")[0]
    if module == "ddp_utils" or module.startswith("ddp_utils."):
        return
    CASES["bad inputs (download generators)"] += 1
    already = set(sys.modules)
    file = tiny_dataset / f"gen-{uuid.uuid4().hex[:8]}.yaml"
    file.write_text(yaml.safe_dump({"train": "missing", "val": "missing", "names": ["a"], "download": download}))
    try:
        with pytest.raises(DataConfigError, match="outside ddp_utils") as info:
            check_dataset(file)
    finally:
        file.unlink()
    assert str(file) in str(info.value)
    assert set(sys.modules) == already, f"importing {module} ran its code"


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("how", ["torch.save", "bare pickle", "inside state_dict"])
def test_malicious_checkpoint_is_refused_and_runs_nothing(tmp_path: Path, how: str) -> None:
    CASES["bad inputs (checkpoints)"] += 1
    marker = tmp_path / "ran"
    path = tmp_path / "last.pt"
    if how == "torch.save":
        torch.save({"epoch": 1, "model": _Exploit(marker)}, path)
    elif how == "bare pickle":
        path.write_bytes(pickle.dumps({"epoch": 1, "model": _Exploit(marker)}))
    else:
        torch.save({"epoch": 1, "model": {"w": torch.ones(2), "hook": _Exploit(marker)}}, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)
    assert not marker.exists(), "loading the checkpoint ran code"


def test_malicious_label_cache_is_rebuilt_and_runs_nothing(tmp_path: Path) -> None:
    # tests/data/test_labels.py feeds pickles and YOLOv5's .npy; here: a pickle named like our cache
    CASES["bad inputs (label caches)"] += 1
    root = make_shapes_dataset(tmp_path / "shapes", n_train=2, n_val=1, size=(32, 48))
    images = sorted(str(p) for p in (root / "images" / "train").glob("*.jpg"))
    marker = tmp_path / "ran"
    cache = root / "labels" / "train.cache"
    for payload in (pickle.dumps(_Exploit(marker)), np.lib.format.magic(1, 0) + pickle.dumps(_Exploit(marker))):
        cache.write_bytes(payload)
        result = load_labels(images, cache_path=cache, workers=1)
        assert result.cache_written and not result.cache_loaded and len(result.im_files) == 2
    assert not marker.exists()
    shutil.rmtree(root)
