"""The package as users get it: the sdist and the wheel built from it (as a release is built), the
wheel installed without -e into fresh venvs and run from outside the checkout; and the pre-commit
hooks consumed from a repository and a rev (pip building the checkout itself).

The static install (what `pip install accelify` and the pre-commit hook environment get) has no
torch; the run side borrows this test environment's torch through a .pth file, so accelify itself
always comes from the wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from accelify import __version__
from accelify.lint.registry import all_codes
from conftest import FIXTURES, ROOT, assert_ok, run_in_own_group

# One pytest-xdist worker runs this module: its tests share module fixtures
# (the wheel and sdist, built once).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("packaging")]

BAD = "import torch\nfrom accelify import Accelerator\naccelerator = Accelerator()\n" + (
    "model = accelerator.prepare(torch.nn.Linear(2, 1))\nloss = model(torch.ones(1, 2)).sum()\n"
    "loss.backward()\n"
)


def _source_modules() -> set[str]:
    """Every module of the three source folders, by the name it installs under."""
    folders = {"accelify": "accelify", "rules": "accelify/rules", "runtime": "accelify/runtime"}
    return {
        f"{package}/{path.relative_to(ROOT / folder)}"
        for folder, package in folders.items()
        for path in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    }


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, and the wheel built from it (`python -m build`'s default, as a release is
    built): what `pip install accelify` and `pip install accelify-*.tar.gz` install. A wheel
    built from the checkout itself (`pip install .`) is what the pre-commit test installs."""
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "-o", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def _fresh_venv(path: Path, python: str = sys.executable) -> Path:
    """A venv without pip of its own: `_pip_install` installs into it with this environment's
    pip. ensurepip's install of pip into each venv took 3.4 CPU-seconds (18 s on a loaded
    machine), for a tool the installed package never uses."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin"


def _pip_install(bin_dir: Path, *targets: str | Path) -> None:
    """``pip install`` into the venv of ``bin_dir``: this environment's pip run by the venv's
    interpreter (``pip --python``), so the install is the venv's own, as its pip would make it
    (its site-packages, its scripts' interpreter)."""
    pip = [sys.executable, "-m", "pip", "--python", str(bin_dir / "python")]
    result = subprocess.run(
        [*pip, "install", "--quiet", *map(str, targets)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _run(bin_dir: Path, *args: str | Path, cwd: Path, timeout: float = 240):
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    command = [str(bin_dir / args[0]), *map(str, args[1:])]
    return run_in_own_group(command, cwd=cwd, timeout=timeout, env=environment)


def _borrow_torch(bin_dir: Path) -> None:
    """Make this environment's torch (numpy, safetensors, deepspeed) importable in the venv."""
    site = Path(
        subprocess.check_output(
            [
                str(bin_dir / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            text=True,
        ).strip()
    )
    ours = sysconfig.get_paths()["purelib"]
    (site / "borrowed_runtime.pth").write_text(ours + "\n")


def test_the_wheel_built_from_the_sdist_holds_every_source_module(dist: Path):
    """A module the sdist leaves out is missing from this wheel too."""
    assert next(dist.glob("accelify-*.tar.gz")).name == f"accelify-{__version__}.tar.gz"
    wheel = next(dist.glob("accelify-*.whl"))
    assert wheel.name.startswith(f"accelify-{__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert _source_modules() - names == set()


def test_the_installed_wheel_converts_lints_verifies_and_launches(dist: Path, tmp_path: Path):
    bin_dir = _fresh_venv(tmp_path / "venv")
    _pip_install(bin_dir, next(dist.glob("accelify-*.whl")))
    work = tmp_path / "outside"  # not the checkout: nothing can come from the source tree
    work.mkdir()
    shutil.copy(FIXTURES / "scripts" / "mnist_helpers.py", work / "train.py")
    (work / "bad.py").write_text(BAD)

    version = _run(bin_dir, "accelify", "--version", cwd=work)
    assert_ok(version)
    assert version.stdout.strip().startswith(f"accelify {__version__} (torch not installed")

    converted = _run(bin_dir, "accelify", "convert", "train.py", "-o", "train_acc.py", cwd=work)
    assert_ok(converted)
    assert "accelerator.prepare(" in (work / "train_acc.py").read_text()
    assert_ok(_run(bin_dir, "accelify", "lint", "train_acc.py", cwd=work))
    bad = _run(bin_dir, "accelify", "lint", "bad.py", cwd=work)
    assert bad.returncode == 1 and "ACC301" in bad.stdout
    listed = _run(bin_dir, "accelify", "rules", cwd=work).stdout  # the catalog walked installed
    assert [line.split()[0] for line in listed.splitlines() if line.startswith("ACC")] == list(
        all_codes()
    )

    # Without torch the run side says what to install, instead of a traceback.
    refused = _run(bin_dir, "accelify", "launch", "--cpu", "-n", "2", "train_acc.py", cwd=work)
    assert refused.returncode == 2
    assert "pip install 'accelify[runtime]'" in refused.stderr and "Traceback" not in refused.stderr
    imported = _run(bin_dir, "python", "-c", "from accelify import Accelerator", cwd=work)
    assert imported.returncode == 1
    assert "ModuleNotFoundError: accelify's runtime needs torch" in imported.stderr
    assert "pip install 'accelify[runtime]'" in imported.stderr
    assert_ok(_run(bin_dir, "accelify", "env", cwd=work))

    _borrow_torch(bin_dir)
    where = _run(bin_dir, "python", "-c", "import accelify; print(accelify.__file__)", cwd=work)
    assert str(tmp_path / "venv") in where.stdout, "accelify must come from the installed wheel"
    launched = _run(bin_dir, "accelify", "launch", "--cpu", "-n", "2", "train_acc.py", cwd=work)
    assert_ok(launched)
    assert "Test set: Average loss" in launched.stdout
    verified = _run(bin_dir, "accelify", "verify", "train.py", "--steps", "2", cwd=work)
    assert_ok(verified)


def _oldest_python() -> str | None:
    """An interpreter of the oldest Python that pyproject.toml admits (3.10), if this machine
    has one: on PATH, or through pyenv."""
    found = shutil.which("python3.10")
    if found and subprocess.run([found, "-c", ""], capture_output=True).returncode == 0:
        return found
    if shutil.which("pyenv"):
        prefix = subprocess.run(["pyenv", "prefix", "3.10"], capture_output=True, text=True)
        candidate = Path(prefix.stdout.strip()) / "bin" / "python3.10"
        if prefix.returncode == 0 and candidate.is_file():
            return str(candidate)
    return None


@pytest.mark.skipif(_oldest_python() is None, reason="no Python 3.10 on this machine")
def test_the_static_tools_run_on_python_3_10(dist: Path, tmp_path: Path):
    python = _oldest_python()
    assert python is not None
    bin_dir = _fresh_venv(tmp_path / "venv", python)
    _pip_install(bin_dir, next(dist.glob("accelify-*.whl")))
    (tmp_path / "bad.py").write_text(BAD)
    (tmp_path / "pyproject.toml").write_text('[tool.accelify]\nignore = ["ACC2"]\n')
    result = _run(bin_dir, "accelify", "lint", "bad.py", cwd=tmp_path)
    assert result.returncode == 1 and "ACC301" in result.stdout, result.stderr
    converted = _run(
        bin_dir, "accelify", "convert", FIXTURES / "scripts" / "mnist_helpers.py", cwd=tmp_path
    )
    assert_ok(converted)


def _project_repository(destination: Path) -> Path:
    """This checkout's files (committed or not, as git would see them) as a repository with a
    release tag, the shape pre-commit clones."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)
    _git(destination, "init", "-q")
    _git(destination, "add", "-A")
    _git(destination, "commit", "-qm", "release")
    _git(destination, "tag", f"v{__version__}")
    return destination


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    identity = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    return subprocess.run(
        ["git", *identity, *args], cwd=cwd, check=True, capture_output=True, text=True
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="pre-commit needs git")
def test_pre_commit_hooks_from_a_tag_install_without_torch_and_catch_a_bug(tmp_path: Path):
    pre_commit = Path(sys.executable).with_name("pre-commit")
    project = _project_repository(tmp_path / "accelify")
    user = tmp_path / "user"
    user.mkdir()
    (user / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {project}\n  rev: v{__version__}\n  hooks:\n"
        "  - id: accelify-lint\n  - id: accelify-convert-check\n"
    )
    _git(user, "init", "-q")
    (user / "train.py").write_text(BAD)
    _git(user, "add", "-A")
    environment = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache")}
    run = [str(pre_commit), "run", "--all-files", "--color", "never"]

    rejected = subprocess.run(run, cwd=user, env=environment, capture_output=True, text=True)
    assert rejected.returncode == 1, rejected.stdout + rejected.stderr
    assert "train.py:6:1: ACC301" in rejected.stdout

    shutil.copy(FIXTURES / "examples" / "classify.py", user / "train.py")
    _git(user, "add", "-A")
    accepted = subprocess.run(run, cwd=user, env=environment, capture_output=True, text=True)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr

    hook_environments = list((tmp_path / "cache").glob("repo*/py_env-*"))
    assert hook_environments, "pre-commit built no environment for the hooks"
    for environment_dir in hook_environments:
        assert not list(environment_dir.glob("lib/python*/site-packages/torch")), "torch installed"
        assert list(environment_dir.glob("lib/python*/site-packages/accelify/lint"))
