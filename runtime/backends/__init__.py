"""Engines that wrap a prepared model; each is one module behind `Backend`, chosen once."""

from __future__ import annotations

from accelify.runtime.backends.base import Backend
from accelify.runtime.state import ProcessState


def create_backend(name: str, state: ProcessState) -> Backend:
    if name == "ddp":
        from accelify.runtime.backends.ddp import DDPBackend

        return DDPBackend(state)
    raise ValueError(f"unknown backend {name!r}: expected 'ddp'")


__all__ = ["Backend", "create_backend"]
