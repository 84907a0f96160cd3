"""benchmarks/parity/parity_compare.py: two results of our side set side by side, named by their mode, and the
one-seed-spread verdict, judged only over enough seeds and failing a mode that learned less."""

from __future__ import annotations

import json

import pytest

from .benchmark_scripts import load_benchmark

REGIME = "yolov5n from scratch, 30 epochs"


def results(maps: list[float], amp: str = "off", augment_on: str | None = None) -> dict:
    key = dict(regime=REGIME, amp=amp, layout="channels_last")
    if augment_on:
        key["augment_on"] = augment_on
    runs = {
        str(seed): dict(ours=dict(key=key, scores=dict(map=value, map50=0.99), wall_s=100.0, epoch_s=[3.0, 3.0]))
        for seed, value in enumerate(maps)
    }
    return dict(setup=dict(description=REGIME), runs=runs)


@pytest.fixture(scope="module")
def compare():
    return load_benchmark("parity/parity_compare")


def test_the_modes_are_named_by_precision_layout_and_where_the_images_are_made(compare):
    assert compare.mode_name(results([0.8], amp="bf16")) == "bf16, channels_last"
    assert compare.mode_name(results([0.8], augment_on="device")) == "fp32, channels_last, augment on device"


def test_the_verdict_needs_its_seeds_and_fails_a_mode_that_learned_less(compare):
    reference = results([0.842, 0.810, 0.835])  # mean 0.829, std 0.017
    within = compare.figures(results([0.837, 0.823, 0.838], augment_on="device"), reference)
    assert compare.verdict(within) == (False, "not judged: 3 seed(s), fewer than 5")
    met, words = compare.verdict(within, min_seeds=3)
    assert met and "learns within one seed spread" in words
    less = compare.figures(results([0.80, 0.79, 0.81], augment_on="device"), reference)
    met, words = compare.verdict(less, min_seeds=3)
    assert not met and "NOT met" in words


def test_results_of_two_regimes_are_refused(compare, tmp_path, capsys):
    other = results([0.8, 0.8, 0.8])
    other["setup"]["description"] = "another regime"
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, record in zip(paths, (results([0.8, 0.8, 0.8]), other)):
        path.write_text(json.dumps(record))
    with pytest.raises(SystemExit):
        compare.main([str(p) for p in paths])
    assert "different regimes" in capsys.readouterr().err
    paths[1].write_text(json.dumps(results([0.842, 0.810, 0.835])))
    assert compare.main([str(p) for p in paths] + ["--min-seeds", "3"]) == 0
    out = capsys.readouterr().out
    assert "| mean | 0.800 | 0.829 |" in out and "over 3 seeds: learns LESS (NOT met)" in out
