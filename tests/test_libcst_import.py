"""libcst imported under `accelify.libcst_import.kept_compiles` has the same classes as a plain
import; a store damaged, unwritable or interrupted changes nothing but the time.

Each import runs in its own interpreter (the first import is the one changed): a plain one, one
that compiles and keeps the dataclasses' methods (cold), one that runs the kept code (warm).
Every method ``dataclasses`` generated for libcst's classes must be the same code, with the same
annotations and defaults, in all three; and the warm import must have compiled nothing.
"""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

SIGNATURES = """
import dataclasses, json, sys
compiles = []
from accelify import libcst_import  # (and what it imports, plain in every mode)
if not sys.argv[1].startswith("plain"):
    real_compiled = libcst_import._compiled
    def counting(source):
        compiles.append(1)
        return real_compiled(source)
    libcst_import._compiled = counting
    if sys.argv[1] == "libcst":
        with libcst_import.kept_compiles(sys.argv[2]):
            import libcst
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
    """``libcst``: libcst alone; ``lint``: libcst, the analysis and the rules under `kept_compiles`,
    as `accelify.lint.engine.load_analysis` imports them."""
    store = tmp_path / "pycache" / "libcst_dataclasses.bin"
    plain = _signatures(f"plain {imported}", store)
    cold = _signatures(imported, store)
    assert store.is_file()
    warm = _signatures(imported, store)
    assert len(plain["seen"]) > (500 if imported == "libcst" else 700)  # all of them
    analysed = any(name.startswith("accelify.analysis.") for name in plain["seen"])
    assert analysed == (imported == "lint")
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


FACTORY = (
    Path(__file__).resolve().parent.parent
    / "fixtures"
    / "lint"
    / "projects"
    / "accelerator_factory"
)


def _lint(cache: Path, *extra_env: tuple[str, str]) -> subprocess.CompletedProcess[str]:
    """``accelify lint`` of a project whose rules need the analysis, its stores in ``cache``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update({"XDG_CACHE_HOME": str(cache), **dict(extra_env)})
    run_in = cache.parent / "run"  # (not the cache: its accelify/ would be imported there)
    run_in.mkdir(exist_ok=True)
    return subprocess.run(
        [
            *(sys.executable, "-m", "accelify", "lint", "--no-cache", "--select", "ALL"),
            *("--output-format", "json", "--exit-zero", str(FACTORY)),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=run_in,
    )


def _stores(cache: Path) -> list[Path]:
    return sorted((cache / "accelify").glob("*"))


def test_stores_are_in_the_user_cache_named_by_version_and_interpreter(tmp_path: Path) -> None:
    from accelify import __version__

    done = _lint(tmp_path)
    assert done.returncode == 0, done.stderr
    names = [store.name for store in _stores(tmp_path)]
    tag = sys.implementation.cache_tag
    assert names == [f"{s}_dataclasses.{__version__}.{tag}.bin" for s in ("lint", "rules")]


def _flipped(payload: bytes) -> bytes:
    """Bytes flipped all along (``marshal.loads`` raises, or crashes the interpreter)."""
    damaged = bytearray(payload)
    for at in range(7, len(damaged), max(1, len(damaged) // 40)):
        damaged[at] ^= 0x5A
    return bytes(damaged)


def _shuffled(payload: bytes) -> bytes:
    """Damage that still loads: each text kept with another text's code (its methods would be
    wrong when called)."""
    kept = marshal.loads(payload)
    codes = list(kept.values())
    return marshal.dumps(dict(zip(kept, codes[1:] + codes[:1], strict=True)))


@pytest.mark.parametrize("damage", [_flipped, _shuffled])
def test_a_damaged_store_is_compiled_over_and_rewritten(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    """Magic (and digest) intact, payload damaged: the findings are those of a good store, and
    the run rewrites the store whole."""
    from accelify import libcst_import

    good = _lint(tmp_path)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout), "findings to compare"
    stores = _stores(tmp_path)
    kept = {store: store.read_bytes() for store in stores}
    texts = {store: set(libcst_import._read(str(store))) for store in stores}
    assert all(texts.values()) and sum(map(len, texts.values())) > 500
    header = len(libcst_import._magic()) + libcst_import.DIGEST_SIZE
    for store, data in kept.items():
        store.write_bytes(data[:header] + damage(data[header:]))
        assert libcst_import._read(str(store)) == {}
    again = _lint(tmp_path)
    assert (again.returncode, again.stdout, again.stderr) == (0, good.stdout, good.stderr)
    for store in stores:
        assert set(libcst_import._read(str(store))) == texts[store], "rewritten"
    assert _stores(tmp_path) == stores  # (no partial file left)


def test_a_damaged_digest_or_a_short_file_is_not_trusted(tmp_path: Path) -> None:
    from accelify import libcst_import

    store = tmp_path / "x.bin"
    libcst_import._write(str(store), {"a = 1": compile("a = 1", "<string>", "exec")})
    data = store.read_bytes()
    assert set(libcst_import._read(str(store))) == {"a = 1"}
    magic = len(libcst_import._magic())
    store.write_bytes(data[:magic] + bytes([data[magic] ^ 1]) + data[magic + 1 :])
    assert libcst_import._read(str(store)) == {}
    store.write_bytes(data[: magic + 3])
    assert libcst_import._read(str(store)) == {}


def test_an_unwritable_cache_or_dont_write_bytecode_keeps_nothing_silently(tmp_path: Path) -> None:
    good = _lint(tmp_path / "good")
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "accelify").write_text("a file where the folder would be")
    for done in (
        _lint(blocked),
        _lint(tmp_path / "off", ("PYTHONDONTWRITEBYTECODE", "1")),
    ):
        assert (done.returncode, done.stdout, done.stderr) == (0, good.stdout, good.stderr)
    assert not (tmp_path / "off" / "accelify").exists()
    assert (blocked / "accelify").is_file()


def test_an_interrupted_write_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelify import libcst_import

    def interrupted(*args: object) -> bytes:
        raise KeyboardInterrupt

    store = tmp_path / "x.bin"
    monkeypatch.setattr(libcst_import, "_digest", interrupted)
    with pytest.raises(KeyboardInterrupt):
        libcst_import._write(str(store), {"a = 1": compile("a = 1", "<string>", "exec")})
    assert list(tmp_path.iterdir()) == []
