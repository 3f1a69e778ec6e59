"""What the run side needs beyond the static tools, and the one message for when it is missing.

`pip install accelify` installs only what convert and lint use (the pre-commit hook's environment
must not download torch); launch, verify and `from accelify import Accelerator` need the
`runtime` extra. Nothing here imports torch: versions are read from package metadata.
"""

from __future__ import annotations

import sys

from accelify.errors import UserError

#: Import names the runtime needs; each is in the `runtime` extra of pyproject.toml.
RUNTIME_MODULES = ("torch", "numpy", "safetensors")
INSTALL_RUNTIME = "pip install 'accelify[runtime]'"


def installed_version(distribution: str) -> str | None:
    import importlib.metadata  # not at import time: `accelify lint` never asks (14 ms)

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_runtime_modules() -> list[str]:
    import importlib.util

    return [name for name in RUNTIME_MODULES if importlib.util.find_spec(name) is None]


def runtime_missing_message(missing: list[str], what: str) -> str:
    return (
        f"{what} needs {', '.join(missing)}, not installed for {sys.executable}: "
        f"{INSTALL_RUNTIME} (where torch must be a particular build, install it first)"
    )


def require_runtime(what: str) -> None:
    """Refuse with the install command, before anything imports torch and fails mid-way."""
    missing = missing_runtime_modules()
    if missing:
        raise UserError(runtime_missing_message(missing, what))


def runtime_import_error(error: ModuleNotFoundError) -> ModuleNotFoundError:
    """The error `from accelify import Accelerator` raises when a runtime requirement is
    missing: the same type (so ``except ImportError`` still works), a message that says what to
    install."""
    message = runtime_missing_message([str(error.name)], "accelify's runtime")
    return ModuleNotFoundError(message, name=error.name)


def version_line(version: str) -> str:
    """`accelify --version`: ours, and the engines this interpreter would run with."""
    torch_version = installed_version("torch")
    if torch_version is None:
        return (
            f"accelify {version} (torch not installed: convert and lint work; "
            f"launch and verify need {INSTALL_RUNTIME})"
        )
    engines = [f"torch {torch_version}"]
    deepspeed_version = installed_version("deepspeed")
    if deepspeed_version is not None:
        engines.append(f"deepspeed {deepspeed_version}")
    return f"accelify {version} ({', '.join(engines)})"
