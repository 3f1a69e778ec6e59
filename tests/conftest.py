from __future__ import annotations

import os
import subprocess
import sys
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
    return subprocess.run(
        [sys.executable, "-m", "accelify", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
    )


def launch(
    script: Path, *args: str | os.PathLike[str], processes: int = 2, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    return run_accelify("launch", "--cpu", "-n", str(processes), script, *args, **kwargs)


def run_python(
    script: Path, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=cwd, capture_output=True, text=True, timeout=240
    )


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
    for name in list(os.environ):
        if name.startswith("ACCELIFY_"):
            monkeypatch.delenv(name)
