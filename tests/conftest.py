from __future__ import annotations

import atexit
import compileall
import contextlib
import functools
import hashlib
import io
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from accelify.runtime.launch import forking, leftovers

if TYPE_CHECKING:
    from accelify.lint.engine import FileResult

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
    process = start(command, cwd=cwd, env=env)
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


#: Set to 1 to start every run the tests make as a fresh process (none forked: `start`)
FRESH_PROCESSES = os.environ.get("ACCELIFY_TEST_FRESH_PROCESSES") == "1"
FORK_SERVER = Path(__file__).with_name("fork_server.py")
#: Variables that tests set per test and that nothing reads as Python or torch start: a run
#: whose environment differs from the fork server's in these only may be forked from it
PER_TEST_VARIABLES = (
    "ACCELIFY_",
    "XDG_CONFIG_HOME",
    "DS_ACCELERATOR",
    "TORCH_EXTENSIONS_DIR",
    "PYTEST_",
    "SLURM_",
    # set in the test process by what it imports (torch._inductor.config, DeepSpeed), read
    # lazily by what compiles or starts CUDA, never as torch starts; a fork gets them exactly
    "TORCHINDUCTOR_CACHE_DIR",
    "PYTORCH_NVML_BASED_CUDA_CHECK",
)
#: The environment the test process started with, before any test set a variable of its own
#: (monkeypatch) or an import set one: the fork server's, whenever it is first asked for
START_ENVIRONMENT = dict(os.environ)


def start(
    command: list[str], cwd: Path | None, env: dict[str, str] | None
) -> subprocess.Popen[str] | ForkedRun:
    """Start ``command`` in a session of its own, its stdout and stderr piped as text. A launch
    (`python -m accelify launch ...`), and a script that imports torch before any statement of
    its own, start as forks of one process per test process that imported torch once
    (tests/fork_server.py), set up as a fresh process: the launcher imports torch first thing
    anyway, and so does such a script, with the same environment; the ranks a launch starts
    are fresh processes, as always. That saves about 2 CPU-seconds per run (1.5 measured per
    run in test_convert_e2e, under load), a third of a 2-rank launch's; a script's run that
    builds an optimizer saves 2.2 more (torch._dynamo imported, and the server's objects frozen
    so that no run copies them as it exits: tests/fork_server.py). Anything else, or any other
    environment, is a fresh process; so is every run with ACCELIFY_TEST_FRESH_PROCESSES=1.
    What a fork does not give: a warning torch or torch._dynamo prints as it is imported is
    printed once, by the fork server, not by each run."""
    environment = dict(os.environ if env is None else env)
    if _forkable(command, cwd, environment):
        server = _fork_server()
        if server is not None:
            forked = server.start(command, cwd, environment)
            if forked is not None:
                return forked
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _forkable(command: list[str], cwd: Path | None, env: dict[str, str]) -> bool:
    if FRESH_PROCESSES or not sys.platform.startswith("linux") or len(command) < 2:
        return False
    if command[0] != sys.executable:
        return False
    if command[1:4] != ["-m", "accelify", "launch"]:
        script = Path(cwd or ".", command[1])
        if script.suffix != ".py" or not forking.imports_torch_first(script):
            return False
    server = _fork_server()
    return server is not None and server.same_start(env)


