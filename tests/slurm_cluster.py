"""A real SLURM cluster on this host, for tests: munged, slurmctld and one slurmd per node, started as root.

``start_cluster(nodes=2)`` writes a slurm.conf into a fresh directory of its own (state, spool,
logs, the munge key and socket all live there, and the ports are free ones), so two test runs on
one machine never meet; it waits until ``sinfo`` shows every node idle. Where that cannot happen
(no binaries, not root, a daemon that dies, nodes that do not come up in time) it raises
:class:`SlurmUnavailable` with the reason and the daemons' output, and the tests skip with it
(:func:`skip_or_fail`), unless ``$REQUIRE_SLURM`` is set (``.ci/run`` sets it): then they fail, so
CI is never green without its SLURM tests having run.

What it took (Debian bookworm: slurm-wlm 22.05.8, munge 0.5.15), found by trying:

- No cgroups: ``ProctrackType=proctrack/linuxproc`` (a job's processes are its descendants),
  ``TaskPlugin=task/none``, ``JobAcctGatherType=jobacct_gather/none``; no database
  (``AccountingStorageType=accounting_storage/none``). No cgroup.conf, no systemd.
- A munged of its own (``--socket``, ``--key-file`` in the directory; slurm finds it through
  ``AuthInfo=socket=...``), so whether the host runs a munged does not matter.
- Several nodes on one host: Debian's slurmd is built for it, so each node is a slurmd started
  with ``-N name`` and a ``Port`` of its own (``%n`` in its spool, pid and log paths). The nodes
  are named after the host and ``localhost``: both resolve to this machine, so the recipes'
  rendezvous on "the first node of SLURM_JOB_NODELIST" works unchanged. The host's CPUs
  (``slurmd -C``) are shared out among them.
- A requeued job is held ``AuthInfo=cred_expire`` + 1 seconds before it may start again (22.05
  has no ``SchedulerParameters=requeue_delay``; SLURM 26.05 adds it): the default, 120 s, is the
  "about two minutes" a requeue takes. Here ``cred_expire=10`` (5 is the least it takes): a
  requeued job starts again about 11 s after ``scontrol requeue``.
- ``scontrol requeue`` from inside a job ends the job at once (SIGTERM to its processes, "CANCELLED
  ... DUE TO JOB REQUEUE"), so whatever train.py does after it may not happen.
- Job ids start at a random ``FirstJobId`` such that ``20000 + id % 20000`` (the MASTER_PORT
  ``dist_info`` derives from SLURM_JOB_ID, the recipes' rendezvous port) lies below Linux's
  ephemeral ports and differs between two clusters on one machine.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

COMMANDS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo")
CRED_EXPIRE = 10  # seconds; a requeued job starts again CRED_EXPIRE + 1 s after the requeue


REQUIRE_ENV = "REQUIRE_SLURM"  # set (to anything but "" or "0"): no cluster is a failure, not a skip


class SlurmUnavailable(RuntimeError):
    """No cluster can be started here; the message says why."""


def skip_or_fail(exc: SlurmUnavailable) -> None:
    """Skip the calling test saying why no cluster could start, or fail it where ``$REQUIRE_SLURM`` asks for one."""
    import pytest  # only the tests call this; the module itself stays usable without pytest

    message = f"no SLURM cluster on this machine: {exc}"
    if os.environ.get(REQUIRE_ENV, "").strip() not in ("", "0"):
        pytest.fail(f"{message}\n(${REQUIRE_ENV} is set: the SLURM tests must run here)", pytrace=False)
    pytest.skip(message)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _node_line(env: dict[str, str]) -> str:
    """``slurmd -C``'s NodeName line: this host's CPUs, sockets, cores, threads and memory."""
    result = subprocess.run(["slurmd", "-C"], env=env, capture_output=True, text=True, timeout=60, check=False)
    line = next((ln for ln in result.stdout.splitlines() if ln.startswith("NodeName=")), None)
    if result.returncode != 0 or line is None:
        raise SlurmUnavailable(f"slurmd -C exited {result.returncode}: {(result.stderr or result.stdout).strip()}")
    return line


def node_names(node_line: str, nodes: int) -> list[str]:
    """Names of ``nodes`` slurmds on this host: its hostname, then ``localhost`` (both resolve here)."""
    hostname = re.match(r"NodeName=(\S+)", node_line).group(1)
    names = [hostname] + [name for name in ("localhost",) if name != hostname]
    if nodes > len(names):
        raise SlurmUnavailable(f"{nodes} nodes asked for, but only {names} resolve to this host")
    return names[:nodes]


def slurm_conf(root: Path, node_line: str, nodes: int, ports: list[int], first_job_id: int) -> str:
    """The slurm.conf of a cluster of ``nodes`` slurmds on this host, living under ``root``.

    The host's CPUs and memory (``slurmd -C``) are shared out among the nodes; each slurmd has
    a port, a spool directory, a pid and a log file of its own (``%n``: its node name).
    """
    names = node_names(node_line, nodes)
    cpus, memory = (int(re.search(rf"{key}=(\d+)", node_line).group(1)) for key in ("CPUs", "RealMemory"))
    node_lines = "\n".join(
        f"NodeName={name} NodeHostname={names[0]} NodeAddr=127.0.0.1 Port={port} CPUs={max(cpus // nodes, 1)} "
        f"RealMemory={max(memory // nodes, 1)} State=UNKNOWN"
        for name, port in zip(names, ports[1:])
    )
    return f"""\
