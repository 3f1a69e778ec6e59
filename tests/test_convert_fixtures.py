"""Golden conversions: fixtures/convert/<case>/before.py becomes after.py, with summary.txt.

Each case is one shape of training script; the pair reads like a migration guide. To add a
case, write its before.py and review the after.py and summary.txt the tool produces.
"""

from __future__ import annotations

import difflib
import functools
import re
from pathlib import Path

import pytest

from accelify.convert import Conversion, Options, convert_source
from accelify.errors import UserError
from conftest import FIXTURES, case_group, lint_every_rule, run_accelify

CASES = sorted(path for path in (FIXTURES / "convert").iterdir() if path.is_dir())
CONVERTIBLE = [case for case in CASES if (case / "after.py").exists()]
#: The cases again, for the tests that read a case's conversion (`convert_case`) or lint its
#: after.py (`lint_every_rule`), each case's in one pytest-xdist group (test_lint_reach's test
#: of the after.py too): the conversion and the lint are cached per process, and the worker that
#: made them runs the case's other tests, where tests dealt out one by one made them again in
#: each worker that drew one of them (0.75 conversions more per case, 0.085 CPU-seconds each,
#: on 2 workers)
CONVERTED = [
    pytest.param(case, id=case.name, marks=pytest.mark.xdist_group(case_group(case)))
    for case in CONVERTIBLE
]


def summary_text(conversion: Conversion) -> str:
    if conversion.prepared:
        head = f"prepared: {', '.join(conversion.prepared)}"
    elif conversion.skipped:
        head = f"skipped: {conversion.skipped}"
    else:
        head = "prepared: nothing"
    lines = [head]
    lines += [f"{note.line}: {note.text}" for note in conversion.changes]
    lines += [f"review {note.line}: {note.text}" for note in conversion.reviews]
    return "\n".join(lines) + "\n"


def convert_case(case: Path, **options: str) -> Conversion:
    """Each case is converted once per set of options for all the tests that read it."""
    return _converted(case, tuple(sorted(options.items())))


@functools.cache
def _converted(case: Path, options: tuple[tuple[str, str], ...]) -> Conversion:
    before = (case / "before.py").read_bytes()
    return convert_source(before, f"{case.name}/before.py", Options(**dict(options)))


def test_there_are_at_least_25_shapes():
    assert len(CASES) >= 25


@pytest.mark.parametrize("case", CONVERTED)
def test_conversion_matches_the_golden_file(case: Path):
    conversion = convert_case(case)
    assert conversion.converted.decode() == (case / "after.py").read_text()
    assert summary_text(conversion) == (case / "summary.txt").read_text()


@pytest.mark.parametrize("case", CONVERTIBLE, ids=lambda case: case.name)
def test_converting_the_conversion_changes_nothing(case: Path):
    after = (case / "after.py").read_bytes()
    again = convert_source(after, f"{case.name}/after.py")
    assert again.converted == after


@pytest.mark.parametrize("case", CONVERTIBLE, ids=lambda case: case.name)
def test_conversion_parses(case: Path):
    compile((case / "after.py").read_bytes(), str(case / "after.py"), "exec")


@pytest.mark.parametrize("case", CONVERTED)
def test_accelerate_target_differs_only_in_the_import(case: Path):
    if convert_case(case).skipped:
        pytest.skip("left unchanged")
    ours = convert_case(case).converted.decode()
    theirs = convert_case(case, target="accelerate").converted.decode()
    # Accelerate synchronizes torch's generators only: a script that draws from NumPy or
    # ``random`` before training gets ``set_seed(0)`` there (convert/steps/seeding.py).
    theirs = theirs.replace("set_seed(0)", "synchronize_rng_states()")
    # Accelerate's get_state_dict takes models only: an optimizer's saved state stays there,
    # with a review line saying what HF needs under FSDP and DeepSpeed
    for optimizer, gathered in _optimizer_states_gathered(convert_case(case)):
        ours = ours.replace(gathered, f"{optimizer}.state_dict()")
        assert any(
            f"{optimizer}.state_dict() is saved: under Hugging Face Accelerate's" in note.text
            for note in convert_case(case, target="accelerate").reviews
        )
    assert _without_runtime_imports(theirs) == _without_runtime_imports(ours)
    imported = {_SAME_ROLE.get(n, n) for n in _runtime_imports(theirs, "accelerate")}
    assert imported == _runtime_imports(ours, "accelify")


_SAME_ROLE = {"set_seed": "synchronize_rng_states"}

#: ``optimizer.state_dict() -> accelerator.get_state_dict(optimizer): the optimizer's whole ...``
_OPTIMIZER_GATHERED = re.compile(
    r"^(\S+)\.state_dict\(\) -> (\S+\.get_state_dict\(\1\)): the optimizer's"
)


def _optimizer_states_gathered(conversion: Conversion) -> list[tuple[str, str]]:
    """Each optimizer whose saved state the conversion gathers, with the call it wrote."""
    found = (_OPTIMIZER_GATHERED.match(note.text) for note in conversion.changes)
    return [(match[1], match[2]) for match in found if match is not None]


_RUNTIME_IMPORT = re.compile(r"^from (accelify|accelerate)(\.utils)? import (.+)\n", re.MULTILINE)


def _without_runtime_imports(code: str) -> str:
    return _RUNTIME_IMPORT.sub("", code)


def _runtime_imports(code: str, package: str) -> set[str]:
    """The names imported from the runtime package (``accelify`` or ``accelerate`` and its
    ``.utils``): the two targets group them into lines differently."""
    return {
        name.strip()
        for match in _RUNTIME_IMPORT.finditer(code)
        if match.group(1) == package
        for name in match.group(3).split(",")
    }


