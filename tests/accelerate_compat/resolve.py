"""`accelerate.X` resolved to `accelify.X` of the same name, for running HF's test scripts.

HF's scripts are read from the installed `accelerate` wheel and are not changed: only the modules
they import are swapped. Each `accelerate` module maps to the accelify module that holds its
names. A name accelify does not have resolves to a placeholder that raises when it is used, so a
missing name fails the cases that use it and not the whole script's import. HF's own test helpers
(`RegressionModel`, `are_the_same_tensors`, ...) are HF's source, compiled against the swapped
modules: their `AcceleratorState` and `gather` are accelify's.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Any

#: HF module -> the accelify module that answers for its names.
MODULES = {
    "accelerate": "accelify",
    "accelerate.accelerator": "accelify",
    "accelerate.state": "accelify.state",
    "accelerate.data_loader": "accelify.data_loader",
    "accelerate.logging": "accelify.logging",
    "accelerate.tracking": "accelify.tracking",
    "accelerate.utils": "accelify.utils",
    "accelerate.utils.dataclasses": "accelify.utils",
    "accelerate.utils.operations": "accelify.utils",
    "accelerate.utils.random": "accelify.utils",
}

#: HF's test helpers the scripts import, taken from HF's source: module -> (file, names).
HELPERS = {
    "accelerate.test_utils.training": ("training.py", None),
    "accelerate.test_utils.testing": ("testing.py", ("are_the_same_tensors", "assert_exception")),
}


class MissingName:
    """Stands for a name accelify lacks; any use raises, naming it."""

    def __init__(self, qualified: str) -> None:
        self._qualified = qualified

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"accelify has no {self._qualified}")

    __call__ = _fail
    __iter__ = _fail
    __enter__ = _fail
    __bool__ = _fail

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self._fail()

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[Any, ...]:
        self._fail()
        return ()

    def __instancecheck__(self, instance: Any) -> bool:
        return self._fail()


def _alias(name: str, target: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # a package, so `accelerate.utils.x` is looked up through us

    def lookup(attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        real = importlib.import_module(target)
        try:
            return getattr(real, attribute)
        except AttributeError:
            return MissingName(f"{name}.{attribute}")

    module.__getattr__ = lookup  # type: ignore[method-assign]
    return module


def _hf_source(file: str) -> Path:
    """The installed HF file (looked up on sys.path: `accelerate` itself now means accelify)."""
    spec = importlib.machinery.PathFinder.find_spec("accelerate")
    if spec is None or spec.origin is None:
        raise ImportError("the accelerate package is not installed")
    return Path(spec.origin).parent / "test_utils" / file


def _helpers(name: str, file: str, names: tuple[str, ...] | None) -> types.ModuleType:
    """HF's helper file, or only the named functions of it, run against the swapped modules."""
    path = _hf_source(file)
    tree = ast.parse(path.read_text(), filename=str(path))
    if names is not None:
        # what the named functions use, from the swapped modules
        imports = ast.parse(
            "from contextlib import contextmanager\nimport torch\n"
            "from accelerate.state import AcceleratorState\n"
            "from accelerate.utils import gather\n"
        )
        wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
        tree = ast.Module(body=[*imports.body, *wanted], type_ignores=[])
    module = types.ModuleType(name)
    module.__file__ = str(path)
    exec(compile(tree, str(path), "exec"), module.__dict__)
    return module


def _fill_test_utils(module: types.ModuleType) -> None:
    """`accelerate.test_utils` re-exports its helpers; filled once it is in sys.modules, so that
    importing a helper module (a submodule) finds its parent."""
    module.__path__ = []
    for name in HELPERS:
        helper = importlib.import_module(name)
        for attribute, value in vars(helper).items():
            if not attribute.startswith("_") and callable(value):
                setattr(module, attribute, value)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname in MODULES or fullname in HELPERS or fullname == "accelerate.test_utils":
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        if fullname == "accelerate" or fullname.startswith("accelerate."):
            raise ModuleNotFoundError(f"accelify has no module for {fullname}", name=fullname)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        name = spec.name
        if name in MODULES:
            return _alias(name, MODULES[name])
        if name in HELPERS:
            return _helpers(name, *HELPERS[name])
        return types.ModuleType(name)

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "accelerate.test_utils":
            _fill_test_utils(module)


def install() -> None:
    """From here on `import accelerate...` in this process means accelify."""
    for name in [n for n in sys.modules if n == "accelerate" or n.startswith("accelerate.")]:
        del sys.modules[name]
    sys.meta_path.insert(0, _Finder())