class ForkServer:
    """tests/fork_server.py, started once per test process; it ends when this process ends
    (its stdin closes)."""

    def __init__(self) -> None:
        self.environment = dict(START_ENVIRONMENT)
        leftovers.sweep()  # what test processes killed before their exit handlers left
        self.folder = tempfile.mkdtemp(prefix=leftovers.prefix("forks"))
        self.path = os.path.join(self.folder, "socket")
        self.process = subprocess.Popen(
            [sys.executable, str(FORK_SERVER), self.path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.environment,
            start_new_session=True,
        )
        self.ready = self.process.stdout.readline() == b"ready\n"
        atexit.register(self.close)

    def same_start(self, env: dict[str, str]) -> bool:
        """Whether ``env`` is the server's but for per-test variables."""
        names = {*env, *self.environment}
        return all(
            env.get(name) == self.environment.get(name)
            for name in names
            if not name.startswith(PER_TEST_VARIABLES)
        )

    def start(self, command: list[str], cwd: Path | None, env: dict[str, str]) -> ForkedRun | None:
        """None: the server is gone (the run is then started fresh)."""
        request = {"argv": command[1:], "cwd": str(Path(cwd or ".").resolve()), "env": env}
        message = json.dumps(request).encode() + b"\n"
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            connection.connect(self.path)
            sent = socket.send_fds(connection, [message], [_stdin(), out_write, err_write])
            connection.sendall(message[sent:])
            return ForkedRun(command, connection, out_read, err_read)
        except (OSError, ValueError):
            connection.close()
            for fd in (out_read, err_read):
                os.close(fd)
            return None
        finally:
            for fd in (out_write, err_write):
                os.close(fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


def _stdin() -> int:
    """This process's stdin, which a fresh process inherits (/dev/null when it is closed)."""
    try:
        os.fstat(0)
        return 0
    except OSError:
        return os.open(os.devnull, os.O_RDONLY)


_server: ForkServer | None = None
_server_lock = threading.Lock()


def _fork_server() -> ForkServer | None:
    global _server
    with _server_lock:
        if _server is None:
            _server = ForkServer()
        return _server if _server.ready and _server.process.poll() is None else None


class ForkedRun:
    """A run the fork server started, with what the tests use of `subprocess.Popen`: ``pid``
    (its session's), ``stdout`` and ``stderr`` (text), ``wait`` and ``communicate``."""

    def __init__(
        self, args: list[str], connection: socket.socket, out_fd: int, err_fd: int
    ) -> None:
        self.args = args
        self.returncode: int | None = None
        # text in the locale's encoding, as Popen's text=True; closed by `_read_all`
        self.stdout = open(out_fd)  # noqa: SIM115
        self.stderr = open(err_fd)  # noqa: SIM115
        self._connection = connection
        self._buffer = b""
        self._read: dict[str, str] = {}
        self._readers: list[threading.Thread] = []
        self.pid = int(self._line(timeout=120))  # the server answers as it forks

    def _line(self, timeout: float | None) -> str:
        self._connection.settimeout(timeout)
        while b"\n" not in self._buffer:
            try:
                data = self._connection.recv(64)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            if not data:
                raise RuntimeError(f"the fork server ended while running {self.args}")
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = int(self._line(timeout))
            self._connection.close()
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """As `subprocess.Popen.communicate`: both streams to their end, then the exit."""
        if not self._readers:
            for name, stream in (("stdout", self.stdout), ("stderr", self.stderr)):
                reader = threading.Thread(target=self._read_all, args=(name, stream), daemon=True)
                reader.start()
                self._readers.append(reader)
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            reader.join(None if deadline is None else max(deadline - time.monotonic(), 0))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(deadline - time.monotonic(), 0.01))
        return self._read["stdout"], self._read["stderr"]

    def _read_all(self, name: str, stream: io.TextIOWrapper) -> None:
        with stream:
            self._read[name] = stream.read()


def seconds_after_line(
    command: list[str], marker: str, cwd: Path | None, timeout: float, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], float | None]:
    """Run as `run_in_own_group`, and time from the first stderr line that holds ``marker``
    (printed by the script when the thing timed begins) to the process's end (None: never
    printed). A bound on a run's whole time also counts how long the ranks took to import torch
    and meet, which grows with the machine's load; timed from the script's own line, it counts
    only what the launcher does about it."""
    result, _, after = seconds_around_line(command, marker, cwd, timeout, env)
    return result, after


