"""host.cpu_flags: the CPU's feature flags from /proc/cpuinfo, x86's and Arm's, and nothing where there is none."""

from __future__ import annotations

from ddp_utils.host import cpu_flags

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse sse2 avx avx2 AVX512F avx512_bf16 amx_tile
bugs\t\t: sysret_ss_attrs

processor\t: 1
flags\t\t: fpu sse
"""
ARM = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics bf16 i8mm
CPU implementer\t: 0x41
"""


def test_flags_of_x86_and_arm_lower_case_from_the_first_core(tmp_path):
    (tmp_path / "x86").write_text(X86)
    (tmp_path / "arm").write_text(ARM)
    x86 = cpu_flags(tmp_path / "x86")
    assert {"avx2", "avx512f", "avx512_bf16", "amx_tile"} <= x86 and "sysret_ss_attrs" not in x86
    assert "bf16" in cpu_flags(tmp_path / "arm") and "asimd" in cpu_flags(tmp_path / "arm")


def test_no_cpuinfo_or_no_flags_line_is_no_flags(tmp_path):
    (tmp_path / "bare").write_text("processor\t: 0\nmodel name\t: something\n")
    assert cpu_flags(tmp_path / "missing") == frozenset() and cpu_flags(tmp_path / "bare") == frozenset()