def test_syntax_error_is_exit_2_with_position_and_the_file_untouched(tmp_path):
    case = FIXTURES / "convert" / "syntax_error"
    script = tmp_path / "broken.py"
    script.write_bytes((case / "before.py").read_bytes())
    with pytest.raises(UserError) as caught:
        convert_source(script.read_bytes(), script)
    expected = (
        (case / "error.txt").read_text().strip().replace("syntax_error/before.py", str(script))
    )
    assert str(caught.value) == expected
    result = run_accelify("convert", script, "--write")
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert script.read_bytes() == (case / "before.py").read_bytes()


def before_line_of(case: Path, after_line: int) -> int | None:
    """The line of before.py that ``after_line`` of after.py was left as, or rewritten from in
    place (a block of changed lines as long as the one it replaced); None: the conversion wrote
    it."""
    before = (case / "before.py").read_text().splitlines()
    after = (case / "after.py").read_text().splitlines()
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        in_place = tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1)
        if in_place and j1 < after_line <= j2:
            return i1 + after_line - j1
    return None


@pytest.mark.parametrize("case", CONVERTED)
def test_what_lint_still_finds_in_the_conversion_was_left_for_review(case: Path):
    """Every rule selected: the conversion lints clean, except at lines the conversion left as
    they were and named in a review line of its summary (the finding's own line, or the line its
    message names when it sits at a call site)."""
    after = case / "after.py"
    findings = lint_every_rule(after.read_bytes(), str(after)).findings
    reviewed = {note.line for note in convert_case(case).reviews}
    unexplained = []
    for finding in findings:
        lines = [finding.line, *map(int, re.findall(r"\bline (\d+)", finding.message))]
        if not {before_line_of(case, line) for line in lines} & reviewed:
            where = ", ".join(f"before.py:{before_line_of(case, line)}" for line in lines)
            unexplained.append(f"after.py:{finding.line} {finding.code} ({where}: no review line)")
    assert unexplained == []


@pytest.mark.parametrize("case", CONVERTIBLE, ids=lambda case: case.name)
def test_every_name_the_conversion_imports_is_used(case: Path):
    """A name the conversion imports from accelify is read somewhere: an unused one is what
    ruff's F401 reports in every converted file a user lints."""
    import ast

    tree = ast.parse((case / "after.py").read_text())
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("accelify")
        for alias in node.names
    }
    read = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert imported <= read, f"imported and never used: {sorted(imported - read)}"


def test_the_accelerate_target_says_what_hf_needs_for_a_whole_optimizer_state():
    """Under ``--target accelerate`` the optimizer's saved state and its load before
    ``prepare`` stay as written (HF's get_state_dict takes models only), each with a review
    line naming what HF's FSDP2 and DeepSpeed need; accelify's target has neither line."""
    case = FIXTURES / "convert" / "checkpoint_with_optimizer_state_loaded_before_prepare"
    theirs = {note.line: note.text for note in convert_case(case, target="accelerate").reviews}
    assert "prepare drops it silently" in theirs[42]
    assert "set_optimizer_state_dict(model, optimizer, state" in theirs[42]
    assert "HF's get_state_dict takes models only" in theirs[63]
    assert not convert_case(case).reviews


_HF_OPTIMIZER_STATE = """
import torch
from torch import nn

def main():
    net = nn.Linear(4, 2)
    head = nn.Linear(2, 2)
    optimizer = torch.optim.Adam({params}, lr=0.01)
    for _ in range(2):
        optimizer.zero_grad()
        loss = head(net(torch.randn(3, 4))).sum()
        loss.backward()
        optimizer.step()
    torch.save({{"optimizer": optimizer.state_dict()}}, "ckpt.pt")
    optimizer.load_state_dict(torch.load("ckpt.pt")["optimizer"])

main()
"""


@pytest.mark.parametrize(
    ("params", "model"),
    [
        ("net.parameters()", "net"),
        ("[*net.parameters(), *head.parameters()]", "<your model>"),
    ],
)
def test_hf_optimizer_state_lines_name_the_optimizers_model(params: str, model: str):
    """torch's get/set_optimizer_state_dict take the model the optimizer trains: the line
    names it (``net``, not a ``model`` the script does not have), or says ``<your model>``."""
    source = _HF_OPTIMIZER_STATE.format(params=params).encode()
    reviews = convert_source(source, "hf.py", Options(target="accelerate")).reviews
    texts = " ".join(note.text for note in reviews)
    assert f"get_optimizer_state_dict({model}, optimizer," in texts
    assert f"set_optimizer_state_dict({model}, optimizer, state" in texts
    assert "FSDP1 (fsdp_version 1, its default)" in texts


def test_a_loader_read_twice_per_epoch_keeps_its_own_samplers_epoch_with_a_review_line():
    """``next(iter(loader))`` before the epoch's pass: each pass of the prepared loader moves
    its sampler's epoch on, so the rewritten ``loader.set_epoch(epoch)`` alone does not keep
    the original's epochs; the review line says so. (own_sampler_seeded_by_epoch: once.)"""
    case = FIXTURES / "convert" / "own_sampler_seeded_by_epoch"
    before = (case / "before.py").read_text()
    twice = before.replace(
        "        model.train()\n",
        "        model.train()\n        print(next(iter(train_loader))[1].tolist()[:4])\n",
    )
    assert twice != before
    conversion = convert_source(twice.encode(), "twice.py")
    assert b"train_loader.set_epoch(epoch)" in conversion.converted
    assert any("train_loader is read 2 times per epoch" in n.text for n in conversion.reviews)
    assert not any("read 2 times" in n.text for n in convert_case(case).reviews)
