"""Mixed precision and memory layout: how a run computes on its device, and why.

On CUDA: fp16 autocast with a GradScaler by default, channels_last. On the CPU the choice follows
what the cores can do (:func:`train_mode`):

- bf16 autocast pays only where the CPU computes bf16 natively (``avx512_bf16``: Intel Cooper Lake,
  AMD Zen 4 and later; ``amx_bf16``: Intel Sapphire Rapids and later). There oneDNN's bf16
  convolutions ran a yolov5n step about 1.6x as fast as fp32 (2x with channels_last). Without them
  torch falls back to its reference convolution: measured on an AVX2 host (AMD EPYC, 1 thread,
  yolov5n, 160 px, batch 16), a forward and backward took 5.3 s in bf16 against 0.6 s in fp32.
- channels_last pays where oneDNN runs the convolutions (x86 with AVX2 or more): 1.2-1.3x in fp32
  (:func:`~ddp_utils.engine.memory_format.use_channels_last`).

Either way the weights, their gradients, the optimizer's state, the EMA, BatchNorm's running
statistics and the loss stay fp32: autocast only computes the convolutions (and what follows
them up to the next fp32 op) in bf16, as CUDA AMP does in fp16.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection
from dataclasses import dataclass

import torch

from ..host import cpu_flags
from ..log import LOGGER
from .memory_format import use_channels_last

AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "off": None}
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo's names
# per CPU kind (cpu_kind): bf16 the default there only where it is faster on train.py and
# benchmarks/parity/parity.py has shown, over seeds on such a CPU, that it learns as fp32 does;
# docs/cpu.md says what has been measured so far
CPU_BF16_BY_DEFAULT = {"amx_bf16": False, "avx512_bf16": False}
# how much faster --amp bf16 was than the default mode, per CPU kind with native bf16, for the log: only what was
# measured (docs/cpu.md); a kind missing here is not faster, or not measured
BF16_FASTER = {
    "amx_bf16": "about 2x a yolov5n training step on an earlier host",
    "avx512_bf16": "train.py 1.18x as fast: 22 s against 26 s for 2 epochs of yolov5n@320 (issue 47)",
}


@dataclass(frozen=True)
class Bf16Learning:
    """What --amp bf16 learned against fp32 in parity's regime: held-out mAP@0.5:0.95 (mean, sample std) per mode.

    Measured by ``benchmarks/parity/parity.py --ours-only --ours-amp bf16`` and without ``--ours-amp`` (fp32),
    over ``seeds`` seeds; ``source`` names the results.

    Examples:
        >>> Bf16Learning(5, (0.825, 0.01), (0.833, 0.014), "x.json").learns_as_fp32()
        True
        >>> Bf16Learning(5, (0.80, 0.01), (0.833, 0.014), "x.json").learns_as_fp32()
        False
    """

    seeds: int
    bf16: tuple[float, float]
    fp32: tuple[float, float]
    source: str

    def learns_as_fp32(self) -> bool:
        """bf16's mean within one seed spread of fp32's (at least its mean minus one std), over 5 seeds or more."""
        return self.seeds >= 5 and self.bf16[0] >= self.fp32[0] - self.fp32[1]

    def words(self) -> str:
        """The figures, for the log."""
        return (
            f"held-out mAP@0.5:0.95 {self.bf16[0]:.3f} (std {self.bf16[1]:.3f}) against fp32's {self.fp32[0]:.3f} "
            f"({self.fp32[1]:.3f}) over {self.seeds} seeds of parity's regime"
        )


# bf16 against fp32 in parity's regime (docs/cpu.md#does-bf16-learn-as-fp32): seeds 0-4 on an AVX2 host, bf16's
# arithmetic (bf16 operands, fp32 sums, each result rounded to bf16 once) computed by parity's --ours-bf16-conv fp32;
# fp32 the default mode (channels_last). None: not measured
BF16_LEARNING: Bf16Learning | None = Bf16Learning(
    5, (0.828, 0.007), (0.833, 0.014), "benchmarks/results/parity-yolov5n-shapes-bf16.json"
)


@dataclass(frozen=True)
class TrainMode:
    """How a run computes: ``amp`` ("fp16", "bf16" or "off"), the ``channels_last`` layout, ``why`` (for the log)."""

    amp: str
    channels_last: bool
    why: str


def cpu_kind(flags: Collection[str]) -> str:
    """The CPU's kind for bf16, by its flags: ``"amx_bf16"`` (AMX tiles), ``"avx512_bf16"`` (only the vector
    instructions), or ``"none"``: what bf16 pays is measured, and decided, per kind.

    Examples:
        >>> cpu_kind({"avx512_bf16", "amx_bf16"}), cpu_kind({"avx512_bf16"}), cpu_kind({"avx2"})
        ('amx_bf16', 'avx512_bf16', 'none')
    """
    return next((flag for flag in ("amx_bf16", "avx512_bf16") if flag in flags), "none")


def resolve_amp(amp: str | None, device: torch.device) -> str:
    """The mixed precision to train with: ``amp`` as asked, else fp16 on CUDA and the CPU's mode elsewhere.

    bf16 on a GPU without native bf16 (before Ampere), or on a CPU without it, is emulated and slower
    than fp32: a warning says so.

    Raises:
        ValueError: an unknown choice, or fp16 on a device without fp16 autocast (the CPU).

    Examples:
        >>> resolve_amp("off", torch.device("cpu")), resolve_amp(None, torch.device("cuda"))
        ('off', 'fp16')
    """
    return train_mode(amp, device).amp


def train_mode(
    amp: str | None,
    device: torch.device | str,
    *,
    channels_last: bool | None = None,
    flags: Collection[str] | None = None,
    bf16_by_default: bool | None = None,
) -> TrainMode:
    """How to train on ``device``: the autocast dtype and the memory layout, with the reason in words.

    Without ``amp`` (``--amp`` not given): fp16 and channels_last on CUDA; on the CPU, channels_last
    where oneDNN runs the convolutions, and bf16 autocast where the CPU computes bf16 natively and
    ``bf16_by_default``. ``--amp off`` on the CPU is the exact fp32 path: fp32 and NCHW, as YOLOv5
    computes. ``--amp bf16`` on the CPU adds channels_last where it pays.

    Args:
        amp: "fp16", "bf16", "off", or None for the device's default.
        device: where the run trains.
        channels_last: the layout a resumed run recorded (kept, so it continues as it began); None: decide.
        flags: the CPU's feature flags (default: :func:`ddp_utils.host.cpu_flags`); a test passes its own.
        bf16_by_default: make bf16 the CPU's default where it is native; None: as :data:`CPU_BF16_BY_DEFAULT`
            says for the CPU's kind (:func:`cpu_kind`).

    Raises:
        ValueError: an unknown ``amp``, or fp16 on the CPU.

    Examples:
        >>> mode = train_mode(None, "cpu", flags={"avx2", "avx512_bf16"}, bf16_by_default=True)
        >>> mode.amp, mode.channels_last
        ('bf16', True)
        >>> train_mode(None, "cpu", flags={"avx2"}).amp, train_mode("off", "cpu", flags={"avx2"}).channels_last
        ('off', False)
    """
    device = torch.device(device)
    if amp is not None and amp not in AMP_DTYPES:
        raise ValueError(f"--amp {amp}: choose one of {', '.join(AMP_DTYPES)}")
    if device.type != "cpu":
        return _accelerator_mode(amp, device, channels_last)
    if amp == "fp16":
        raise ValueError("--amp fp16 needs a CUDA device: use --amp bf16 or --amp off on the CPU")
    flags = cpu_flags() if flags is None else frozenset(flags)
    native = [flag for flag in NATIVE_BF16_FLAGS if flag in flags]
    pays = use_channels_last(device, flags)
    if amp is None:
        kind = cpu_kind(flags)
        allowed = CPU_BF16_BY_DEFAULT.get(kind, False) if bf16_by_default is None else bf16_by_default
        amp = "bf16" if native and allowed else "off"
        layout = pays if channels_last is None else channels_last
        return TrainMode(amp, layout, _why_default(amp, layout, native, kind))
    if amp == "off":
        layout = False if channels_last is None else channels_last
        return TrainMode(amp, layout, f"CPU: --amp off: fp32 in {'channels_last' if layout else 'NCHW'}")
    layout = pays if channels_last is None else channels_last
    if not native:
        LOGGER.warning(
            "--amp bf16: this CPU has no native bf16 (no avx512_bf16 or amx_bf16 flag): torch emulates its "
            "convolutions, about 9x slower than fp32 (docs/cpu.md); leave --amp out for the CPU's fastest mode"
        )
    return TrainMode(amp, layout, f"CPU: --amp bf16: bf16 autocast ({_native_words(native)}), {_layout(layout)}")


def _accelerator_mode(amp: str | None, device: torch.device, channels_last: bool | None) -> TrainMode:
    """:func:`train_mode` off the CPU: no CPU flags to weigh, fp16 the default on CUDA."""
    amp = amp or ("fp16" if device.type == "cuda" else "off")
    if amp == "bf16" and device.type == "cuda" and not _native_bf16():
        LOGGER.warning(
            f"--amp bf16: {device} has no native bf16 (it is emulated, slower than fp32); use --amp fp16 there"
        )
    layout = use_channels_last(device) if channels_last is None else channels_last
    return TrainMode(amp, layout, f"{device}: amp {amp}, {'channels_last' if layout else 'NCHW'}")


def compute_words(amp: str, channels_last: bool) -> str:
    """How a run computes, in the compute line's words: the precision, then the layout (``--amp off`` is fp32).

    Examples:
        >>> compute_words("off", True), compute_words("bf16", True), compute_words("fp16", False)
        ('fp32, channels_last', 'bf16 autocast, channels_last', 'fp16 autocast, NCHW')
    """
    precision = "fp32" if amp == "off" else f"{amp} autocast"
    return f"{precision}, {'channels_last' if channels_last else 'NCHW'}"


def bf16_advice(kind: str, learning: Bf16Learning | None = None) -> str:
    """What the log says of ``--amp bf16`` on a CPU of ``kind`` that trains in fp32: a recommendation only where bf16
    was measured faster there (:data:`BF16_FASTER`) and learns within one seed spread of fp32 (``learning``, default
    :data:`BF16_LEARNING`); else why not, or nothing (``""``) on a CPU without native bf16.

    Examples:
        >>> less = Bf16Learning(5, (0.70, 0.01), (0.83, 0.01), "x.json")
        >>> bf16_advice("avx512_bf16", less).endswith("fp32 kept"), bf16_advice("none", less)
        (True, '')
    """
    learning = BF16_LEARNING if learning is None else learning
    faster = BF16_FASTER.get(kind)
    if faster is None:
        return ""
    if learning is None:
        return f"--amp bf16 is faster here ({faster}), but whether it learns as fp32 does is not measured (docs/cpu.md)"
    if not learning.learns_as_fp32():
        return f"--amp bf16 is faster here ({faster}) but learned less than fp32 ({learning.words()}): fp32 kept"
    return f"--amp bf16 is faster here ({faster}) and learns as fp32 does ({learning.words()}): try it"


def _why_default(amp: str, channels_last: bool, native: list[str], kind: str) -> str:
    if amp == "bf16":
        return f"CPU: bf16 autocast ({_native_words(native)}), {_layout(channels_last)}; --amp off: fp32 and NCHW"
    if native:  # the gate (CPU_BF16_BY_DEFAULT) is closed for this kind of CPU
        return f"CPU: fp32, {_layout(channels_last)}; it computes bf16 natively ({', '.join(native)}): " + bf16_advice(
            kind
        )
    return f"CPU: fp32 (no native bf16: no avx512_bf16 or amx_bf16 flag), {_layout(channels_last)}"


def _native_words(native: list[str]) -> str:
    return f"native: {', '.join(native)}" if native else "emulated: no avx512_bf16 or amx_bf16 flag"


def _layout(channels_last: bool) -> str:
    return "channels_last (oneDNN's NHWC convolutions)" if channels_last else "NCHW (channels_last would not pay here)"


def _native_bf16() -> bool:
    """Whether the current CUDA device computes bf16 natively (not by emulation)."""
    if "including_emulation" in inspect.signature(torch.cuda.is_bf16_supported).parameters:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return torch.cuda.is_bf16_supported()
