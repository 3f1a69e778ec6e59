"""`ProjectConfiguration`: where a run keeps its checkpoints and logs, with HF Accelerate's names.

``automatic_checkpoint_naming`` makes ``save_state()`` write
``<project_dir>/checkpoints/checkpoint_<iteration>`` and count ``iteration`` up; ``total_limit``
keeps only that many of them (the oldest go, on the main process, before the next is written).
``load_state()`` without a directory reads the newest and continues the count after it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ProjectConfiguration:
    project_dir: str | None = None
    logging_dir: str | None = None  # default: project_dir
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def __post_init__(self) -> None:
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        if self.total_limit is not None and self.total_limit < 1:
            raise ValueError(f"total_limit must be at least 1, got {self.total_limit}")

    def set_directories(self, project_dir: str | os.PathLike[str] | None = None) -> None:
        """HF's name: the project directory, and the logging directory with it unless set."""
        self.project_dir = None if project_dir is None else str(project_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir

    @property
    def checkpoints_dir(self) -> Path | None:
        return None if self.project_dir is None else Path(self.project_dir) / "checkpoints"


def numbered_checkpoints(folder: Path) -> list[Path]:
    """``checkpoint_<n>`` directories in ``folder``, oldest (lowest ``n``) first."""
    if not folder.is_dir():
        return []
    found = [
        path
        for path in folder.iterdir()
        if path.is_dir() and path.name.startswith("checkpoint_") and path.name[11:].isdigit()
    ]
    return sorted(found, key=lambda path: int(path.name[11:]))


def checkpoint_to_write(
    config: ProjectConfiguration, output_dir: str | os.PathLike[str] | None, is_main_process: bool
) -> Path:
    """Where `save_state` writes: ``output_dir``, or the next numbered checkpoint of the project
    (counting ``iteration`` up, and pruning to ``total_limit`` on the main process)."""
    if output_dir is not None and not config.automatic_checkpoint_naming:
        return Path(output_dir)
    folder = config.checkpoints_dir
    if folder is None:
        raise ValueError(
            "save_state() needs an output_dir, or a project directory to number checkpoints in "
            "(Accelerator(project_dir=...) or ProjectConfiguration(project_dir=...))"
        )
    if is_main_process and config.total_limit is not None:
        existing = numbered_checkpoints(folder)
        for old in existing[: max(len(existing) + 1 - config.total_limit, 0)]:
            shutil.rmtree(old)
    target = folder / f"checkpoint_{config.iteration}"
    config.iteration += 1
    return target


def latest_checkpoint(config: ProjectConfiguration) -> Path:
    """The newest numbered checkpoint; the count goes on after it."""
    folder = config.checkpoints_dir
    if folder is None:
        raise ValueError("load_state() needs an input_dir when no project directory was given")
    found = numbered_checkpoints(folder)
    if not found:
        raise FileNotFoundError(f"no checkpoint_* directory in {folder}")
    config.iteration = int(found[-1].name[11:]) + 1
    return found[-1]
