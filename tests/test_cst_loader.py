"""`load_libcst`: libcst without its metadata providers until asked, the same module after.

Each check runs in a fresh interpreter (the test process has imported libcst already)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


FULL_NAMES = """
import json, libcst
print(json.dumps(sorted(vars(libcst))))
"""

PARTIAL_THEN_FULL = """
import json, sys
from accelify.cst_loader import load_libcst
libcst = load_libcst()
partial = sorted(name for name in vars(libcst) if name != "__getattr__")
metadata_before = sorted(m for m in sys.modules if m.startswith("libcst.metadata"))
module = libcst.parse_module(b"x = f(1)  # c\\n")
from libcst import native  # a submodule: imported, nothing else
held_after_native = "MetadataWrapper" not in vars(libcst)
same_nodes = libcst.Name is sys.modules["libcst._nodes.expression"].Name
import libcst as again
wrapper = libcst.MetadataWrapper  # a held-back name: the whole __init__ runs
print(json.dumps({
    "partial": partial,
    "metadata_before": metadata_before,
    "code": module.code,
    "held_after_native": held_after_native,
    "same_nodes": same_nodes,
    "same_module": again is libcst,
    "wrapper": wrapper is sys.modules["libcst.metadata.wrapper"].MetadataWrapper,
    "full": sorted(vars(libcst)),
    "no_hook": "__getattr__" not in vars(libcst),
}))
"""


def test_held_back_until_asked_then_the_whole_module():
    full = _run(FULL_NAMES)
    seen = _run(PARTIAL_THEN_FULL)
    assert seen["metadata_before"] == []
    held = set(full) - set(seen["partial"])
    assert held, "nothing was held back"
    assert held <= {"metadata", "MetadataWrapper", "_position"} | {
        name for name in full if "Provider" in name
    }
    assert seen["code"] == "x = f(1)  # c\n"
    assert seen["held_after_native"] and seen["same_nodes"] and seen["same_module"]
    assert seen["wrapper"] and seen["no_hook"]
    assert sorted(set(seen["full"]) - {"native"}) == full  # native: imported above


def test_import_of_a_metadata_module_works_as_before():
    seen = _run(
        """
import json
from accelify.cst_loader import load_libcst
libcst = load_libcst()
from libcst.metadata import MetadataWrapper, PositionProvider
wrapper = MetadataWrapper(libcst.parse_module("a = 1\\n"))
positions = wrapper.resolve(PositionProvider)
print(json.dumps({"lines": sorted({p.start.line for p in positions.values()})}))
"""
    )
    assert seen["lines"] == [1]


def test_lint_of_an_accelerator_file_imports_no_metadata_provider(tmp_path):
    script = ROOT / "fixtures" / "examples" / "classify.py"
    seen = _run(
        f"""
import json, sys
from accelify.cli import main
sys.argv = ["accelify", "lint", "--no-cache", "--exit-zero", "--select", "ALL", {str(script)!r}]
try:
    main()
except SystemExit:
    pass
print(json.dumps({{
    "analysed": "accelify.analysis.script_model" in sys.modules,
    "metadata": sorted(m for m in sys.modules if m.startswith("libcst.metadata")),
}}))
"""
    )
    assert seen["analysed"]
    assert seen["metadata"] == []
