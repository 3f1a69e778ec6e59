"""What a user's first `pre-commit run` costs: installing accelify's hook environment.

    python bench/precommit_install.py [--rounds 3]

Clones this repository's committed HEAD (tagged as a release, the way users name a `rev:`),
points a fresh user repository's `.pre-commit-config.yaml` at it, and times `pre-commit
install-hooks` with an empty PRE_COMMIT_HOME each round: what pre-commit does on a user's
machine the first time (clone, new virtualenv, `pip install` of accelify and its dependencies
from the package index, with pip's cache as the user has it). Prints the median time, the size
of the environment on disk, and whether torch got in. Targets: under 30 s and 50 MB.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IDENTITY = ["-c", "user.name=bench", "-c", "user.email=bench@localhost"]


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *IDENTITY, *args], cwd=cwd, check=True, capture_output=True)


def size_mb(path: Path) -> float:
    return (
        sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) / 1e6
    )


def one_round(
    work: Path, project: Path, version: str, pre_commit: str
) -> tuple[float, float, bool]:
    user, home = work / "user", work / "home"
    shutil.rmtree(user, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)
    user.mkdir()
    git(user, "init", "-q")
    (user / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {project}\n  rev: v{version}\n  hooks:\n"
        "  - id: accelify-lint\n  - id: accelify-convert-check\n"
    )
    environment = {**os.environ, "PRE_COMMIT_HOME": str(home)}
    started = time.monotonic()
    subprocess.run([pre_commit, "install-hooks"], cwd=user, env=environment, check=True)
    elapsed = time.monotonic() - started
    hook_environments = list(home.glob("repo*/py_env-*"))
    has_torch = any(list(env.glob("lib/python*/site-packages/torch")) for env in hook_environments)
    return elapsed, sum(size_mb(env) for env in hook_environments), has_torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    pre_commit = shutil.which("pre-commit") or str(Path(sys.executable).with_name("pre-commit"))
    sys.path.insert(0, str(ROOT))
    from accelify import __version__

    with tempfile.TemporaryDirectory(prefix="accelify-precommit-") as folder:
        work = Path(folder)
        project = work / "accelify"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(project)], check=True)
        git(project, "tag", "-f", f"v{__version__}")
        results = [one_round(work, project, __version__, pre_commit) for _ in range(options.rounds)]
    times = [elapsed for elapsed, _, _ in results]
    print(f"pre-commit install-hooks, first run, {options.rounds} rounds (accelify {__version__})")
    median, fastest, slowest = statistics.median(times), min(times), max(times)
    print(f"  time: median {median:.1f} s (min {fastest:.1f}, max {slowest:.1f})")
    print(f"  hook environment on disk: {results[-1][1]:.1f} MB")
    print(f"  torch installed: {'yes' if any(torch for _, _, torch in results) else 'no'}")


if __name__ == "__main__":
    main()
