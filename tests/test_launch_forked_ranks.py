"""`accelify launch` forks its ranks from a template that imported torch once
(`accelify.runtime.launch.rank_start`), and starts them fresh wherever a fork could differ."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from accelify.runtime.launch import forking, main_module, rank_start, rank_template
from conftest import _descendants, _kill_group, assert_ok, launch, run_in_own_group, start

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
    assert rank_start.fresh_reason(str(first), True, False, {})  # no module of that name
    assert rank_start.fresh_reason(str(first), False, True, {}) == "--no-python"
    assert rank_start.fresh_reason(str(first), False, False, {"PYTHON_EXEC": "/bin/py"})
    for script in (late, third, dynamo, tmp_path / "missing.py"):
        assert rank_start.fresh_reason(str(script), False, False, {}), script


def test_a_rank_whose_environment_differs_is_refused(tmp_path: Path) -> None:
    environment = {"PATH": "/bin", "OMP_NUM_THREADS": "4"}
    template = rank_template._Template(dict(environment), {}, [0, 1])
    agent = {  # what the agent sets per rank
        "RANK": "1",
        "LOCAL_RANK": "1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_ERROR_FILE": "/tmp/x/error.json",
    }
    request = {
        "env": {**environment, **agent},
        "affinity": [0, 1],
        "argv": ["train.py"],
        "cwd": str(tmp_path),
    }
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


#: What a ``-m`` module sees of how it was started, with whether it was forked
MODULE_PROBE = textwrap.dedent(
    '''
    """A probe run as a module."""
    import json
    import os
    import sys
    import torch

    forked = "torch._dynamo" in sys.modules
    main = sys.modules["__main__"]
    seen = {
        "forked": forked,
        "torch": torch.rand(1).item(),
        "argv": sys.argv,
        "path0": sys.path[0],
        "spec": main.__spec__.name,
        "origin": main.__spec__.origin,
        "file": main.__file__,
        "package": main.__package__,
        "name": __name__,
        "main_is_this": main.__dict__ is globals(),
    }
    print("PROBE " + json.dumps(seen), flush=True)
    '''
)
#: How ``python -m`` starts it, whichever way the rank started
AS_PYTHON_M = ("argv", "path0", "spec", "origin", "file", "package", "name", "main_is_this")


def _module_project(folder: Path, init: str = '"""A package."""\n') -> Path:
    package = folder / "tools"
    package.mkdir()
    (package / "__init__.py").write_text(init)
    (package / "probe.py").write_text(MODULE_PROBE)
    return folder


@pytest.mark.distributed
def test_a_module_rank_is_forked_and_started_as_python_m_starts_it(tmp_path: Path) -> None:
    project = _module_project(tmp_path)
    plain = run_in_own_group(
        [sys.executable, "-m", "tools.probe", "--flag"], cwd=project, timeout=240
    )
    assert_ok(plain)
    (expected,) = _probes(plain.stdout)
    runs = {
        "forked": launch("tools.probe", "--flag", flags=("-m",), cwd=project),
        "fresh": launch(
            "tools.probe", "--flag", flags=("-m",), cwd=project, env={rank_start.FRESH_RANKS: "1"}
        ),
    }
    for how, result in runs.items():
        assert_ok(result)
        probes = _probes(result.stdout)
        assert len(probes) == 2, result.stdout
        assert all(probe["forked"] == (how == "forked") for probe in probes), (how, probes)
        assert probes[0]["torch"] != probes[1]["torch"]
        for probe in probes:
            assert {key: probe[key] for key in AS_PYTHON_M} == {
                key: expected[key] for key in AS_PYTHON_M
            }, how
    assert expected["argv"] == [str(project / "tools" / "probe.py"), "--flag"]
    assert expected["path0"] == str(project)


@pytest.mark.distributed
def test_a_module_whose_package_runs_a_statement_before_torch_starts_fresh(
    tmp_path: Path,
) -> None:
    project = _module_project(tmp_path, init='import os\nos.environ["MY_SETTING"] = "1"\n')
    result = launch("tools.probe", flags=("-m",), cwd=project)
    assert_ok(result)
    probes = _probes(result.stdout)
    assert len(probes) == 2 and not any(probe["forked"] for probe in probes), result.stdout
    assert probes[0]["spec"] == "tools.probe"


def test_why_a_module_rank_starts_fresh(tmp_path: Path) -> None:
    """The files ``python -m`` runs, in order, are found without importing any of them, and
    each may run nothing of its own before torch."""
    (tmp_path / "inert").mkdir()
    (tmp_path / "inert" / "__init__.py").write_text('"""Doc."""\nimport os\n')
    (tmp_path / "inert" / "main.py").write_text("import sys\nimport torch\nprint(sys)\n")
    (tmp_path / "inert" / "late.py").write_text("import os\nx = 1\nimport torch\n")
    (tmp_path / "inert" / "third.py").write_text("import numpy, torch\n")
    (tmp_path / "inert" / "dynamo.py").write_text("import torch\nTORCH_LOGS = 1\n")
    (tmp_path / "torchy").mkdir()  # its __init__ imports torch first: the rest runs after it
    (tmp_path / "torchy" / "__init__.py").write_text("import torch\nx = 1\n")
    (tmp_path / "torchy" / "__main__.py").write_text("x = 2\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "__init__.py").write_text("x = 1\n")
    (tmp_path / "runs" / "main.py").write_text("import torch\n")
    (tmp_path / "moves").mkdir()
    (tmp_path / "moves" / "__init__.py").write_text("import torch\n__path__.append('x')\n")
    (tmp_path / "moves" / "main.py").write_text("import torch\n")
    (tmp_path / "spaced").mkdir()  # a namespace package: no file of its own
    (tmp_path / "spaced" / "main.py").write_text("import torch\n")
    (tmp_path / "json.py").write_text("")  # the working directory's json, not the library's
    (tmp_path / "shadowed.py").write_text("import json\nimport torch\n")
    path, first = main_module.rank_path(["start", "/lib"], str(tmp_path), safe_path=False)
    assert path == [str(tmp_path), "/lib"] and first == str(tmp_path)
    assert main_module.rank_path(["/zip", "/lib"], str(tmp_path), safe_path=True) == (
        ["/zip", "/lib"],
        None,
    )

    def why(name: str, loaded: tuple[str, ...] = ()) -> str | None:
        return main_module.fresh_reason(name, path, {"entry"}, first, loaded)

    for name in ("inert.main", "torchy", "spaced.main"):
        assert why(name) is None, name
    for name in (
        "inert",  # a package without __main__
        "inert.late",
        "inert.third",
        "inert.dynamo",
        "runs.main",
        "moves.main",
        "shadowed",
        "missing.main",
        "inert.main.x",
        ".inert",
    ):
        assert why(name), name
    assert why("inert.main", loaded=("inert",))  # its __init__ would not run in the fork
    assert main_module.chain("torchy", path) == [
        ("torchy", tmp_path / "torchy" / "__init__.py"),
        ("torchy.__main__", tmp_path / "torchy" / "__main__.py"),
    ]
    assert main_module.entry_packages("a.b.c") == {"a", "a.b"}
    # `accelify verify` launches its probe as a module: its ranks are forked
    assert rank_start.fresh_reason("accelify.verify.probe", True, False, {}) is None


def test_the_template_decides_a_module_rank_with_the_ranks_own_path(tmp_path: Path) -> None:
    _module_project(tmp_path)
    template = rank_template._Template({}, {}, [0], start_path=["start", *sys.path[1:]])
    request = {"env": {}, "affinity": [0], "cwd": str(tmp_path), "argv": ["-m", "tools.probe"]}
    assert rank_template.refusal(request, template) is None
    elsewhere = {**request, "cwd": str(tmp_path / "tools")}  # no `tools` package there
    assert rank_template.refusal(elsewhere, template)
    loaded = {**request, "argv": ["-m", "json.tool"]}  # the library's json runs statements
    assert rank_template.refusal(loaded, template)


def test_a_script_whose_folder_holds_a_module_torch_imports_is_refused(tmp_path: Path) -> None:
    """A fresh rank imports torch with its script's folder first on its path: a module there
    named as one torch imports would be imported in the library's place."""
    (tmp_path / "train.py").write_text("import torch\n")
    template = rank_template._Template(
        {}, {}, [0], start_path=["/elsewhere"], imported_tops=frozenset({"sympy"})
    )
    request = {"env": {}, "affinity": [0], "cwd": str(tmp_path), "argv": ["train.py"]}
    assert rank_template.refusal(request, template) is None
    (tmp_path / "sympy").mkdir()
    (tmp_path / "sympy" / "__init__.py").write_text("")
    assert "sympy" in (rank_template.refusal(request, template) or "")
    _module_project(tmp_path)  # under -m, the working directory is the first folder
    template.start_path = ["/elsewhere", *sys.path[1:]]
    module = {**request, "argv": ["-m", "tools.probe"]}
    assert "sympy" in (rank_template.refusal(module, template) or "")
    (tmp_path / "sympy" / "__init__.py").unlink()
    assert rank_template.refusal(module, template) is None


