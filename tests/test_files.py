"""Atomic writes end with the umask's permissions (0644 under 022), as a plain open() would give."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from ddp_utils.data.label_cache import _write_cache
from ddp_utils.files import current_umask, mkstemp_shared
from ddp_utils.run import RESULTS_COLUMNS, ResultsLogger
from ddp_utils.run.checkpoint import atomic_torch_save, atomic_write_bytes


@pytest.fixture(params=[0o022, 0o027, 0o002])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_current_umask_reads_the_process_umask(umask):
    assert current_umask() == umask


def test_atomic_writes_respect_the_umask(umask, tmp_path):
    expected = 0o666 & ~umask
    plain = tmp_path / "plain.txt"
    plain.write_text("x")  # what open() gives: the reference
    assert mode(plain) == expected
    assert mode(atomic_torch_save({"a": torch.zeros(2)}, tmp_path / "w" / "last.pt")) == expected
    assert mode(atomic_write_bytes(b"abc", tmp_path / "best.pt")) == expected
    fd, name = mkstemp_shared(tmp_path, prefix=".t.")
    os.close(fd)
    assert mode(Path(name)) == expected


def test_label_cache_and_results_rewrite_respect_the_umask(umask, tmp_path):
    expected = 0o666 & ~umask
    cache = tmp_path / "labels.cache"
    scan = {
        "version": 1,
        "hash": "h",
        "im_files": ["a.jpg"],
        "label_files": ["a.txt"],
        "counts": [1, 0, 0, 0, 0],
        "messages": [],
        "labels": [np.zeros((1, 5), np.float32)],
        "shapes": [[64, 64]],
        "segments": [[]],
    }
    assert _write_cache(cache, scan)
    assert mode(cache) == expected
    logger = ResultsLogger(tmp_path / "run", tensorboard=False)
    for epoch in range(2):
        logger.log(epoch, dict.fromkeys(RESULTS_COLUMNS[1:], 0.5))
    logger.close()
    os.chmod(tmp_path / "run" / "results.csv", 0o600)
    ResultsLogger(tmp_path / "run", start_epoch=1, tensorboard=False).close()  # rewrites it without epoch 1
    assert len((tmp_path / "run" / "results.csv").read_text().splitlines()) == 2
    assert mode(tmp_path / "run" / "results.csv") == expected


def test_evolve_records_respect_the_umask(umask, tmp_path):
    from ddp_utils.evolve.records import write_text_atomic

    write_text_atomic(tmp_path / "evolve" / "evolve.csv", "a,b\n1,2\n")
    assert mode(tmp_path / "evolve" / "evolve.csv") == 0o666 & ~umask
    assert [p.name for p in (tmp_path / "evolve").iterdir()] == ["evolve.csv"]  # no temp file left
