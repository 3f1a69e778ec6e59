"""`find_executable_batch_size`: retry a training function with half the batch size after an
out-of-memory error, as HF Accelerate's decorator does."""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

_OUT_OF_MEMORY = (
    "CUDA out of memory.",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "out of memory",
)


def should_reduce_batch_size(error: BaseException) -> bool:
    """An out-of-memory error (torch raises them as RuntimeError with these messages)."""
    if type(error).__name__ == "OutOfMemoryError":
        return True
    return (
        isinstance(error, RuntimeError)
        and len(error.args) == 1
        and any(marker in str(error.args[0]) for marker in _OUT_OF_MEMORY)
    )


def find_executable_batch_size(
    function: Callable[..., Any] | None = None, starting_batch_size: int = 128
) -> Any:
    """``@find_executable_batch_size(starting_batch_size=64) def train(batch_size, ...)``: the
    decorator passes ``batch_size`` first, halving it after each out-of-memory error until the
    function completes (or raises at zero)."""
    if function is None:
        return functools.partial(
            find_executable_batch_size, starting_batch_size=starting_batch_size
        )

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        parameters = list(inspect.signature(function).parameters)
        if len(parameters) < len(args) + 1:
            raise TypeError(
                f"batch size was passed to {function.__name__} as its first argument: the "
                "decorator passes it, remove it from the call"
            )
        batch_size = starting_batch_size
        while True:
            if batch_size == 0:
                raise RuntimeError("no executable batch size found: reached zero")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:
                if not should_reduce_batch_size(error):
                    raise
                gc.collect()
                _empty_device_cache()
                batch_size //= 2

    return run


def _empty_device_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
