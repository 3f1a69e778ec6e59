"""The probe: ``python -m accelify.verify.probe SCRIPT [ARGS...]`` runs SCRIPT unmodified as
``__main__`` and records, for every optimizer step, the losses passed to backward since the
previous step and a fingerprint of the stepped parameters (one fp32 norm per tensor). After
the configured number of steps it stops the script.

It uses torch's global entry points only: the optimizer step post-hook that every optimizer
calls, and ``torch.autograd.backward``, which ``Tensor.backward`` calls. Nothing in the user's
code is touched. Records are written one JSON line per step and flushed, so the parent can see
how far each rank got even when it has to kill a hung run.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import runpy
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from accelify.verify.loader_passes import LoaderPasses
from accelify.verify.records import (
    ENV_DEADLINE,
    ENV_OUT,
    ENV_PATH,
    ENV_SEED,
    ENV_STEPS,
    PROBE_FAILED,
    STOPPED_AT_DEADLINE,
    hang_marker,
    passes_file,
    record_file,
)


class StepLimitReached(BaseException):
    """Raised from the step hook to end the script; a BaseException so that the script's own
    ``except Exception`` does not swallow it."""


class Probe:
    def __init__(self, script: Path, out: Path, steps: int) -> None:
        self.script = str(script)
        self.steps = steps
        self.step = 0
        self.losses: list[float] = []
        self.backward_line: int | None = None
        # by the object, not its id(): an optimizer a helper made and dropped (an LR finder's, a
        # warm-up's) frees its id for the next one, which would pass for the same optimizer
        self.optimizers: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = (
            weakref.WeakKeyDictionary()
        )
        self.optimizers_seen = 0
        self.made = OptimizersMade(self._script_line)
        self.folder = project_folder(script)
        self.passes = LoaderPasses(
            self.script, self._project_place, self.made.snapshot, self._label
        )
        #: whether a file (as a code object names it) is one of the project's, by name
        self._in_project: dict[str, bool] = {self.script: True}
        out.parent.mkdir(parents=True, exist_ok=True)
        self.stream = out.open("w", buffering=1, encoding="utf-8")

    def install(self) -> None:
        register_optimizer_step_post_hook(self.after_step)
        self.made.install()
        self.passes.install()
        entry = torch.autograd.backward

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            self.before_backward(tensors)
            return entry(tensors, *args, **kwargs)

        torch.autograd.backward = backward

    def before_backward(self, tensors: Any) -> None:
        self.passes.backward += 1
        first = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
        if isinstance(first, torch.Tensor) and first.numel() == 1:
            self.losses.append(float(first.detach().double()))
            self.backward_line = self._script_line()

    def after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.step += 1
        index = self.optimizers.get(optimizer)
        if index is None:
            index = self.optimizers[optimizer] = self.optimizers_seen
            self.optimizers_seen += 1
        with torch.no_grad():
            params = [p for group in optimizer.param_groups for p in group["params"]]
            # In float64: exact for every floating dtype a model has (bf16 to double).
            norms = [float(torch.linalg.vector_norm(p.double())) for p in params]
        made = self.made.stepped(optimizer)
        record = {
            "step": self.step,
            "optimizer": index,
            "losses": self.losses,
            "params": norms,
            "step_line": self._script_line(),
            "backward_line": self.backward_line,
            "made": made,
            "lrs": learning_rates(optimizer),
        }
        self.stream.write(json.dumps(record) + "\n")
        self.losses = []
        if self.steps and self.step >= self.steps:  # 0: run to the end
            raise StepLimitReached

    def _script_line(self) -> int | None:
        """The line of the script that is running now (the innermost frame in the script)."""
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_filename == self.script:
                return frame.f_lineno
            frame = frame.f_back
        return None

    def _project_place(self) -> FrameType | None:
        """The frame of the project that is running now: the innermost one in the script or in
        a module of its project (`in_project`)."""
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            name = frame.f_code.co_filename
            inside = self._in_project.get(name)
            if inside is None:
                inside = self._in_project[name] = in_project(name, self.folder)
            if inside:
                return frame
            frame = frame.f_back
        return None

    def _label(self, file: str) -> str:
        if file == self.script:
            return ""
        try:
            return str(Path(file).resolve().relative_to(self.folder))
        except ValueError:
            return file


def project_folder(script: Path) -> Path:
    """The folder of the project's modules: where the script's imports are found."""
    return Path(os.environ.get(ENV_PATH) or script.parent).resolve()


def in_project(file: str, folder: Path) -> bool:
    """``file`` is a module of the project in ``folder``: under it, and no installed library's
    (a virtual environment kept in the project's folder) nor accelify's own (its runtime runs
    the prepared loaders' loops)."""
    if not file.endswith(".py") or "site-packages" in file or "dist-packages" in file:
        return False
    try:
        path = Path(file).resolve()
    except (OSError, RuntimeError):
        return False
    if not path.is_relative_to(folder):
        return False
    own = Path(__file__).resolve().parents[1]  # accelify's package
    runtime = _runtime_folder()
    # an environment kept in the project's folder (``.venv/``), not one the project is in
    environments = {
        prefix
        for prefix in (Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve())
        if prefix.is_relative_to(folder) and prefix != folder
    }
    return not (
        path.is_relative_to(own)
        or (runtime is not None and path.is_relative_to(runtime))
        or any(path.is_relative_to(prefix) for prefix in environments)
    )


@functools.cache
def _runtime_folder() -> Path | None:
    """Where accelify's runtime lives (an editable install maps it from another folder)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("accelify.runtime")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).resolve().parent


def learning_rates(optimizer: torch.optim.Optimizer) -> list[float]:
    """Each param group's learning rate (a tensor where the optimizer keeps it as one; NaN
    where it is none: Adafactor's relative step keeps ``lr=None``)."""
    return [_number(group.get("lr")) for group in optimizer.param_groups]


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return math.nan


class OptimizersMade:
    """Every optimizer the script makes, numbered in the order they are made, with the script's
    line that made it and how many steps it has taken. An optimizer exists before it first
    steps: the learning rates at the start of the first pass over the data are recorded too.
    Wrappers that run no optimizer constructor (a prepared optimizer) are not counted: their
    steps are their inner optimizer's."""

    def __init__(self, script_line: Callable[[], int | None]) -> None:
        self.script_line = script_line
        self.made: weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[int, int | None]] = (
            weakref.WeakKeyDictionary()
        )
        self.steps: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = (
            weakref.WeakKeyDictionary()
        )
        self.count = 0
        #: optimizers a ReduceLROnPlateau drives: their rates follow a metric, which N ranks
        #: training on their shards reach by another path than one process
        self.on_metrics: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()

    def install(self) -> None:
        constructor = torch.optim.Optimizer.__init__
        made = self

        def __init__(optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            constructor(optimizer, *args, **kwargs)
            made.add(optimizer)

        functools.update_wrapper(__init__, constructor)
        torch.optim.Optimizer.__init__ = __init__  # type: ignore[method-assign]
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau
        plateau_constructor = plateau.__init__

        def on_a_metric(scheduler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> None:
            plateau_constructor(scheduler, optimizer, *args, **kwargs)
            made.on_metrics.add(optimizer)
            inner = getattr(optimizer, "optimizer", None)  # a prepared optimizer's own
            if isinstance(inner, torch.optim.Optimizer):
                made.on_metrics.add(inner)

        functools.update_wrapper(on_a_metric, plateau_constructor)
        plateau.__init__ = on_a_metric  # type: ignore[method-assign]

    def add(self, optimizer: torch.optim.Optimizer) -> None:
        if optimizer not in self.made:
            self.made[optimizer] = (self.count, self.script_line())
            self.count += 1

    def stepped(self, optimizer: torch.optim.Optimizer) -> int | None:
        """Counts a step of ``optimizer``; its number (None: made before the probe started)."""
        self.steps[optimizer] = self.steps.get(optimizer, 0) + 1
        made = self.made.get(optimizer)
        return None if made is None else made[0]

    def snapshot(self) -> list[dict[str, Any]]:
        """The optimizers alive now, but those a metric drives: number, line, steps taken so
        far, learning rates."""
        alive = sorted(self.made.items(), key=lambda item: item[1][0])
        return [
            {
                "made": index,
                "line": line,
                "steps": self.steps.get(optimizer, 0),
                "lrs": learning_rates(optimizer),
            }
            for optimizer, (index, line) in alive
            if optimizer not in self.on_metrics
        ]


def stop_at_deadline(deadline: float, marker: Path, probe: Probe) -> None:
    """A rank blocked in a collective never returns to Python on its own; this thread (gloo
    and NCCL waits release the GIL) ends it at the deadline and leaves a marker saying so. The
    launcher's workers run in their own sessions, so the parent could not reach them."""

    def watch() -> None:
        time.sleep(max(0.0, deadline - time.time()))
        marker.write_text(str(probe.step), encoding="utf-8")
        print(
            f"accelify verify: still running at the deadline after step {probe.step}: stopped",
            file=sys.stderr,
            flush=True,
        )
        os._exit(STOPPED_AT_DEADLINE)

    threading.Thread(target=watch, name="accelify-verify-deadline", daemon=True).start()


def seed_everything(seed: int) -> None:
    """Both scripts start from the same random state (torch's default seed differs per
    process); a script that seeds itself overrides this, identically in both."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m accelify.verify.probe SCRIPT [ARGS...]")
    script = Path(sys.argv[1]).resolve()
    try:
        rank = int(os.environ.get("RANK", "0"))
        folder = Path(os.environ[ENV_OUT])
        probe = Probe(script, record_file(folder, rank), int(os.environ[ENV_STEPS]))
        if ENV_DEADLINE in os.environ:
            stop_at_deadline(float(os.environ[ENV_DEADLINE]), hang_marker(folder, rank), probe)
        seed_everything(int(os.environ.get(ENV_SEED, "0")))
        probe.install()
    except Exception as error:  # ours, not the script's: say so and use our own exit code
        print(f"accelify verify: the probe could not start: {error!r}", file=sys.stderr)
        sys.exit(PROBE_FAILED)
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path.insert(0, os.environ.get(ENV_PATH) or str(script.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except StepLimitReached:
        pass
    finally:
        probe.stream.close()
        probe.passes.write(passes_file(folder, rank))


if __name__ == "__main__":
    main()
