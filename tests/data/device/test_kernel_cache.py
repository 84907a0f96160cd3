"""The compiled kernels' cache: where it is, what names an entry, whose files are loaded, how an entry lands.

A library that is loaded is code that runs: a folder or a file another user owns or may write is refused, an
entry lands whole or not at all, and a key changes with the kernels' source, torch and the device's kind, so an
upgrade or another machine never loads a stale kernel. (Compiling and running kernels: ``test_compiled.py``.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import ddp_utils.data.device.kernel_cache as kernel_cache
from ddp_utils.data.device import kernels
from ddp_utils.data.device.kernel_cache import (
    KERNEL_NAMES,
    KernelFailed,
    LoadedKernel,
    cache_root,
    entry_path,
    install,
    kernel_key,
    kernels_for,
    private_folder,
)

CPU = torch.device("cpu")


def test_the_cache_is_the_machines_users_folder_or_none(tmp_path):
    assert cache_root({"DDP_UTILS_KERNEL_CACHE": str(tmp_path)}) == tmp_path
    assert cache_root({"DDP_UTILS_KERNEL_CACHE": " OFF "}) is None
    assert cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "ddp_utils" / "kernels"
    assert cache_root({}) == Path.home() / ".cache" / "ddp_utils" / "kernels"


def test_a_run_compiles_exactly_the_kernels_it_renders_with():
    assert kernels_for(channels_last=True, mixup=False) == ["render_cl", "resize"]  # no mixups: no mixup kernel
    assert kernels_for(channels_last=True, mixup=True) == ["render_cl", "resize", "render_mixup_cl"]
    assert set(kernels_for(False, True)) | set(kernels_for(True, True)) == set(KERNEL_NAMES)


def test_a_folder_someone_else_could_write_holds_no_kernel_that_runs(tmp_path):
    own = tmp_path / "own"
    assert private_folder(own) is None and oct(own.stat().st_mode & 0o777) == "0o700"
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o775)
    os.chmod(shared, 0o775)
    assert "writable by others (mode 0o775)" in private_folder(shared)
    link = tmp_path / "link"
    link.symlink_to(own)
    assert "symbolic link" in private_folder(link)
    if os.geteuid() == 0:  # root can give a folder away: another user's folder is refused too
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 12345, 12345)
        assert "belongs to another user (uid 12345)" in private_folder(theirs)
    assert "cannot be made" in private_folder(Path("/proc/kernels"))


def test_a_key_changes_with_the_kernel_its_source_torch_and_the_device(monkeypatch):
    keys = {kernel_key(name, CPU) for name in KERNEL_NAMES}
    assert len(keys) == len(KERNEL_NAMES) and all(key.startswith(f"{key.split('-')[0]}-cpu-") for key in keys)
    assert kernel_key("render_cl", CPU) == kernel_key("render_cl", CPU)  # the same machine finds it again
    assert Path(kernels.__file__).read_bytes() in kernel_cache.sources()  # the kernels' own text is hashed
    before = kernel_key("render_cl", CPU)
    monkeypatch.setattr(kernel_cache, "sources", lambda: b"# a changed kernels.py\n")
    changed_source = kernel_key("render_cl", CPU)
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    upgraded = kernel_key("render_cl", CPU)
    monkeypatch.undo()
    monkeypatch.setattr(kernel_cache, "device_kind", lambda device: "cpu-x86_64-AVX512-0123456789ab")
    other_cpu = kernel_key("render_cl", CPU)
    assert len({before, changed_source, upgraded, other_cpu}) == 4
    with pytest.raises(ValueError, match="no kernel named 'render_2'"):
        kernel_key("render_2", CPU)


def test_the_cpus_kind_names_its_instruction_set():
    kind = kernel_cache.device_kind(CPU)
    assert kind.startswith(f"cpu-{os.uname().machine}-{torch.backends.cpu.get_cpu_capability()}-") and len(kind) > 12


def _entry(root: Path, name: str = "resize") -> Path:
    entry = entry_path(root, name, CPU)
    library = root / "built.so"
    library.write_bytes(b"\x7fELF not really a library")
    install(entry, [library], dict(kernel=name, library="built.so", outputs=1))
    return entry


def test_an_entry_lands_whole_and_a_second_install_leaves_the_first(tmp_path):
    entry = _entry(tmp_path)
    assert sorted(p.name for p in entry.iterdir()) == ["built.so", "kernel.json"]
    assert json.loads((entry / "kernel.json").read_text())["library"] == "built.so"
    again = tmp_path / "again.so"
    again.write_bytes(b"another build")
    install(entry, [again], dict(kernel="resize", library="again.so", outputs=1))  # another process, later
    assert sorted(p.name for p in entry.iterdir()) == ["built.so", "kernel.json"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left behind


def test_an_entry_someone_else_could_write_is_not_loaded(tmp_path):
    private_folder(tmp_path / "cache")
    entry = _entry(tmp_path / "cache")
    os.chmod(entry / "built.so", 0o666)
    with pytest.raises(KernelFailed, match="not loaded: .*built.so is writable by others"):
        LoadedKernel(entry, CPU)
    os.chmod(entry / "built.so", 0o644)
    with pytest.raises(KernelFailed, match="does not load"):  # its own, but no library: refused, not a crash
        LoadedKernel(entry, CPU)
