"""Experiment trackers behind ``Accelerator(log_with=...)``, with HF Accelerate's names and
semantics: ``init_trackers`` starts them and stores the run's config, ``log`` records values at a
step, ``end_training`` finishes them, all on the main process only (the other ranks would log
the same run N times).

TensorBoard and Weights & Biases are driven here (their packages imported when a tracker
starts); any other tracker is a `GeneralTracker` subclass instance given in ``log_with``. The
other names Accelerate knows (``comet_ml``, ``aim``, ``mlflow``, ``clearml``, ``dvclive``...) are
refused with that advice rather than silently logging nowhere.
"""

from __future__ import annotations

import enum
import importlib.util
import numbers
import os
from pathlib import Path
from typing import Any


class LoggerType(str, enum.Enum):
    ALL = "all"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    AIM = "aim"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"
    TRACKIO = "trackio"


class GeneralTracker:
    """A tracker: subclass it for one accelify does not drive, and pass an instance in
    ``log_with``. ``name`` is what `Accelerator.get_tracker` finds it by."""

    name = "general"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, _blank: bool = False) -> None:
        self._blank = _blank  # the stand-in `get_tracker` returns on the other ranks

    @property
    def tracker(self) -> Any:
        return None

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        pass

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        pass

    def finish(self) -> None:
        pass


class TensorBoardTracker(GeneralTracker):
    """Event files under ``<logging_dir>/<project_name>``: numbers as scalars, strings as text,
    dicts of numbers as grouped scalars; the config as hyperparameters (and ``hparams.yml``)."""

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__()
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise ImportError(
                "log_with='tensorboard' needs the tensorboard package: pip install tensorboard"
            ) from error
        self.logging_dir = Path(logging_dir) / run_name
        self.writer = SummaryWriter(str(self.logging_dir), **kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        import yaml

        hparams = {key: _hparam(value) for key, value in values.items()}
        self.writer.add_hparams(hparams, metric_dict={})
        self.writer.flush()
        (self.logging_dir / "hparams.yml").write_text(yaml.safe_dump(hparams))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in values.items():
            if isinstance(value, numbers.Number) or _is_scalar_tensor(value):
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, value, global_step=step, **kwargs)
            else:
                raise TypeError(
                    f"tensorboard cannot log {key!r} of type {type(value).__name__}: log numbers, "
                    "strings or dicts of numbers (images through get_tracker('tensorboard'))"
                )
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


class WandBTracker(GeneralTracker):
    """A Weights & Biases run named for the project (``WANDB_MODE=offline`` works offline)."""

    name = "wandb"

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        import wandb

        self.run = wandb.init(project=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.config.update(values, allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(values, step=step, **kwargs)

    def finish(self) -> None:
        self.run.finish()


DRIVEN: dict[str, tuple[type[GeneralTracker], str]] = {
    "tensorboard": (TensorBoardTracker, "tensorboard"),
    "wandb": (WandBTracker, "wandb"),
}


def requested(log_with: Any) -> list[str | GeneralTracker]:
    """``log_with`` as a list of tracker names and instances, checked now (at construction, as
    HF does) so that a typo fails before training, not at ``init_trackers``."""
    if log_with is None:
        return []
    items = log_with if isinstance(log_with, (list, tuple)) else [log_with]
    found: list[str | GeneralTracker] = []
    for item in items:
        if isinstance(item, GeneralTracker):
            found.append(item)
            continue
        name = item.value if isinstance(item, LoggerType) else str(item).lower()
        if name == "all":
            found += [n for n, (_, package) in DRIVEN.items() if _installed(package)]
            continue
        if name not in DRIVEN:
            known = ", ".join(sorted(t.value for t in LoggerType if t is not LoggerType.ALL))
            if name in known.split(", "):
                raise ValueError(
                    f"log_with={name!r}: accelify's runtime drives tensorboard and wandb; for "
                    f"{name}, pass an instance of a GeneralTracker subclass that calls it"
                )
            raise ValueError(f"log_with={name!r} is not a tracker (known: {known})")
        if not _installed(DRIVEN[name][1]):
            raise ImportError(f"log_with={name!r} needs its package: pip install {DRIVEN[name][1]}")
        found.append(name)
    return list(dict.fromkeys(found))


def start(
    wanted: list[str | GeneralTracker],
    project_name: str,
    logging_dir: str | None,
    init_kwargs: dict[str, dict[str, Any]],
) -> list[GeneralTracker]:
    trackers: list[GeneralTracker] = []
    for item in wanted:
        if isinstance(item, GeneralTracker):
            trackers.append(item)
            continue
        tracker_class, _ = DRIVEN[item]
        options = init_kwargs.get(item, {})
        if tracker_class.requires_logging_directory:
            if logging_dir is None:
                raise ValueError(
                    f"the {item} tracker writes files: give Accelerator(project_dir=...) or "
                    "project_config=ProjectConfiguration(logging_dir=...)"
                )
            trackers.append(tracker_class(project_name, logging_dir, **options))
        else:
            trackers.append(tracker_class(project_name, **options))
    return trackers


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def _hparam(value: Any) -> Any:
    """TensorBoard takes numbers, strings and booleans as hyperparameters; the rest as text."""
    if isinstance(value, (bool, int, float, str)) or _is_scalar_tensor(value):
        return value
    return str(value)


def _is_scalar_tensor(value: Any) -> bool:
    return type(value).__name__ == "Tensor" and getattr(value, "ndim", None) == 0


class TrackerMethods:
    """Mixed into `Accelerator`: its tracker methods, all on the main process only."""

    is_main_process: bool
    log_with: list[str | GeneralTracker]
    trackers: list[GeneralTracker]
    logging_dir: Path | None

    def init_trackers(
        self,
        project_name: str,
        config: dict[str, Any] | None = None,
        init_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        if not self.is_main_process:
            return
        logging_dir = None if self.logging_dir is None else str(self.logging_dir)
        self.trackers = start(self.log_with, project_name, logging_dir, init_kwargs or {})
        if config is not None:
            for tracker in self.trackers:
                tracker.store_init_configuration(config)

    def log(
        self,
        values: dict[str, Any],
        step: int | None = None,
        log_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        if not self.is_main_process:
            return
        for tracker in self.trackers:
            tracker.log(values, step=step, **(log_kwargs or {}).get(tracker.name, {}))

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (its own object with ``unwrap``); on the other ranks a
        stand-in that does nothing, so that tracker code needs no main-process guard."""
        if not self.is_main_process:
            return GeneralTracker(_blank=True)
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        started = [tracker.name for tracker in self.trackers]
        raise ValueError(f"no tracker {name!r}; init_trackers started {started}")
