"""libcst, imported without the metadata providers until something asks for them.

``import libcst`` runs the package's ``__init__``, which ends by importing `libcst.metadata`:
every metadata provider (scope analysis, type inference through a subprocess, qualified names,
the repository manager...), about a seventh of the import, which `accelify lint` pays on every
start that analyses a file and never uses (it reads positions through its own
`accelify.analysis.positions`). `load_libcst` runs the same ``__init__`` with its imports of
`libcst.metadata` held back: every other name it defines (the nodes, the parser, the
visitors, the helpers) is bound as usual, to the same objects. The first attribute the
module lacks (``libcst.MetadataWrapper``, or anything else) runs the whole ``__init__`` again
with nothing held back, after which the module is exactly what ``import libcst`` makes;
``import libcst.metadata`` works as always (the package's path is set). Where the module cannot
be loaded that way (no source loader), or libcst is already imported, it is imported as usual.
"""

from __future__ import annotations

import builtins
import importlib.util
import sys
from types import ModuleType
from typing import Any

#: What ``libcst/__init__.py`` imports that the parser, the nodes and the visitors do not need.
HELD_BACK = "libcst.metadata"


class _Later:
    """Stands for a held-back module while libcst's ``__init__`` runs: each name imported from
    it is bound to `_LATER`, and every such binding is removed after."""

    def __getattr__(self, name: str) -> object:
        return _LATER


_LATER = object()


def load_libcst() -> ModuleType:
    """The ``libcst`` module: imported already, or loaded now with `HELD_BACK` held back."""
    loaded = sys.modules.get("libcst")
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("libcst")
    loader = spec.loader if spec is not None else None
    if spec is None or loader is None or not hasattr(loader, "get_code"):
        import libcst

        return libcst
    module = importlib.util.module_from_spec(spec)
    namespace = module.__dict__
    sys.modules["libcst"] = module
    try:
        code = loader.get_code("libcst")  # type: ignore[union-attr]
        namespace["__builtins__"] = {**vars(builtins), "__import__": _holding_back}
        exec(code, namespace)
    except BaseException:
        del sys.modules["libcst"]
        raise
    finally:
        namespace["__builtins__"] = vars(builtins)
    held = {name for name, value in namespace.items() if value is _LATER}
    held.add(HELD_BACK.rpartition(".")[2])  # ``libcst.metadata``, bound by its import
    for name in held & namespace.keys():
        del namespace[name]

    def completed(name: str) -> object:
        """The module's ``__getattr__`` while `HELD_BACK` is held back. A submodule not
        imported yet (``from libcst import native``: the import system asks the package for
        it first) is imported; any other name runs libcst's whole ``__init__`` over the
        module (the names already bound are bound again to the same objects) and is then
        answered as ``import libcst`` would."""
        submodule = f"libcst.{name}"
        if name not in held and "." not in name and importlib.util.find_spec(submodule):
            return importlib.import_module(submodule)
        if namespace.get("__getattr__") is completed:
            del namespace["__getattr__"]
            loader.exec_module(module)  # type: ignore[union-attr]
        try:
            return namespace[name]
        except KeyError:
            raise AttributeError(f"module 'libcst' has no attribute {name!r}") from None

    namespace["__getattr__"] = completed
    return module


def _holding_back(
    name: str,
    globals: dict[str, Any] | None = None,
    locals: dict[str, Any] | None = None,
    fromlist: tuple[str, ...] = (),
    level: int = 0,
) -> object:
    """``__import__`` for libcst's ``__init__``: `HELD_BACK` and its submodules are not
    imported; every other import is the interpreter's own."""
    if level == 0 and (name == HELD_BACK or name.startswith(HELD_BACK + ".")):
        return _Later()
    return builtins.__import__(name, globals, locals, fromlist, level)