def test_imports_are_taken_in_their_order(tmp_path: Path) -> None:
    assert forking.opening(b"import os, torch\n", None) == forking.TORCH_FIRST
    assert forking.opening(b"import numpy, torch\n", None) == forking.OWN_FIRST
    assert forking.opening(b'"""Doc."""\nimport os\n', None) == forking.STANDARD_ONLY
    assert forking.opening(b"", None) == forking.STANDARD_ONLY
    (tmp_path / "torch.py").write_text("")
    assert forking.opening(b"import torch\n", str(tmp_path)) == forking.OWN_FIRST


def test_torchs_exit_handlers_run_before_the_entrys_as_in_a_fresh_rank() -> None:
    """A forked rank had torch's exit handlers registered before its entry registered its own,
    the last to run in a fresh rank: they are registered again after it."""
    program = textwrap.dedent(
        """
        import atexit
        from accelify.runtime import rank_entry

        def torchs(word):
            print(word, flush=True)

        def entrys():
            print("entry", flush=True)

        atexit.register(torchs, "torch 1")  # as the template imported torch
        atexit.register(torchs, word="torch 2")
        atexit.register(entrys)  # the entry's own, registered first in a fresh rank
        again = [(torchs, ("torch 1",), {}), (torchs, (), {"word": "torch 2"})]
        rank_entry._registered_again(again)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    assert result.stdout.split("\n")[:3] == ["torch 2", "torch 1", "entry"]


def test_the_template_records_the_exit_handlers_and_generators_its_imports_made() -> None:
    program = textwrap.dedent(
        """
        import random, sys
        from accelify.runtime.launch import forking

        forking.share_what_every_run_loads()
        names = [getattr(f, "__qualname__", "") for f, _, _ in forking.IMPORTS_EXIT_HANDLERS]
        print("weakref" if "finalize._exitfunc" in names else "no weakref")
        dummy = sys.modules["sympy"].Dummy._prng  # a class's, not a module's
        state = dummy.getstate()
        forking.seed_again()
        print("seeded" if dummy.getstate() != state else "same")
        """
    )
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", program],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.split() == ["weakref", "seeded"]


def test_a_template_that_loaded_cudas_driver_forks_no_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    template = rank_template._Template({}, {}, [0], start_path=[str(tmp_path)])
    request = {"env": {}, "affinity": [0], "cwd": str(tmp_path), "argv": ["train.py"]}
    program = (
        "from accelify.runtime.launch import forking, rank_template\n"
        "forking.share_what_every_run_loads()\n"
        "print(rank_template._cuda_driver_loaded())\n"
    )
    imported = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", program], capture_output=True, text=True, check=True
    )
    assert imported.stdout.strip() == "False"  # torch's and torch._dynamo's imports do not load it
    monkeypatch.setattr(rank_template, "_cuda_driver_loaded", lambda: False)
    assert rank_template.refusal(request, template) is None
    monkeypatch.setattr(rank_template, "_cuda_driver_loaded", lambda: True)
    assert "CUDA" in (rank_template.refusal(request, template) or "")


def test_a_forks_streams_are_made_over_its_own_files(tmp_path: Path) -> None:
    """A text stream notes whether its file seeks as it is made: the template's were made over
    pipes, a rank's stdout may be a file (``--log-dir``), as a fresh rank's would see."""
    program = textwrap.dedent(
        f"""
        import os, sys
        from accelify.runtime.launch import forking

        opened = os.open({str(tmp_path / "log")!r}, os.O_WRONLY | os.O_CREAT)
        os.dup2(opened, 1)  # as `take_streams` hands the rank its files
        before = sys.stdout.seekable()
        forking.streams_as_started()
        after = sys.stdout.seekable()
        print(before, after, sys.stdout.write_through, sys.stdout is sys.__stdout__,
              sys.stdout.buffer.name, file=sys.stderr)
        """
    )
    result = subprocess.run(
        [sys.executable, "-u", "-c", program], capture_output=True, text=True, check=True
    )
    assert result.stderr.split() == ["False", "True", "True", "True", "<stdout>"]


@pytest.mark.distributed
def test_a_template_killed_takes_its_ranks_with_it(tmp_path: Path) -> None:
    """The template SIGKILLed (the out-of-memory killer): no rank goes on training, orphaned,
    and the clients report their ranks killed, with no traceback of their own."""
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    command = [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", "2", str(script)]
    process = start(command, cwd=tmp_path, env=None)
    try:
        pids = [int(process.stdout.readline().split()[1]) for _ in range(2)]
        os.kill(_parent(pids[0]), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in pids)
        _, stderr = process.communicate(timeout=120)
    finally:
        _kill_group(process.pid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert process.returncode == 128 + signal.SIGKILL, stderr
    assert "Traceback" not in stderr, stderr


@pytest.mark.distributed
def test_a_forked_rank_takes_sigint_though_the_launcher_started_ignoring_it(
    tmp_path: Path,
) -> None:
    """``accelify launch ... &`` in a script starts with SIGINT ignored; the agent handles it,
    so a fresh rank gets Python's KeyboardInterrupt, and so must a forked one."""
    script = tmp_path / "waiter.py"
    script.write_text(
        WAITER.replace(
            'print("PID"', 'atexit.register(print, "ATEXIT", flush=True)\nprint("PID"'
        ).replace("import os", "import atexit\nimport os", 1)
    )
    command = [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", "2", str(script)]
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        for _ in range(2):
            process.stdout.readline()
        os.kill(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        _kill_group(process.pid)
    assert process.returncode == 130, stderr
    # each rank ran its exit handlers: a KeyboardInterrupt, not the agent's SIGKILL 30 s later
    assert stdout.count("ATEXIT") == 2, (stdout, stderr)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
