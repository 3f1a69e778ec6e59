from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def run_accelify(
    *args: str | os.PathLike[str],
    cwd: Path | None = None,
    timeout: float = 240,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m accelify ARGS`, as a user runs it, with the user's config kept out of the way."""
    environment = {**os.environ, **(env or {})}
    command = [sys.executable, "-m", "accelify", *map(str, args)]
    return run_in_own_group(command, cwd=cwd, timeout=timeout, env=environment)


#: After a timeout's kill, how long the pipes may take to close before the test fails anyway
CLOSE_WAIT = 30


def run_in_own_group(
    command: list[str], cwd: Path | None, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run in a new session; on timeout kill it with every process it started (`_kill_group`),
    so no rank outlives its test."""
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        try:
            stdout, stderr = process.communicate(timeout=CLOSE_WAIT)
        except subprocess.TimeoutExpired:  # something not found above still holds a pipe
            stdout, stderr = "(not read: the pipe stayed open)", ""
        raise AssertionError(
            f"timed out after {timeout}s: {command}\nstdout:\n{stdout}\nstderr:\n{stderr}"
        ) from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def seconds_after_line(
    command: list[str], marker: str, cwd: Path | None, timeout: float, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], float | None]:
    """Run as `run_in_own_group`, and time from the first stderr line that holds ``marker``
    (printed by the script when the thing timed begins) to the process's end (None: never
    printed). A bound on a run's whole time also counts how long the ranks took to import torch
    and meet, which grows with the machine's load; timed from the script's own line, it counts
    only what the launcher does about it."""
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    stdout: list[str] = []
    reader = threading.Thread(target=lambda: stdout.append(process.stdout.read()), daemon=True)
    reader.start()
    killer = threading.Timer(timeout, _kill_group, [process.pid])
    killer.start()
    stderr, seen = [], None
    try:
        for line in process.stderr:
            stderr.append(line)
            if seen is None and marker in line:
                seen = time.monotonic()
        process.wait()
        ended = time.monotonic()
        reader.join()
    finally:
        killer.cancel()
    result = subprocess.CompletedProcess(
        command, process.returncode, "".join(stdout), "".join(stderr)
    )
    assert process.returncode != -signal.SIGKILL, (
        f"timed out after {timeout}s: {command}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return result, None if seen is None else ended - seen


def _kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads and every process descended from it. torch's
    elastic agent starts each rank in a session of its own: killing the launcher's group alone
    left the ranks running, holding the test's pipes open, and the test waited on them forever
    (a timed-out launch hung the suite instead of failing its test). Every process is stopped
    first, so that none starts another between the look at the tree and the kill."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGSTOP)
    for descendant in _descendants(pid):  # a rank's own children, started as it was stopped
        with contextlib.suppress(ProcessLookupError):
            os.kill(descendant, signal.SIGSTOP)
    for descendant in _descendants(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(descendant, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from /proc (Linux; elsewhere none are found)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            # the command's name is in parentheses and may hold spaces: the fields after it
            parent = int(entry.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # ended while being read
        children.setdefault(parent, []).append(int(entry.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def launch_timed(
    script: Path, marker: str, cwd: Path | None = None, timeout: float = 240
) -> tuple[subprocess.CompletedProcess[str], float | None]:
    """`launch` on 2 ranks, timed from the script's ``marker`` line on stderr to the end
    (`seconds_after_line`)."""
    command = [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", "2", str(script)]
    return seconds_after_line(command, marker, cwd=cwd, timeout=timeout, env=dict(os.environ))


def launch(
    script: Path,
    *args: str | os.PathLike[str],
    processes: int = 2,
    flags: tuple[str, ...] = (),
    cpu: bool = True,
    **kwargs: object,
) -> subprocess.CompletedProcess[str]:
    """`accelify launch [--cpu] -n PROCESSES FLAGS... SCRIPT ARGS...`."""
    device = ("--cpu",) if cpu else ()
    return run_accelify("launch", *device, "-n", str(processes), *flags, script, *args, **kwargs)


def run_python(
    script: Path, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return run_in_own_group([sys.executable, str(script), *args], cwd=cwd, timeout=240)


def assert_ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )


@pytest.fixture(autouse=True)
def _no_user_config(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tests never read the developer's ~/.config/accelify/config.yaml."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg")))
    if shutil.which("nvidia-smi") is None:
        # HF Accelerate imports DeepSpeed when it is installed, and DeepSpeed then prints a
        # "Setting accelerator to CPU" warning on stdout; on a machine without GPUs, say it first.
        monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    for name in list(os.environ):
        # SLURM_*: a suite run inside a Slurm job must not place its launches on the job's nodes
        if name.startswith(("ACCELIFY_", "SLURM_")):
            monkeypatch.delenv(name)
    # `accelify lint` caches its findings: in the test's own folder, never in the checkout
    monkeypatch.setenv("ACCELIFY_CACHE_DIR", str(tmp_path_factory.mktemp("lint_cache")))
    if "TORCH_EXTENSIONS_DIR" not in os.environ:
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions_dir()))


def extensions_dir() -> Path:
    """Where DeepSpeed's JIT-built ops (its CPU shared-memory comm op, 78 CPU-seconds to
    compile) are kept between runs: one folder per Python environment. torch's default is one
    folder for every environment of the user, and a build names its environment's include
    paths: a checkout's run after another checkout's (a second venv) compiled it again, and
    waited for the other's build lock meanwhile, past a launch's timeout."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    environment = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    return cache / "torch_extensions" / f"accelify-tests-{environment}"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--exhaustive",
        action="store_true",
        help="also run the tests marked `exhaustive`: every runnable golden through "
        "`accelify verify --to-end` and the launches that repeat a default test's path on "
        "other inputs (about 45 min on 2 cores, against 18 to 29 without)",
    )


def pytest_report_header(config: pytest.Config) -> str:
    if config.getoption("--exhaustive"):
        return "accelify: exhaustive run (every runnable golden and launch)"
    return "accelify: default run; `pytest --exhaustive` also runs the tests marked exhaustive"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `exhaustive` are deselected unless ``--exhaustive`` is given. Then fast
    tests first, then the ones that launch ranks, then the package builds: a broken change
    shows in the first minute, not after the launches."""
    if not config.getoption("--exhaustive"):
        deselected = [item for item in items if item.get_closest_marker("exhaustive")]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if not item.get_closest_marker("exhaustive")]

    def weight(item: pytest.Item) -> int:
        if item.get_closest_marker("slow"):
            return 2
        return 1 if item.get_closest_marker("distributed") else 0

    items.sort(key=weight)
