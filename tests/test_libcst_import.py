"""libcst imported through `accelify.libcst_import.load` has the same classes as a plain import.

Each import runs in its own interpreter (the first import is the one changed): a plain one, one
that compiles and keeps the dataclasses' methods (cold), one that runs the kept code (warm).
Every method ``dataclasses`` generated for libcst's classes must be the same code, with the same
annotations and defaults, in all three; and the warm import must have compiled nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SIGNATURES = """
import dataclasses, json, sys
compiles = []
if not sys.argv[1].startswith("plain"):
    from accelify import libcst_import
    real_compiled = libcst_import._compiled
    def counting(source):
        compiles.append(1)
        return real_compiled(source)
    libcst_import._compiled = counting
    if sys.argv[1] == "libcst":
        libcst = libcst_import.load(sys.argv[2])
    else:
        with libcst_import.kept_compiles(sys.argv[2]):
            import libcst
            from accelify.analysis.script_model import analyze
            from accelify.lint.registry import all_rules
            all_rules()
elif sys.argv[1] == "plain libcst":
    import libcst
else:
    import libcst
    from accelify.analysis.script_model import analyze
    from accelify.lint.registry import all_rules
    all_rules()
seen = {}
for name, module in sorted(sys.modules.items()):
    if not name.startswith(("libcst", "accelify")):
        continue
    for cls in vars(module).values():
        if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
            continue
        for attr, fn in sorted(vars(cls).items()):
            code = getattr(fn, "__code__", None)
            if code is None or code.co_filename != "<string>":
                continue
            seen[f"{cls.__module__}.{cls.__qualname__}.{attr}"] = [
                code.co_code.hex(), repr(code.co_consts), code.co_names, code.co_varnames,
                code.co_flags, code.co_qualname, repr(fn.__annotations__), repr(fn.__defaults__),
                repr(fn.__kwdefaults__), fn.__qualname__,
            ]
print(json.dumps({"compiles": len(compiles), "seen": seen}))
"""


def _signatures(mode: str, store: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [sys.executable, "-c", SIGNATURES, mode, str(store)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(done.stdout)


@pytest.mark.parametrize("imported", ["libcst", "lint"])
def test_kept_methods_are_the_compiled_ones(tmp_path: Path, imported: str) -> None:
    """``libcst``: `load`; ``lint``: libcst, the analysis and the rules under `kept_compiles`,
    as `accelify.lint.engine.load_analysis` imports them."""
    store = tmp_path / "pycache" / "libcst_dataclasses.bin"
    plain = _signatures(f"plain {imported}", store)
    cold = _signatures(imported, store)
    assert store.is_file()
    warm = _signatures(imported, store)
    assert len(plain["seen"]) > (500 if imported == "libcst" else 700)  # all of them
    assert any(name.startswith("accelify.") for name in plain["seen"]) == (imported == "lint")
    assert cold["seen"] == plain["seen"]
    assert warm["seen"] == plain["seen"]
    assert cold["compiles"] > (500 if imported == "libcst" else 700)
    assert warm["compiles"] == 0


@pytest.mark.parametrize("content", [b"", b"not marshal", b"\x00" * 64])
def test_a_store_not_to_trust_is_compiled_over(tmp_path: Path, content: bytes) -> None:
    store = tmp_path / "libcst_dataclasses.bin"
    store.write_bytes(content)
    plain = _signatures("plain lint", store)
    kept = _signatures("lint", store)
    assert kept["seen"] == plain["seen"]
    assert kept["compiles"] > 700