ClusterName=ddputils
SlurmctldHost={names[0]}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmUser=root
AuthInfo=socket={root}/munge/munge.socket,cred_expire={CRED_EXPIRE}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
FirstJobId={first_job_id}
{node_lines}
PartitionName=debug Nodes={",".join(names)} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    """A running cluster: its directory, the environment its commands need, its node count, its daemons."""

    root: Path
    env: dict[str, str]
    nodes: int
    daemons: list[subprocess.Popen] = field(default_factory=list)

    def command(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        """Run a SLURM client command (``sbatch``, ``scontrol``, ...) against this cluster."""
        result = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {result.returncode}: {result.stderr}{self.logs()}")
        return result

    def sbatch(self, script: Path, *args: str, options: tuple[str, ...] = (), env: dict[str, str] | None = None,
               cwd: Path | None = None) -> str:  # fmt: skip
        """Submit ``script`` with ``args``; the job gets ``env`` (its PATH, PYTHONPATH, ...). Returns the job id."""
        job_env = {k: v for k, v in (env or os.environ).items() if not k.startswith("SLURM_")}
        job_env["SLURM_CONF"] = self.env["SLURM_CONF"]
        result = subprocess.run(
            ["sbatch", "--parsable", *options, str(script), *args], env=job_env, cwd=cwd, capture_output=True,
            text=True, timeout=60, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise AssertionError(f"sbatch {script} exited {result.returncode}: {result.stderr}{self.logs()}")
        return result.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, RestartCnt, ExitCode, ...); empty once SLURM forgot the job."""
        result = self.command("scontrol", "show", "job", "--oneliner", job_id, check=False)
        return dict(re.findall(r"(\w+)=(\S*)", result.stdout)) if result.returncode == 0 else {}

    def wait_job(self, job_id: str, done, timeout: float, what: str) -> dict[str, str]:
        """Poll the job until ``done(fields)``; fail naming ``what`` with the job and the logs past ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if done(fields):
                return fields
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id}: {what} not within {timeout:.0f} s: {fields}{self.logs()}")
            time.sleep(0.5)

    def wait_idle(self, timeout: float) -> None:
        """Wait until every node is idle again: the jobs' processes have all ended."""
        _wait(lambda: _nodes_idle(self, self.nodes), timeout, self, "every node idle again")

    def logs(self, lines: int = 15) -> str:
        """The daemons' last log lines, for a failure message."""
        text = []
        for path in sorted(self.root.glob("slurm*.log")):
            text.append(f"\n--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "".join(text)

    def stop(self) -> None:
        """Cancel what is left, stop the daemons, kill what they left behind, remove the directory."""
        with contextlib.suppress(Exception):
            self.command("scancel", "--full", "--user", "root", timeout=20, check=False)
        for daemon in reversed(self.daemons):
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
        for daemon in reversed(self.daemons):
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=10)
        # a slurmstepd outlives its slurmd (and ignores SIGTERM): kill it and its job's processes
        deadline = time.monotonic() + 10
        while (left := self.processes()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        shutil.rmtree(self.root, ignore_errors=True)

    def processes(self) -> list[int]:
        """Processes of this cluster: slurmstepds and jobs, found by the SLURM_CONF in their environment."""
        mark = f"\0SLURM_CONF={self.env['SLURM_CONF']}\0".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                with contextlib.suppress(OSError):
                    if mark in b"\0" + (entry / "environ").read_bytes():
                        found.append(int(entry.name))
        return found


def start_cluster(nodes: int = 2, timeout: float = 60) -> SlurmCluster:
    """Start munged, slurmctld and ``nodes`` slurmds in a new directory; wait until every node is idle.

    Raises:
        SlurmUnavailable: the binaries are missing, this is not root, or the nodes are not idle
            within ``timeout`` seconds (the daemons are stopped again, the message has their output).
    """
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    missing = [name for name in COMMANDS if shutil.which(name, path=path) is None]
    if missing:
        raise SlurmUnavailable(f"no {', '.join(missing)} on PATH: install slurm-wlm and munge (.ci/run does)")
    if os.geteuid() != 0:
        raise SlurmUnavailable(f"slurmd and munged must run as root here; this is uid {os.geteuid()}")
    root = Path(tempfile.mkdtemp(prefix="ddp-slurm-"))  # short: unix socket paths stay under 108 bytes
    (root / "state").mkdir(mode=0o700)
    munge = root / "munge"
    munge.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=path, SLURM_CONF=str(root / "slurm.conf"))
    cluster = SlurmCluster(root, env, nodes)
    try:
        node_line = _node_line(env)
        names = node_names(node_line, nodes)
        first_job_id = random.randrange(1, 3_000) * 20_000 + random.randrange(1_000, 12_000)  # port 21000-31999
        (root / "slurm.conf").write_text(slurm_conf(root, node_line, nodes, _free_ports(nodes + 1), first_job_id))
        for name in names:
            (root / f"spool-{name}").mkdir(mode=0o700)
        subprocess.run(["mungekey", "--create", f"--keyfile={munge}/munge.key"], env=env, capture_output=True,
                       timeout=60, check=True)  # fmt: skip
        _start(cluster, "munged", ["munged", "--foreground", "--force", f"--socket={munge}/munge.socket",
               f"--key-file={munge}/munge.key", f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
               f"--seed-file={munge}/munged.seed"])  # fmt: skip
        _wait(lambda: (munge / "munge.socket").exists(), timeout, cluster, "munged's socket")
        _start(cluster, "slurmctld", ["slurmctld", "-D", "-i"])  # -i: no state of an earlier run to recover
        for name in names:
            _start(cluster, f"slurmd-{name}", ["slurmd", "-D", "-N", name])
        _wait(lambda: _nodes_idle(cluster, nodes), timeout, cluster, f"{nodes} nodes idle in sinfo")
    except BaseException as exc:
        outputs = "".join(f"\n--- {p.name}: " + p.read_text(errors="replace")[-1500:] for p in root.glob("*.out"))
        cluster.stop()
        if not isinstance(exc, Exception):  # KeyboardInterrupt, pytest's timeout
            raise
        reason = exc if isinstance(exc, SlurmUnavailable) else f"{type(exc).__name__}: {exc}"
        raise SlurmUnavailable(f"{reason}{outputs}") from None
    return cluster


def _start(cluster: SlurmCluster, name: str, cmd: list[str]) -> None:
    with open(cluster.root / f"{name}.out", "w") as log:  # the daemon writes on through its own descriptor
        cluster.daemons.append(subprocess.Popen(cmd, env=cluster.env, stdout=log, stderr=subprocess.STDOUT))


def _nodes_idle(cluster: SlurmCluster, nodes: int) -> bool:
    result = cluster.command("sinfo", "--noheader", "--Node", "--format=%t", timeout=20, check=False)
    return result.returncode == 0 and result.stdout.split() == ["idle"] * nodes


def _wait(ready, timeout: float, cluster: SlurmCluster, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        dead = [" ".join(d.args[:4]) for d in cluster.daemons if d.poll() is not None]
        if dead:
            raise SlurmUnavailable(f"{', '.join(dead)} exited while waiting for {what}{cluster.logs()}")
        if time.monotonic() > deadline:
            raise SlurmUnavailable(f"{what} not within {timeout:.0f} s{cluster.logs()}")
        time.sleep(0.3)
