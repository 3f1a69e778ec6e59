"""``get_logger``: a `logging` logger that logs once per run, not once per rank (HF Accelerate's
``accelerate.logging.get_logger``). Torch-free: the rank comes from the launcher's ``RANK``.

``logger.info(...)`` logs on the main process only; ``main_process_only=False`` logs on every
rank, ``in_order=True`` (with it) rank after rank.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import MutableMapping
from typing import Any


class MultiProcessAdapter(logging.LoggerAdapter):
    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        kwargs.setdefault("stacklevel", 2)
        if not self.isEnabledFor(level):
            return
        if main_process_only:
            if _rank() == 0:
                msg, kwargs = self.process(msg, kwargs)
                self.logger.log(level, msg, *args, **kwargs)
            return
        if in_order and _world_size() > 1:
            import torch.distributed as dist

            for rank in range(_world_size()):
                if rank == _rank():
                    msg, kwargs = self.process(msg, kwargs)
                    self.logger.log(level, msg, *args, **kwargs)
                if dist.is_initialized():
                    dist.barrier()
            return
        msg, kwargs = self.process(msg, kwargs)
        self.logger.log(level, msg, *args, **kwargs)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        return msg, kwargs

    @functools.lru_cache(None)  # noqa: B019 - one entry per distinct warning, kept on purpose
    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """The same warning once, however often the line runs."""
        self.warning(*args, **kwargs)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """``log_level`` (else ``ACCELIFY_LOG_LEVEL`` or ``ACCELERATE_LOG_LEVEL``): its level."""
    logger = logging.getLogger(name)
    level = (
        log_level or os.environ.get("ACCELIFY_LOG_LEVEL") or os.environ.get("ACCELERATE_LOG_LEVEL")
    )
    if level is not None:
        logger.setLevel(level.upper())
        logger.root.setLevel(level.upper())
    return MultiProcessAdapter(logger, {})


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))
