"""host.cpu_flags: the CPU's feature flags from /proc/cpuinfo, x86's and Arm's, and nothing where there is none;
host.memory_room: what bounds this process's next allocation (the host, a cgroup's limit, ``ulimit -v``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddp_utils.host import ROOM_LIMITS, cpu_flags, memory_room
from tests.multiproc import REPO_ROOT, launcher_env

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


GIB = 2**30


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_a_cgroups_memory_limit_bounds_the_room_its_inactive_page_cache_counted_free(tmp_path, version):
    """A container's ``--memory``: the host's MemAvailable says nothing of it. The files as the kernel writes them."""
    if version == "v2":
        names, root = ("memory.max", "memory.current", "inactive_file"), tmp_path
    else:
        names, root = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"), tmp_path / "memory"
    root.mkdir(exist_ok=True)
    (root / names[0]).write_text(f"{GIB // 4}\n")
    (root / names[1]).write_text(f"{GIB // 8}\n")
    (root / "memory.stat").write_text(f"anon 1000\n{names[2]} {GIB // 16}\nactive_file 5\n")
    assert memory_room(tmp_path) == (GIB // 4 - GIB // 8 + GIB // 16, ROOM_LIMITS[1])
    (root / names[0]).write_text("max\n" if version == "v2" else "9223372036854771712\n")  # no limit
    room = memory_room(tmp_path)
    assert room is None or room[1] != ROOM_LIMITS[1]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_an_address_space_limit_bounds_the_room_less_what_the_process_maps_already():
    """``ulimit -v``: what the process has mapped (torch maps gigabytes at import) counts against it."""
    code = (
        "import resource, torch; from ddp_utils.host import memory_room, _status_bytes; "
        "resource.setrlimit(resource.RLIMIT_AS, (_status_bytes('VmSize') + 2**30, resource.RLIM_INFINITY)); "
        "print(*memory_room())"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=launcher_env(), capture_output=True,
                         text=True, timeout=120, check=True).stdout  # fmt: skip
    room, limit = out.split(" ", 1)
    assert 0.9 * GIB < int(room) <= GIB and limit.strip() == ROOM_LIMITS[2], out
