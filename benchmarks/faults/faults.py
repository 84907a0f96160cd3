"""Every fault a long run meets, injected into a real 2-process torchrun job: does the job finish, every epoch once,
and what did it lose?

    python benchmarks/faults/faults.py [--faults sigterm sigterm-val sigkill sigstop worker-kill enospc enospc-final
        enospc-epoch-1 nan truncated] [--epochs 3] [--save-interval 0.01] [--dir DIR]

The job: ``torchrun --nproc_per_node 2 --max-restarts 3 train.py`` (gloo, CPU), yolov5n on 64 synthetic images
at 128 px, 8 images a step (4 per process), one optimizer step per batch, ``--workers 1``, a periodic save every
``--save-interval`` minutes (0.6 s by default: a long run's 30 minutes, scaled to epochs of seconds), the stall
watchdog at its default bound (120 s). First the same job uninterrupted, then one job per fault:

- ``sigterm``: SIGTERM to the job (torchrun passes it on) in epoch 2; then the same command with ``--resume``.
- ``sigterm-val``: the same while rank 0 validates epoch 2.
- ``sigkill``: SIGKILL of rank 1 in epoch 2: torchrun restarts the workers, which resume from the last save.
- ``sigstop``: rank 1 stopped (SIGSTOP) in epoch 2, a rank that hangs: the watchdog names it and ends the others
  (exit 75), torchrun kills the stopped one (after its 30 s grace) and restarts.
- ``worker-kill``: one of rank 0's data-loader workers killed (SIGKILL) in epoch 2.
- ``enospc``: the run directory on a small tmpfs (mounted here; needs root), filled up just before rank 0's save
  at the end of epoch 1, emptied again once that save has failed: a real "No space left on device" in a background
  write, and training goes on (needs 2 epochs: the failed save is not the last one).
- ``enospc-final``: the same tmpfs filled up just before the run's final save, and left full (no restart): the
  job must end with a non-zero exit and a last line naming the checkpoint on disk and where ``--resume``
  continues; the benchmark frees the disk and does what that line says.
- ``enospc-epoch-1``: the same tmpfs filled up at rank 0's first training step (epoch 1, before any save, while its
  first batches are drawn to train_batch{0,1,2}.jpg), emptied again once the first save after it has failed: the
  plots and rows that fail are optional (one warning, the first time) and training goes on (needs 2 epochs: the
  failed save is not the last one).
- ``nan``: rank 1's loss made NaN at one step of epoch 2.
- ``truncated``: rank 0 killed (no restart) the moment its second save from epoch 2 on is on disk (the end of epoch
  1 is the first), its last.pt then cut to half (a copy cut short put in its place: a best.pt that shares its bytes
  stays whole); the job started again with ``--resume`` says in one line what to do; the benchmark does it, and
  resumes.

The faults tied to a save (``enospc``, ``enospc-final``, ``truncated``), the epoch-1 full disk and the NaN are
injected inside the job by ``benchmarks/faults/fault_inject.py``, counting rank 0's saves as they land or its
training steps: they come at the same point of the run on any host, however fast. A fault whose moment never comes
(the job finished first) is reported as not injected, a fault that fails the benchmark itself as failed; the table is
printed whatever one row does, and the benchmark then exits 1 when a row was not injected (or skipped, or failed):
its table is not whole.

Columns: how long after the fault the job said so (its first line about it); the optimizer steps trained
twice (trained before the fault, after the position it resumed from); whether it finished with every epoch in
results.csv once; the final trained weights against the uninterrupted job's (``equal``: bit for bit; else the
relative norm of the difference); the line the user saw. Printed as a markdown table; the per-fault records go
to ``<dir>/faults.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from ddp_utils.data import make_shapes_dataset  # noqa: E402
from ddp_utils.run import CheckpointError, load_checkpoint  # noqa: E402

FAULTS = ("sigterm", "sigterm-val", "sigkill", "sigstop", "worker-kill", "enospc", "enospc-final", "enospc-epoch-1",
          "nan", "truncated")  # fmt: skip
INJECT = REPO_ROOT / "benchmarks" / "faults" / "fault_inject.py"
INJECTED = re.compile(r"^fault_inject: ")  # the line the injector prints when it acts
EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")  # torchrun's report of a worker's exit
NB = 8  # batches (= optimizer steps) per epoch: 64 images, 8 per step
STEP_LINE = re.compile(r"^(\d+)/\d+ .* (\d+)/(\d+) \d+%")  # rank 0's plain progress line after each step
VAL_LINE = re.compile(r"^val 1/\d+ ")
RESUMED = re.compile(r"resuming \S+ at epoch (\d+)(?:, batch (\d+)/\d+)?")
USER_LINE = {  # the first line that says what happened, per fault
    "sigterm": re.compile(r"received SIGTERM"),
    "sigterm-val": re.compile(r"received SIGTERM"),
    "sigkill": re.compile(r"exitcode\s*:\s*-9|Signal 9|SIGKILL"),
    "sigstop": re.compile(r"rank \d+ stalled: "),
    "worker-kill": re.compile(r"DataLoader worker .*(killed|exited)|worker .*killed"),
    "enospc": re.compile(r"could not save checkpoint .*No space left on device"),
    "enospc-final": re.compile(r"training ended after epoch \d+ but could not save "),
    "enospc-epoch-1": re.compile(r"could not write \S+: No space left on device; it is optional, so the run goes on"),
    "nan": re.compile(r"optimizer step\(s\) skipped \(non-finite gradients\)"),
    "truncated": re.compile(r"the checkpoint is damaged"),
}


@dataclass
class Job:
    """One torchrun job's run: its lines (stderr and stdout, in order) with their times, and its exit code."""

    lines: list[tuple[float, str]] = field(default_factory=list)
    returncode: int | None = None

    def first(self, pattern: re.Pattern, after: float = 0.0) -> tuple[float, str] | None:
        return next(((t, line) for t, line in self.lines if t >= after and pattern.search(line)), None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def rank_pids(agent: int) -> dict[int, int]:
    """{RANK: pid} of the train.py workers a torchrun agent started."""
    found = {}
    for pid in children(agent):
        with contextlib.suppress(OSError, ValueError):
            environ = dict(
                kv.split(b"=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in kv
            )
            if b"RANK" in environ:
                found[int(environ[b"RANK"])] = pid
    return found


LOGS: list[Path] = []  # where run_job keeps each job's output (set by main)


def run_job(
    cmd: list[str], env: dict[str, str], timeout: float, on_line: Callable[[str, subprocess.Popen], None]
) -> Job:
    """Run ``cmd`` to its end (or ``timeout``), calling ``on_line`` on each output line as it comes; its output
    is kept in ``<dir>/logs/``."""
    job, start = Job(), time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip

    def pump() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            job.lines.append((time.monotonic(), line.rstrip("\n")))
            with contextlib.suppress(Exception):
                on_line(line, proc)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        job.returncode = proc.wait(timeout=timeout - (time.monotonic() - start))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        job.returncode = proc.wait()
    reader.join(timeout=10)
    if LOGS:
        log = LOGS[0] / f"job{len(list(LOGS[0].glob('job*.log'))):02d}.log"
        log.write_text(" ".join(cmd) + "\n" + "\n".join(line for _, line in job.lines) + f"\nexit {job.returncode}\n")
    return job


class Setup:
    """The data, the commands and the environment every job of this benchmark shares."""

    def __init__(self, root: Path, epochs: int, save_interval: float) -> None:
        self.root, self.epochs, self.save_interval = root, epochs, save_interval
        make_shapes_dataset(root / "shapes", n_train=64, n_val=48, size=(128, 160), seed=0, max_objects=4)
        (root / "shapes.yaml").write_text(
            f"path: {root / 'shapes'}\ntrain: images/train\nval: images/val\n"
            "names: {0: circle, 1: square, 2: triangle, 3: star}\n"
        )
        hyp = yaml.safe_load((REPO_ROOT / "configs" / "hyps" / "hyp.shapes.yaml").read_text())
        hyp.update(nbs=8, warmup_epochs=0.5, warmup_min_iters=2)  # one optimizer step per batch: steps = batches
        (root / "hyp.yaml").write_text(yaml.safe_dump(hyp))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("DDP_UTILS_", "TORCHELASTIC_"))}
        self.env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", DDP_UTILS_PROGRESS="plain",
                        DDP_UTILS_PROGRESS_SECONDS="0", DDP_UTILS_DATASETS_DIR=str(root / "datasets"))  # fmt: skip

    def train_args(self, project: Path, name: str, *extra: str) -> list[str]:
        return [
            "--data", str(self.root / "shapes.yaml"), "--hyp", str(self.root / "hyp.yaml"), "--cfg", "yolov5n.yaml",
            "--imgsz", "128", "--batch-size", "8", "--workers", "1", "--device", "cpu", "--epochs", str(self.epochs),
            "--save-interval", str(self.save_interval), "--project", str(project), "--name", name, *extra,
        ]  # fmt: skip

    def torchrun(self, script: list[str], restarts: int = 3) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts",
                str(restarts), "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *script]  # fmt: skip

    def job(self, project: Path, name: str, *extra: str, restarts: int = 3, wrapper: list[str] | None = None):
        script = [*(wrapper or [str(REPO_ROOT / "train.py")]), *self.train_args(project, name, *extra)]
        return self.torchrun(script, restarts)