def seconds_around_line(
    command: list[str], marker: str, cwd: Path | None, timeout: float, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], float | None, float | None]:
    """`seconds_after_line`, and also the seconds from the run's start to that line (None:
    never printed): how long the run took to get there on this machine at this load."""
    begun = time.monotonic()
    process = start(command, cwd=cwd, env=env)
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
    if seen is None:
        return result, None, None
    return result, seen - begun, ended - seen


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
) -> tuple[subprocess.CompletedProcess[str], float | None, float | None]:
    """`launch` on 2 ranks, timed from its start to the script's ``marker`` line on stderr and
    from that line to the end (`seconds_around_line`)."""
    command = [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", "2", str(script)]
    return seconds_around_line(command, marker, cwd=cwd, timeout=timeout, env=dict(os.environ))


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


def case_group(case: Path) -> str:
    """The pytest-xdist group of a golden conversion's tests (fixtures/convert/<case>/), of
    every file that has them: one worker runs them all, with what it cached for the case."""
    return f"convert-{case.name}"


@functools.lru_cache(maxsize=8)
def lint_every_rule(data: bytes, path: str) -> FileResult:
    """`lint_source` of ``data`` with every rule selected, kept for the next test that asks for
    the same file: test_convert_fixtures and test_lint_reach both lint each golden's after.py
    so, in one xdist group per case (one worker runs the case's tests one after another), and
    it is linted once, not twice (about 12 CPU-seconds of the suite). Read only: a test must
    not change the result."""
    from accelify.lint.engine import lint_source
    from accelify.lint.selection import Selection

    return lint_source(data, path, Selection(select=["ACC"]))


#: Numbers the folders `_own_folder` makes in this process
_FOLDERS_MADE = itertools.count()


def _own_folder(factory: pytest.TempPathFactory, name: str) -> Path:
    """A new, empty folder under this session's base temporary folder. `mktemp` lists every
    folder it made so far to find its next number: twice per test, that was quadratic in the
    tests a worker ran (25 CPU-seconds for 3400 tests, measured), and every `tmp_path` after
    listed these folders too."""
    folder = factory.getbasetemp() / "own" / f"{name}{next(_FOLDERS_MADE)}"
    folder.mkdir(parents=True)
    return folder


@pytest.fixture(autouse=True, scope="session")
def _no_user_config_in_shared_fixtures(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """The same isolation as `_no_user_config`, for the whole session: a module-scoped fixture
    (the runs several tests share: `test_distributed_runtime`'s straight run,
    `test_engines`' converted run) is set up before any function-scoped fixture of its first
    test, and its launch read the developer's config and variables. Session-scoped autouse
    fixtures are set up before every fixture of a narrower scope."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _isolate(tmp_path_factory, monkeypatch)
        yield


@pytest.fixture(autouse=True)
def _no_user_config(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tests never read the developer's ~/.config/accelify/config.yaml: each test its own empty
    config folder and lint cache (the session's, `_no_user_config_in_shared_fixtures`, is
    shared by the fixtures of wider scope)."""
    _isolate(tmp_path_factory, monkeypatch)


def _isolate(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(_own_folder(tmp_path_factory, "xdg")))
    if shutil.which("nvidia-smi") is None:
        # HF Accelerate imports DeepSpeed when it is installed, and DeepSpeed then prints a
        # "Setting accelerator to CPU" warning on stdout; on a machine without GPUs, say it first.
        monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    for name in list(os.environ):
        # SLURM_*: a suite run inside a Slurm job must not place its launches on the job's nodes
        if name.startswith(("ACCELIFY_", "SLURM_")):
            monkeypatch.delenv(name)
    # `accelify lint` caches its findings: in the test's own folder, never in the checkout
    monkeypatch.setenv("ACCELIFY_CACHE_DIR", str(_own_folder(tmp_path_factory, "lint_cache")))
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


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, before it starts any worker
        compile_sources()


def compile_sources() -> None:
    """Byte-compile the three source folders once, before any test starts a process, as
    .ci/run does before pytest. Where PYTHONDONTWRITEBYTECODE is set (this machine, CI's), no
    process writes the bytecode it compiles, and each of the suite's processes (CLI runs,
    launchers, ranks, verify's runs) compiled every accelify module it imports again: 0.45
    CPU-seconds of an `accelify lint` or `convert` run, 0.4 of a rank's start (measured, 3
    rounds each way). compileall writes whatever is missing or stale whatever that variable
    says; every process then reads it. Sources unchanged since are only looked at (stat). A
    folder it cannot write (a read-only checkout) is left as it is, silently: the runs then
    compile as before, and a syntax error is the tests' to report."""
    for folder in ("accelify", "rules", "runtime"):
        compileall.compile_dir(ROOT / folder, quiet=2)


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
