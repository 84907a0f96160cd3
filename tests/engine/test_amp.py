"""resolve_amp: bf16 on a GPU that only emulates it gets a warning."""

from __future__ import annotations

import importlib
import logging

import torch

from ddp_utils.engine import resolve_amp

amp_module = importlib.import_module("ddp_utils.engine.amp")
GPU = torch.device("cuda", 0)


def test_bf16_on_a_gpu_without_native_bf16_warns(monkeypatch, caplog):
    # torch's own query, answering True only when emulation counts (a pre-Ampere card)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        assert resolve_amp("bf16", GPU) == "bf16"
    assert "no native bf16" in caplog.text and "cuda:0" in caplog.text


def test_bf16_on_a_native_gpu_or_the_cpu_says_nothing(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        assert resolve_amp("bf16", GPU) == "bf16"
        assert resolve_amp("bf16", torch.device("cpu")) == "bf16"
        assert resolve_amp(None, GPU) == "fp16"
    assert "bf16" not in caplog.text
    assert amp_module._native_bf16()