class At:
    """An ``on_line`` that acts once, when rank 0's progress reaches (epoch, batch) or a pattern matches."""

    def __init__(self, act: Callable[[subprocess.Popen], None], epoch: int = 2, batch: int = 4, pattern=None,
                 occurrence: int = 1) -> None:  # fmt: skip
        self.act, self.epoch, self.batch, self.pattern = act, epoch, batch, pattern
        self.occurrence, self.matches = occurrence, 0
        self.at: float | None = None
        self.reached = (0, 0)  # (epoch, batch) of rank 0's last progress line before the act

    def __call__(self, line: str, proc: subprocess.Popen) -> None:
        step = STEP_LINE.match(line)
        if step and self.at is None:
            self.reached = (int(step.group(1)), int(step.group(2)))
        if self.at is not None:
            return
        if self.pattern is not None and self.pattern.search(line):
            self.matches += 1
        hit = self.pattern is not None and self.matches == self.occurrence
        if hit or (self.pattern is None and step and self.reached >= (self.epoch, self.batch)):
            self.at = time.monotonic()
            self.act(proc)


class Injected:
    """An ``on_line`` that notes when the injector said it acted (its ``fault_inject:`` line), and where rank 0's
    progress stood then (as :class:`At`'s ``reached``)."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.line = ""
        self.reached = (0, 0)

    def __call__(self, line: str, proc: subprocess.Popen) -> None:
        if self.at is not None:
            return
        step = STEP_LINE.match(line)
        if step:
            self.reached = (int(step.group(1)), int(step.group(2)))
        elif INJECTED.match(line):
            self.at, self.line = time.monotonic(), line.strip()


def not_injected(name: str, why: str) -> dict:
    return {"fault": name, "not_injected": why}


def steps_lost(reached: tuple[int, int], job: Job, after: float) -> int | None:
    """Optimizer steps trained twice: the position reached before the fault, minus the one a resume continued at."""
    resumed = next((RESUMED.search(line) for t, line in job.lines if t >= after and RESUMED.search(line)), None)
    if resumed is None:
        return 0
    epoch, batch = int(resumed.group(1)), int(resumed.group(2) or 0)
    return max((reached[0] - 1) * NB + reached[1] - ((epoch - 1) * NB + batch), 0)


def epochs_once(run_dir: Path, epochs: int) -> bool:
    path = run_dir / "results.csv"
    if not path.is_file():
        return False
    with open(path, newline="") as f:
        rows = [row for row in csv.DictReader(f)]
    return [int(float(r["epoch"])) for r in rows] == list(range(epochs))


def weights_against(reference: Path, run_dir: Path) -> str:
    """``equal`` (bit for bit), else the relative norm of the difference of the trained weights."""
    a = load_checkpoint(reference / "weights" / "last.pt")["train_model"]
    last = run_dir / "weights" / "last.pt"
    if not last.is_file():
        return "no last.pt"
    try:
        b = load_checkpoint(last)["train_model"]
    except CheckpointError as exc:
        return f"unreadable last.pt ({type(exc).__name__})"
    keys = [k for k, v in a.items() if v.is_floating_point()]
    if all(torch.equal(a[k], b[k]) for k in keys):
        return "equal"
    diff = sum(float((a[k].double() - b[k].double()).square().sum()) for k in keys) ** 0.5
    norm = sum(float(a[k].double().square().sum()) for k in keys) ** 0.5
    return f"{diff / norm:.1e}"


def signal_job(sig: int) -> Callable[[subprocess.Popen], None]:
    return lambda proc: proc.send_signal(sig)


def signal_rank(rank: int, sig: int) -> Callable[[subprocess.Popen], None]:
    def act(proc: subprocess.Popen) -> None:
        act.pid = rank_pids(proc.pid)[rank]
        os.kill(act.pid, sig)

    act.pid = None
    return act


def kill_loader_worker(proc: subprocess.Popen) -> None:
    rank0 = rank_pids(proc.pid)[0]
    workers = [pid for pid in children(rank0) if b"python" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    os.kill(workers[0], signal.SIGKILL)


def fault_sigterm(s: Setup, out: Path, name: str, val: bool) -> dict:
    # in the middle of epoch 2, or while rank 0 validates it (the second validation's first line)
    act = At(signal_job(signal.SIGTERM), pattern=VAL_LINE, occurrence=2) if val else At(signal_job(signal.SIGTERM))
    first = run_job(s.job(out, name), s.env, 600, act)
    if act.at is None:
        return not_injected(name, "the job finished before its moment came")
    last = out / name / "weights" / "last.pt"
    second = run_job(s.torchrun([str(REPO_ROOT / "train.py"), "--resume", str(last)]), s.env, 600, noop)
    return describe(name, first, second, act.at, act.reached, out / name, s)


def fault_restart(s: Setup, out: Path, name: str, act: At, timeout: float = 900) -> dict:
    job = run_job(s.job(out, name), s.env, timeout, act)
    if getattr(act.act, "pid", None):
        with contextlib.suppress(ProcessLookupError):
            os.kill(act.act.pid, signal.SIGKILL)  # a stopped rank, if torchrun left it
    if act.at is None:
        return not_injected(name, f"the job finished before epoch {act.epoch}, batch {act.batch}")
    return describe(name, job, None, act.at, act.reached, out / name, s)


ENOSPC_WHEN = {  # fault_inject.py's options, per row
    "enospc": ["--fill-before-save", "1"],
    "enospc-final": ["--fill-before-final"],
    "enospc-epoch-1": ["--fill-at-step", "0"],
}


def fault_enospc(s: Setup, out: Path, name: str) -> dict:
    final = name == "enospc-final"
    if not final and s.epochs < 2:
        return not_injected(name, "1 epoch: its only save is the last one (needs 2 epochs)")
    mount = out / f"tmpfs-{name}"
    mount.mkdir(exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160m", "tmpfs", str(mount)], capture_output=True).returncode:
        return {"fault": name, "skipped": "cannot mount a tmpfs here (needs root)"}
    filler, injected, resumed = mount / "filler", Injected(), None
    wrapper = [str(INJECT), *ENOSPC_WHEN[name], "--filler", str(filler), "--"]
    try:
        job = run_job(s.job(mount, name, wrapper=wrapper, restarts=0 if final else 3), s.env, 600, injected)
        if final and injected.at is not None:  # free the disk, then do what the last line says
            filler.unlink(missing_ok=True)
            last = mount / name / "weights" / "last.pt"
            resumed = run_job(s.torchrun([str(REPO_ROOT / "train.py"), "--resume", str(last)]), s.env, 600, noop)
        shutil.copytree(mount / name, out / name)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
    if injected.at is None:
        return not_injected(name, "the injector never acted: rank 0's save never reached the disk")
    record = describe(name, job, resumed, injected.at, injected.reached, out / name, s)
    record["injected"] = injected.line
    if name == "enospc-epoch-1":  # what the full disk cost: the optional files' one warning, the saves that failed
        text = [line for _, line in job.lines]
        record["optional_warnings"] = sum(bool(USER_LINE[name].search(line)) for line in text)
        record["saves_failed"] = sum(line.startswith("could not save checkpoint ") for line in text)
        plots = [f"train_batch{i}.jpg" for i in range(3)]
        record["plots_missing"] = [plot for plot in plots if not (out / name / plot).exists()]
    if final:
        worker = root_cause_exit([line for _, line in job.lines])
        said = job.first(USER_LINE[name])
        said_at = USER_LINE[name].search(said[1]) if said else None  # the line from its words, whatever prefix
        last_line = said[1][said_at.start() :].strip() if said_at else ""
        record.update(first_exit=job.returncode, worker_exit=worker, last_line=last_line)
    return record


def root_cause_exit(lines: list[str]) -> int | None:
    """The exit code torchrun's report gives its root cause (the first worker that failed): the ranks it stopped
    after it are listed above it, each with its own exit (-15), when they were still running."""
    start = next((k for k, line in enumerate(lines) if "Root Cause" in line), 0)
    return next((int(m[1]) for line in lines[start:] if (m := EXITCODE.search(line))), None)


def noop(line: str, proc: subprocess.Popen) -> None:
    """An ``on_line`` that does nothing."""


def fault_nan(s: Setup, out: Path, name: str) -> dict:
    wrapper = [str(INJECT), "--nan-at", str(NB + 3), "--nan-rank", "1", "--"]
    start = time.monotonic()
    job = run_job(s.job(out, name, wrapper=wrapper), s.env, 600, noop)
    step = next(
        (t for t, line in job.lines if (m := STEP_LINE.match(line)) and (int(m[1]), int(m[2])) == (2, 4)), start
    )
    return describe(name, job, None, step, (0, 0), out / name, s)


def fault_truncated(s: Setup, out: Path, name: str) -> dict:
    last, injected = out / name / "weights" / "last.pt", Injected()
    wrapper = [str(INJECT), "--kill-after-save", "2", "--"]  # the moment its 2nd save from epoch 2 on is on disk
    first = run_job(s.job(out, name, restarts=0, wrapper=wrapper), s.env, 600, injected)
    if injected.at is None:
        why = "rank 0 never had a second save from epoch 2 on that is not its last: the job ended first"
        return not_injected(name, why)
    data, cut = last.read_bytes(), last.with_name("last.pt.cut")
    cut.write_bytes(data[: len(data) // 2])  # the storage cut the file short (a best.pt linked to it stays whole)
    os.replace(cut, last)
    at = time.monotonic()
    resume = s.torchrun([str(REPO_ROOT / "train.py"), "--resume", str(last)])
    refused = run_job(resume, s.env, 600, noop)
    advice = next((line for _, line in refused.lines if "continue from it with" in line), "")
    commands = re.search(r"with `([^`]+)` then", advice)
    if commands:
        subprocess.run(["sh", "-c", commands.group(1)], check=True)
    finished = run_job(resume, s.env, 600, noop)
    record = describe(name, refused, finished, at, injected.reached, out / name, s)
    record.update(first_exit=first.returncode, refused_exit=refused.returncode, injected=injected.line)
    return record


def describe(name: str, job: Job, then: Job | None, at: float | None, reached, run_dir: Path, s: Setup) -> dict:
    both = Job(job.lines + (then.lines if then else []), then.returncode if then else job.returncode)
    said = both.first(USER_LINE[name], after=at or 0.0)
    return {
        "fault": name,
        "detected_s": round(said[0] - at, 1) if said and at else None,
        "steps_lost": steps_lost(reached, both, at or 0.0),
        "finished": both.returncode == 0 and epochs_once(run_dir, s.epochs),
        "weights": weights_against(s.root / "runs" / "reference", run_dir),
        "line": excerpt(said[1], USER_LINE[name]) if said else "",
        "exit": both.returncode,
    }


def excerpt(line: str, pattern: re.Pattern, width: int = 150) -> str:
    """The line, or the part of it around what ``pattern`` found when it is long."""
    line = line.strip()
    if len(line) <= width:
        return line
    start = max(0, min(pattern.search(line).start() - 30, len(line) - width))
    return ("..." if start else "") + line[start : start + width] + ("..." if start + width < len(line) else "")


def table(records: list[dict]) -> str:
    rows = ["| fault | detected after (s) | optimizer steps lost | finished, every epoch once | final weights vs "
            "uninterrupted | the line the user saw |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in records:
        for kind in ("skipped", "not_injected", "failed"):
            if kind in r:
                rows.append(f"| {r['fault']} | {kind.replace('_', ' ')}: {r[kind]} | | | | |")
                break
        else:
            line = r["line"].replace("|", "\\|")
            rows.append(f"| {r['fault']} | {r['detected_s']} | {r['steps_lost']} | {'yes' if r['finished'] else 'NO'} "
                        f"| {r['weights']} | `{line}` |")  # fmt: skip
    return "\n".join(rows)


def inject(name: str, s: Setup, out: Path) -> dict:
    """One fault's job(s), and its record."""
    if name in ("sigterm", "sigterm-val"):
        return fault_sigterm(s, out, name, val=name == "sigterm-val")
    if name == "sigkill":
        return fault_restart(s, out, name, At(signal_rank(1, signal.SIGKILL), batch=5))
    if name == "sigstop":
        return fault_restart(s, out, name, At(signal_rank(1, signal.SIGSTOP), batch=3))
    if name == "worker-kill":
        return fault_restart(s, out, name, At(kill_loader_worker, batch=3))
    if name in ENOSPC_WHEN:
        return fault_enospc(s, out, name)
    if name == "nan":
        return fault_nan(s, out, name)
    return fault_truncated(s, out, name)


