"""`accelify launch` forks its ranks from a template that imported torch once
(`accelify.runtime.launch.rank_start`), and starts them fresh wherever a fork could differ."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from accelify.runtime.launch import rank_start, rank_template
from conftest import _descendants, _kill_group, assert_ok, launch, start

#: Says, from each rank, whether it was forked (torch._dynamo is imported with torch by the
#: template only: `import torch` alone does not import it) and what it draws and sees
PROBE = textwrap.dedent(
    '''
    """A probe."""
    import json
    import os
    import random
    import sys
    import torch

    forked = "torch._dynamo" in sys.modules
    import numpy

    seen = {
        "forked": forked,
        "torch": torch.rand(1).item(),
        "numpy": float(numpy.random.rand()),
        "random": random.random(),
        "argv": sys.argv,
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "main": sys.modules["__main__"].__file__,
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "threads": torch.get_num_threads(),
        # named in two parts: a script that names it starts its ranks fresh (`rank_start`)
        "inductor": os.environ.get("TORCHIND" + "UCTOR_CACHE_DIR") is not None,
        "session": os.getsid(0) == os.getpid(),
    }
    print("PROBE " + json.dumps(seen), flush=True)
    '''
)


def _probes(stdout: str) -> list[dict]:
    return [json.loads(line[6:]) for line in stdout.splitlines() if line.startswith("PROBE ")]


@pytest.mark.distributed
def test_ranks_are_forked_and_each_draws_its_own_random_numbers(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    result = launch(script, "--flag", cwd=tmp_path)
    assert_ok(result)
    probes = _probes(result.stdout)
    assert len(probes) == 2 and all(probe["forked"] for probe in probes), result.stdout
    for name in ("torch", "numpy", "random"):  # seeded again in each rank, as a fresh start
        assert probes[0][name] != probes[1][name], (name, probes)
    for probe in probes:
        assert probe["argv"] == [str(script), "--flag"]
        assert probe["path0"] == str(tmp_path)
        assert probe["cwd"] == str(tmp_path)
        assert probe["main"] == str(script)
        assert probe["session"]  # a session of its own, as the agent starts a rank
        assert probe["inductor"]  # what torch._dynamo's import sets, as in a fresh rank
        # the launcher shares the cores out on the CPU, through the variable and torch alike
        assert probe["threads"] == int(probe["omp"])


@pytest.mark.distributed
def test_fresh_ranks_on_request_and_where_a_fork_could_differ(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    late = tmp_path / "late.py"  # a statement of its own before torch: it may set a variable
    late.write_text('import os\nos.environ["MY_SETTING"] = "1"\n' + PROBE)
    for path, env in ((script, {rank_start.FRESH_RANKS: "1"}), (late, {})):
        result = launch(path, cwd=tmp_path, env=env)
        assert_ok(result)
        probes = _probes(result.stdout)
        assert len(probes) == 2 and not any(probe["forked"] for probe in probes), path
        assert probes[0]["torch"] != probes[1]["torch"]


#: A rank that says its pid, then waits
WAITER = textwrap.dedent(
    """
    import os
    import sys
    import time
    import torch

    print("PID", os.getpid(), os.environ["RANK"], flush=True)
    time.sleep(120)
    """
)


@pytest.mark.distributed
def test_a_client_killed_takes_its_rank_with_it(tmp_path: Path) -> None:
    """The agent's last resort, SIGKILL, reaches the client it started: the template kills the
    rank the client stood for, and the run ends as a rank killed by SIGKILL does."""
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    command = [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", "2", str(script)]
    process = start(command, cwd=tmp_path, env=None)
    try:
        lines = [process.stdout.readline().split() for _ in range(2)]
        pid, rank = next((int(line[1]), line[2]) for line in lines if line[2] == "1")
        os.kill(_client_of(process.pid, rank), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid)
        _, stderr = process.communicate(timeout=120)
    finally:
        _kill_group(process.pid)
    assert process.returncode == 128 + signal.SIGKILL, stderr
    assert "SIGKILL" in stderr


def _client_of(launcher: int, rank: str) -> int:
    """The client that stands for the rank: the launcher's descendant running the client whose
    environment, as the agent started it, has the rank's ``RANK``."""
    for pid in _descendants(launcher):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        client = any(part.endswith(b"rank_client.py") for part in cmdline)
        if client and f"RANK={rank}".encode() in environ:
            return pid
    raise AssertionError(f"no client for rank {rank}")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_why_a_launch_starts_its_ranks_fresh(tmp_path: Path) -> None:
    first = tmp_path / "first.py"
    first.write_text('"""Doc."""\nimport os\nfrom torch import nn\nprint(os)\n')
    late = tmp_path / "late.py"
    late.write_text("import os\nx = 1\nimport torch\n")
    third = tmp_path / "third.py"
    third.write_text("import numpy\nimport torch\n")
    dynamo = tmp_path / "dynamo.py"
    dynamo.write_text('import os\nimport torch\nos.environ["TORCHDYNAMO_VERBOSE"] = "1"\n')
    assert rank_start.fresh_reason(str(first), False, False, {}) is None
    assert rank_start.fresh_reason(str(first), False, False, {"ACCELIFY_FRESH_RANKS": "0"}) is None
    assert rank_start.fresh_reason(str(first), False, False, {"ACCELIFY_FRESH_RANKS": "1"})
    assert rank_start.fresh_reason(str(first), True, False, {}) == "--module"
    assert rank_start.fresh_reason(str(first), False, True, {}) == "--no-python"
    assert rank_start.fresh_reason(str(first), False, False, {"PYTHON_EXEC": "/bin/py"})
    for script in (late, third, dynamo, tmp_path / "missing.py"):
        assert rank_start.fresh_reason(str(script), False, False, {}), script


