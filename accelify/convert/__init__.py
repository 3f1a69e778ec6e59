"""`accelify convert`: the codemod. The names below load on first use, so that the linter, which
shares `plan` and `transform`, does not pay for the planner's imports."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accelify.convert.conversion import Conversion, Options, convert_source

__all__ = ["Conversion", "Options", "convert_source"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from accelify.convert import conversion

        return getattr(conversion, name)
    raise AttributeError(f"module 'accelify.convert' has no attribute {name!r}")
