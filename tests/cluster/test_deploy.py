"""The Slurm array script and the Kubernetes Indexed Job manifest in deploy/, run here as their tasks would run:
the sbatch script's directives and command read from the file and the script run by bash once per array task, the
manifest's container command, arguments and environment read with yaml, each as 3 processes with the environment
Slurm or Kubernetes would give them, against the simulated server and one shared store. Neither slurm nor kubectl
is needed."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.cluster.conftest import LEASE_TTL, check_shared_run, python_env, sim_job
from tests.helpers import ROOT

SBATCH = ROOT / "deploy" / "slurm" / "runner-array.sbatch"
MANIFEST = ROOT / "deploy" / "kubernetes" / "runner-indexed-job.yaml"
TASKS = 3
#: ``runner`` as these tests run it: this Python's module (the `runner` script may not be on PATH)
RUNNER = [sys.executable, "-m", "runner.cli"]


def _finish(procs: list[subprocess.Popen]) -> list[str]:
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outs.append(out)
    return outs


def test_the_sbatch_script_runs_one_command_in_every_task():
    text = SBATCH.read_text(encoding="utf-8")
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)$", text, re.M))
    first, last = map(int, directives["array"].split("-"))
    assert last - first + 1 >= TASKS
    commands = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    runs = [shlex.split(line) for line in commands if line.startswith("runner ")]
    assert len(runs) == 1 and runs[0][:2] == ["runner", "submit"] and "--run-id" in runs[0]
    assert "SLURM_ARRAY_JOB_ID" in runs[0][runs[0].index("--run-id") + 1]


@pytest.mark.slow
@pytest.mark.parametrize("sim_server", [0.03], indirect=True)
def test_slurm_array_tasks_make_one_run(tmp_path, sim_server, db, monkeypatch):
    bash = shutil.which("bash")
    assert bash is not None
    rows = 300
    job = sim_job(tmp_path, sim_server, rows=rows)
    # each task: the script run by bash, `runner` a shell function calling this Python, Slurm's variables set
    runner = f"runner() {{ {shlex.join(RUNNER)} \"$@\"; }}; export -f runner; exec {bash} {shlex.quote(str(SBATCH))}"
    procs = []
    for index in range(TASKS):
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_ARRAY_JOB_ID": "4242",
               "SLURM_ARRAY_TASK_ID": str(index), "SLURM_JOB_ID": str(4243 + index), "JOB_FILE": str(job),
               "RUNNER_DB": db, "RUNNER_LEASE_TTL": LEASE_TTL, **python_env()}
        procs.append(subprocess.Popen([bash, "-c", runner], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = _finish(procs)
    assert sum("run slurm-4242: started job testjob" in out for out in outs) == 1, outs
    assert all("run slurm-4242: completed" in out for out in outs), outs
    check_shared_run(db, "slurm-4242", sim_server, rows)


def _container() -> dict:
    docs = [doc for doc in yaml.safe_load_all(MANIFEST.read_text(encoding="utf-8")) if doc]
    jobs = [doc for doc in docs if doc["kind"] == "Job"]
    assert len(jobs) == 1
    spec = jobs[0]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["parallelism"] >= TASKS
    (container,) = spec["template"]["spec"]["containers"]
    return container


def test_the_manifest_is_a_valid_kubernetes_job():
    """Checked against Kubernetes' own published schema (kubernetes-validate ships it), strictly: a misspelt or
    misplaced field fails. 1.31: the first release with pod failure policies generally available."""
    import kubernetes_validate

    for doc in yaml.safe_load_all(MANIFEST.read_text(encoding="utf-8")):
        kubernetes_validate.validate(doc, "1.31", strict=True)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({**doc, "spec": {**doc["spec"], "completionmode": "Indexed"}}, "1.31",
                                     strict=True)


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(NAME) in a container's command and arguments."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), text)


@pytest.mark.slow
@pytest.mark.parametrize("sim_server", [0.03], indirect=True)
def test_kubernetes_indexed_job_pods_make_one_run(tmp_path, sim_server, db, monkeypatch):
    rows = 300
    container = _container()
    mount = container["volumeMounts"][0]["mountPath"]
    # the ConfigMap's job file, at the mount path as the pods see it (here: a folder of the test)
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    sim_job(mounted, sim_server, rows=rows).rename(mounted / "job.yaml")
    secrets = {"RUNNER_DB": db, "OPENAI_API_KEY": "sk-not-used-by-the-sim"}
    uid = "0b9c4e8a-5f1d-4c59-9a3e-2d7f6b1c8e04"
    procs = []
    for index in range(TASKS):
        env: dict[str, str] = {"JOB_COMPLETION_INDEX": str(index), "RUNNER_LEASE_TTL": LEASE_TTL,
                               "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **python_env()}
        for var in container["env"]:
            source = var.get("valueFrom", {})
            if "value" in var:
                env[var["name"]] = var["value"].replace(mount, str(mounted))
            elif "secretKeyRef" in source:
                env[var["name"]] = secrets[source["secretKeyRef"]["key"]]
            else:
                assert source["fieldRef"]["fieldPath"] == "metadata.labels['batch.kubernetes.io/controller-uid']"
                env[var["name"]] = uid
        argv = [_expand(part, env) for part in [*container["command"], *container["args"]]]
        assert argv[0] == "runner"
        procs.append(subprocess.Popen([*RUNNER, *argv[1:]], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = _finish(procs)
    run_id = f"k8s-{uid}"
    assert sum(f"run {run_id}: started job testjob" in out for out in outs) == 1, outs
    assert all(f"run {run_id}: completed" in out for out in outs), outs
    check_shared_run(db, run_id, sim_server, rows)