def test_a_rank_whose_environment_differs_is_refused() -> None:
    environment = {"PATH": "/bin", "OMP_NUM_THREADS": "4"}
    template = rank_template._Template(dict(environment), {}, [0, 1])
    agent = {  # what the agent sets per rank
        "RANK": "1",
        "LOCAL_RANK": "1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_ERROR_FILE": "/tmp/x/error.json",
    }
    request = {"env": {**environment, **agent}, "affinity": [0, 1]}
    assert rank_template.refusal(request, template) is None
    for name, value in (("CUDA_VISIBLE_DEVICES", "1"), ("OMP_NUM_THREADS", "2")):
        refused = {**request, "env": {**request["env"], name: value}}
        assert name in (rank_template.refusal(refused, template) or "")
    assert rank_template.refusal({**request, "affinity": [0]}, template)
    missing = {**request, "env": {"OMP_NUM_THREADS": "4", **agent}}
    assert "PATH" in (rank_template.refusal(missing, template) or "")


def test_the_environment_the_template_starts_with() -> None:
    """The launcher's, with torchrun's ``OMP_NUM_THREADS=1`` for several ranks."""
    assert rank_start.rank_environment({"A": "1"}, 2) == {"A": "1", "OMP_NUM_THREADS": "1"}
    assert rank_start.rank_environment({"A": "1"}, 1) == {"A": "1"}
    assert rank_start.rank_environment({"OMP_NUM_THREADS": "3"}, 2) == {"OMP_NUM_THREADS": "3"}


def test_the_client_exits_as_its_rank(tmp_path: Path) -> None:
    """A rank's code is the client's; a rank's signal kills the client with the same signal."""
    for code in (0, 3, -signal.SIGTERM, -signal.SIGKILL, -signal.SIGSEGV):
        program = (
            f"import sys; sys.path.insert(0, {str(Path(rank_start.CLIENT).parent)!r}); "
            f"import rank_client; rank_client._exit_as({code})"
        )
        result = subprocess.run([sys.executable, "-I", "-S", "-c", program], check=False)
        assert result.returncode == code


def test_a_client_that_cannot_reach_its_template_becomes_a_fresh_rank(tmp_path: Path) -> None:
    """The template gone (or refusing): the client executes today's command in its place, with
    its pid, environment and streams."""
    script = tmp_path / "plain.py"
    script.write_text("import os, sys\nprint(os.getpid(), sys.orig_argv[1:4], sys.argv)\n")
    client = [sys.executable, "-I", "-S", str(rank_start.CLIENT), str(tmp_path / "no.sock")]
    process = subprocess.Popen(
        [*client, str(script), "--x"],
        cwd=tmp_path,
        env={**os.environ, "RANK": "0"},
        stdout=subprocess.PIPE,
        text=True,
    )
    stdout, _ = process.communicate(timeout=120)
    assert process.returncode == 0
    assert stdout.split(maxsplit=1)[0] == str(process.pid)
    assert "['-u', '-m', 'accelify.runtime.rank_entry']" in stdout
    assert f"['{script}', '--x']" in stdout