def run_faults(names: list[str], inject_one: Callable[[str], dict], where: Path) -> list[dict]:
    """Each fault's record, printed and kept in ``where`` as it comes; one that fails the benchmark itself (an
    error of its own) is recorded as failed, with the error, and the others still run."""
    records = []
    for name in names:
        try:
            record = inject_one(name)
        except Exception as exc:  # one row's failure must not cost the table
            record = {"fault": name, "failed": f"{type(exc).__name__}: {exc}"}
            print(traceback.format_exc(), file=sys.stderr, flush=True)
        records.append(record)
        print(json.dumps(record), flush=True)
        where.write_text(json.dumps(records, indent=1))
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", nargs="+", default=list(FAULTS), choices=FAULTS)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--save-interval", type=float, default=0.01, help="minutes between periodic saves")
    parser.add_argument("--dir", type=Path, default=None, help="where the runs go (default: a temp directory)")
    opt = parser.parse_args()
    root = Path(opt.dir or tempfile.mkdtemp(prefix="faults-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    s = Setup(root, opt.epochs, opt.save_interval)
    LOGS.append(root / "logs")
    LOGS[0].mkdir(exist_ok=True)
    out = root / "runs"
    reference = run_job(s.job(out, "reference"), s.env, 900, noop)
    if reference.returncode != 0:
        sys.exit("the uninterrupted job failed:\n" + "\n".join(line for _, line in reference.lines[-30:]))
    records = run_faults(opt.faults, lambda name: inject(name, s, out), root / "faults.json")
    print(f"\n2 processes (gloo, CPU), yolov5n, {NB} steps an epoch, {opt.epochs} epochs, --save-interval "
          f"{opt.save_interval} min, --max-restarts 3, the watchdog's default bound; runs in {root}\n")  # fmt: skip
    print(table(records))
    missing = not_whole(records)
    if missing:
        sys.exit(f"\nthe table is not whole: {missing}")


def not_whole(records: list[dict]) -> str:
    """The rows that were not injected, skipped or failed, in words; empty when every row was injected.

    Examples:
        >>> not_whole([{"fault": "nan", "finished": True}, {"fault": "truncated", "not_injected": "no save"}])
        'truncated not injected (no save)'
    """
    kinds = ("not_injected", "skipped", "failed")
    return "; ".join(
        f"{r['fault']} {kind.replace('_', ' ')} ({r[kind]})" for r in records for kind in kinds if kind in r
    )


if __name__ == "__main__":
    main()
