"""Inside a Slurm allocation `accelify launch train.py` needs no placement flags: nodes, node
rank, rendezvous host and port, and processes per node come from SLURM_* (flags still win)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from accelify.errors import UserError
from accelify.runtime.launch.config import LaunchConfig
from accelify.runtime.launch.launcher import merge
from accelify.runtime.launch.slurm import PORT_BASE, expand_hostlist, placement, port
from conftest import FIXTURES

TRAIN = FIXTURES / "runtime" / "slurm_train.py"


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("node07", ["node07"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("a1,b[2-3]", ["a1", "b2", "b3"]),
        ("gpu[8-10]", ["gpu8", "gpu9", "gpu10"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("rack[1-2]-n[1,3]", ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]),
        ("x[1-2],y,z[05]", ["x1", "x2", "y", "z05"]),
        ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
        ("localhost", ["localhost"]),
    ],
    ids=[
        "single",
        "range-and-single",
        "plain-then-bracket",
        "width-grows",
        "zero-padded",
        "two-brackets",
        "three-names",
        "addresses",
        "localhost",
    ],
)
def test_hostlist_expands_like_scontrol_show_hostnames(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("hostlist", ["node[01-", "node[a-b]", "node[3-1]", "node]1["])
def test_malformed_hostlist_is_an_error(hostlist):
    with pytest.raises(ValueError, match="host list"):
        expand_hostlist(hostlist)


def allocation(**extra: str) -> dict[str, str]:
    return {
        "SLURM_JOB_ID": "4242",
        "SLURM_NNODES": "4",
        "SLURM_NODEID": "2",
        "SLURM_PROCID": "2",
        "SLURM_JOB_NODELIST": "gpu[11-12,20],gpu31",
        "SLURM_GPUS_ON_NODE": "8",
        **extra,
    }


def test_the_allocation_places_the_launcher():
    assert placement(allocation(), use_cpu=False) == {
        "num_machines": 4,
        "machine_rank": 2,
        "main_process_ip": "gpu11",
        "main_process_port": port(allocation()),
        "num_processes": 32,  # the total: 8 GPUs on each of 4 nodes
    }


def test_every_node_of_a_job_computes_the_same_port_and_jobs_differ():
    ports = {port(allocation(SLURM_NODEID=str(n))) for n in range(4)}
    assert len(ports) == 1 and PORT_BASE <= ports.pop() < 65536
    assert port(allocation()) != port(allocation(SLURM_JOB_ID="4243"))


def test_outside_an_allocation_nothing_is_read():
    assert placement({"SLURM_NODEID": "1"}, use_cpu=False) == {}
    assert merge(LaunchConfig(), {}, {}) == LaunchConfig()


def test_a_cpu_run_does_not_take_its_process_count_from_the_gpus():
    assert "num_processes" not in placement(allocation(), use_cpu=True)
    config = merge(LaunchConfig(), {"use_cpu": True}, allocation())
    assert (config.num_processes, config.num_machines) == (None, 4)


def test_flags_win_over_the_allocation_and_the_allocation_over_the_file():
    file_config = LaunchConfig(num_machines=1, machine_rank=0, main_process_port=7000)
    config = merge(file_config, {"machine_rank": 3, "num_processes": 8}, allocation())
    assert (config.machine_rank, config.num_processes) == (3, 8)
    assert (config.num_machines, config.main_process_ip) == (4, "gpu11")
    assert config.main_process_port == port(allocation())


def test_a_step_on_part_of_the_allocation_uses_the_step_nodes():
    env = allocation(SLURM_STEP_NODELIST="gpu[12,20]", SLURM_STEP_NUM_NODES="2", SLURM_NODEID="1")
    settings = placement(env, use_cpu=False)
    assert (settings["num_machines"], settings["main_process_ip"]) == (2, "gpu12")


def test_several_launchers_per_node_are_refused():
    env = allocation(SLURM_STEP_NUM_TASKS="32", SLURM_STEP_NUM_NODES="4")
    with pytest.raises(UserError, match="srun --ntasks-per-node=1"):
        placement(env, use_cpu=False)


def job_id_with_a_free_port() -> str:
    """A job id whose derived port is free here (other tests may hold ports)."""
    for job in range(7000, 7100):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port({"SLURM_JOB_ID": str(job)})))
            except OSError:
                continue
            return str(job)
    raise AssertionError("no free port in the job-id range tried")


@pytest.mark.distributed
def test_two_launchers_in_a_simulated_allocation_form_one_group(tmp_path):
    job = job_id_with_a_free_port()
    launchers = []
    for node in (0, 1):
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
            "SLURM_JOB_ID": job,
            "SLURM_NNODES": "2",
            "SLURM_NODEID": str(node),
            "SLURM_PROCID": str(node),
            "SLURM_JOB_NODELIST": "localhost",
        }
        launchers.append(
            subprocess.Popen(
                [sys.executable, "-m", "accelify", "launch", "--cpu", str(TRAIN)],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    outputs = []
    try:
        for launcher in launchers:
            outputs.append(launcher.communicate(timeout=240))
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                os.killpg(launcher.pid, 9)
                launcher.communicate()
    for launcher, (stdout, stderr) in zip(launchers, outputs, strict=True):
        assert launcher.returncode == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    reports = [json.loads(line) for stdout, _ in outputs for line in stdout.splitlines()]
    assert sorted((r["rank"], r["node"]) for r in reports) == [(0, 0), (1, 1)]
    assert {r["world"] for r in reports} == {2}
    assert {r["steps"] for r in reports} == {4}  # 64 samples, batch 8, sharded over 2 ranks
    assert reports[0]["weights"] == reports[1]["weights"]
