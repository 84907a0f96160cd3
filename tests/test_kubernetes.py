"""The launch recipes in examples/: the environment a PyTorchJob pod gets, and the example files themselves.

A (non-elastic) Kubeflow PyTorchJob runs ``python train.py`` once per pod with MASTER_ADDR,
MASTER_PORT, WORLD_SIZE and RANK, without LOCAL_RANK: each pod is its own node of one process.
The examples are parsed, not run: ``bash -n`` for the scripts, YAML with the fields the
training operator requires for the manifest, and every train.py flag they pass must exist.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

import ddp_utils as du
from ddp_utils.distributed import DistEnvError, DistInfo

from .multiproc import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"
SHELL_EXAMPLES = [EXAMPLES / "slurm" / "train.sbatch", EXAMPLES / "slurm" / "train_torchrun.sbatch",
                  EXAMPLES / "kubernetes" / "torchx.sh"]  # fmt: skip
MANIFEST = EXAMPLES / "kubernetes" / "pytorchjob.yaml"


def pod_env(rank: int, world_size: int, **extra: str) -> dict[str, str]:
    """What the training operator sets in a Worker pod of a PyTorchJob without elasticPolicy."""
    env = {"MASTER_ADDR": "ddp-train-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": str(world_size),
           "RANK": str(rank), "PYTHONUNBUFFERED": "1"}  # fmt: skip
    env.update(extra)
    return env


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_a_pytorchjob_pod_is_local_rank_0_of_one_process(rank):
    info = du.dist_info(pod_env(rank, 4))
    assert info == DistInfo(
        rank=rank, local_rank=0, world_size=4, local_world_size=1, node_rank=rank,
        master_addr="ddp-train-master-0", master_port=23456, restart_count=0, source="torchrun",
    )  # fmt: skip
    assert info.is_local_main and info.is_main == (rank == 0)


def test_a_pytorchjob_pod_with_local_rank_keeps_it():
    info = du.dist_info(pod_env(2, 4, LOCAL_RANK="0"))
    assert (info.rank, info.local_rank, info.world_size, info.is_local_main) == (2, 0, 4, True)


@pytest.mark.parametrize("missing", ["RANK", "WORLD_SIZE"])
def test_a_pod_missing_a_variable_is_told_which(missing):
    env = pod_env(1, 2)
    env.pop(missing)
    if missing == "RANK":
        env["LOCAL_RANK"] = "0"  # else nothing says this is a distributed job: a single process
    with pytest.raises(DistEnvError, match=f"{missing} is missing"):
        du.dist_info(env)


def test_a_pod_missing_master_addr_is_told_before_any_rendezvous(monkeypatch):
    env = pod_env(1, 2)
    env.pop("MASTER_ADDR")
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(DistEnvError, match="MASTER_ADDR is missing"):
        du.init_distributed(device="cpu")


def test_a_bad_rank_names_the_variable():
    with pytest.raises(DistEnvError, match="RANK='one'"):
        du.dist_info(pod_env(0, 2) | {"RANK": "one"})
    with pytest.raises(DistEnvError, match="WORLD_SIZE=2"):
        du.dist_info(pod_env(2, 2))


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("script", SHELL_EXAMPLES, ids=lambda p: p.name)
def test_shell_examples_are_valid_bash(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def test_sbatch_examples_ask_for_the_requeue_signal_and_one_task_per_gpu_or_node():
    directives = {p.name: re.findall(r"^#SBATCH\s+(\S+)", p.read_text(), re.M) for p in SHELL_EXAMPLES[:2]}
    for name, found in directives.items():
        assert "--signal=USR1@90" in found and "--requeue" in found, name
    assert "--ntasks-per-node=8" in directives["train.sbatch"]
    assert "--ntasks-per-node=1" in directives["train_torchrun.sbatch"]
    assert "SIGUSR1" in (EXAMPLES / "slurm" / "train_torchrun.sbatch").read_text()  # torchrun passes it on


def test_the_pytorchjob_has_what_the_training_operator_requires():
    job = yaml.safe_load(MANIFEST.read_text())
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    assert job["metadata"]["name"]
    elastic = job["spec"]["elasticPolicy"]
    assert elastic["rdzvBackend"] == "c10d" and elastic["minReplicas"] <= elastic["maxReplicas"]
    assert elastic["maxRestarts"] >= 1
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert isinstance(worker["replicas"], int) and worker["restartPolicy"] in ("OnFailure", "Always", "ExitCode")
    pod = worker["template"]["spec"]
    container = pod["containers"][0]
    assert container["name"] == "pytorch" and container["image"]
    assert container["command"][:2] == ["torchrun", "train.py"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == int(job["spec"]["nprocPerNode"])
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"]["sizeLimit"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def _train_args_in_shell(script_text: str) -> list[str]:
    """The arguments after ``train.py`` in a shell example (continuation lines joined, variables kept as words)."""
    joined = script_text.replace("\\\n", " ")
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if "train.py" in words:
            args = [w for w in words[words.index("train.py") + 1 :] if w != "$@"]  # the user's own options
            return args[args.index("--") + 1 :] if "--" in args else args
    raise AssertionError("no train.py command found")


def _example_train_args() -> dict[str, list[str]]:
    found = {p.name: _train_args_in_shell(p.read_text()) for p in SHELL_EXAMPLES}
    found[MANIFEST.name] = yaml.safe_load(MANIFEST.read_text())["spec"]["pytorchReplicaSpecs"]["Worker"]["template"][
        "spec"
    ]["containers"][0]["command"][2:]
    return found


@pytest.mark.parametrize("example", ["train.sbatch", "train_torchrun.sbatch", "torchx.sh", "pytorchjob.yaml"])
def test_the_train_py_flags_the_examples_pass_exist(example):
    sys.path.insert(0, str(REPO_ROOT))
    try:
        import train
    finally:
        sys.path.pop(0)
    args = _example_train_args()[example]
    assert "--data" in args, args
    opt = train.parse_opt(args)  # an unknown flag or a bad value exits 2
    assert opt.data == "coco.yaml" and opt.cache == "ram"
