"""Lint reads the project, not one file: what train.py's calls hand a trainer module's classes
and helpers (the accelerator, a prepared model or loader, every rank), and an Accelerator a
factory of another module returns, reach the module that uses them. Each folder of
``fixtures/lint/projects`` is linted as a tree; ``# expect: ACC503`` marks each finding."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from accelify.analysis.project_modules import importers_of, module_file, read
from accelify.lint.cache import open_cache
from accelify.lint.cli import _lint_all
from accelify.lint.engine import lint_source
from accelify.lint.selection import Selection
from conftest import FIXTURES

PROJECTS = FIXTURES / "lint" / "projects"
EXPECT = re.compile(r"#\s*expect:\s*(?P<codes>ACC\d+(?:\s*,\s*ACC\d+)*)")
EVERY_RULE = Selection(select=["ACC"])


def expected(folder: Path) -> set[tuple[str, int, str]]:
    found = set()
    for path in sorted(folder.glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = EXPECT.search(line)
            if match:
                for code in match.group("codes").split(","):
                    found.add((path.name, number, code.strip()))
    return found


def reported(folder: Path, jobs: int = 1, cache=None) -> dict[tuple[str, int, str], str]:
    files = sorted(folder.glob("*.py"))
    results = _lint_all(files, EVERY_RULE, False, jobs, False, cache)
    return {
        (Path(result.path).name, finding.line, finding.code): finding.message
        for result in results
        for finding in result.findings
    }


@pytest.mark.parametrize(
    "folder", sorted(p for p in PROJECTS.iterdir() if p.is_dir()), ids=lambda p: p.name
)
def test_each_project_reports_its_bugs_where_they_are_and_nothing_else(folder: Path):
    assert set(reported(folder)) == expected(folder)


def test_findings_that_come_from_another_module_name_the_call_that_tells():
    messages = reported(PROJECTS / "handed_trainer")
    assert "train.py:19 calls Trainer with" in messages[("trainer.py", 23, "ACC503")]
    assert "model a prepared model" in messages[("trainer.py", 23, "ACC503")]
    assert "train.py:21 calls accuracy()" in messages[("evaluation.py", 11, "ACC403")]
    assert "loader a prepared dataloader" in messages[("evaluation.py", 11, "ACC403")]
    factory = reported(PROJECTS / "accelerator_factory")
    assert "make_accelerator() returns to finetune.py:9" in factory[("setup_util.py", 6, "ACC304")]


def test_a_loader_another_module_built_is_handed_prepared_all_the_same():
    """train.py reads what ``get_loaders()`` of data.py returns there (the conversion's
    analysis of a project module's factory: `imported_returns`), and prepares it: evaluate() of
    engine.py is handed a prepared dataloader, as a call in its own file would tell."""
    messages = reported(PROJECTS / "loaders_built_in_another_module")
    assert "loader a prepared dataloader" in messages[("engine.py", 22, "ACC403")]


def test_a_second_write_of_the_same_file_is_no_read_back_that_needs_a_barrier():
    """The step's branch and the epoch's each open ``out + "/state.json"`` for writing: the
    epoch's open writes the file, so the advice for the step's write asks for no barrier
    before it (ChartReformer's train_new.py was told it "reads it back on every rank")."""
    messages = reported(PROJECTS / "state_file_written_in_two_branches")
    assert "reads it back" not in messages[("train.py", 29, "ACC201")]
    assert "wait_for_everyone" not in messages[("train.py", 29, "ACC201")]


def test_what_is_left_after_a_fix_still_names_the_callers(tmp_path: Path):
    """``--fix`` lints the fixed file again: the findings left come from the same callers, and
    their messages name them as a run without ``--fix`` does."""
    folder = tmp_path / "project"
    shutil.copytree(PROJECTS / "handed_trainer", folder)
    results = _lint_all(sorted(folder.glob("*.py")), EVERY_RULE, True, 1, False, None)
    left = {(Path(r.path).name, f.line, f.code): f.message for r in results for f in r.findings}
    assert "train.py:21 calls accuracy()" in left[("evaluation.py", 11, "ACC403")]


def test_a_module_linted_alone_knows_nothing_its_callers_hand_it():
    """Without train.py among the linted files, trainer.py's model is a parameter like any
    other: nothing is reported (the facts come only from calls that are read)."""
    for name in ("trainer.py", "evaluation.py"):
        path = PROJECTS / "handed_trainer" / name
        assert lint_source(path.read_bytes(), str(path), EVERY_RULE, importers=()).findings == []


def test_the_accelerator_of_another_modules_factory_is_known_when_linting_one_file():
    path = PROJECTS / "factory_only_shared_members" / "report.py"
    found = lint_source(path.read_bytes(), str(path), EVERY_RULE, importers=())
    assert [(f.line, f.code) for f in found.findings] == [(14, "ACC202")]
    # read alone (no project: `lint_source`'s default), ``state`` proves nothing
    assert lint_source(path.read_bytes(), str(path), EVERY_RULE).no_accelerator


def test_processes_report_what_one_process_reports():
    folder = PROJECTS / "handed_trainer"
    assert reported(folder, jobs=2) == reported(folder)


def test_a_change_in_the_calling_module_lints_the_called_module_again(tmp_path: Path):
    folder = tmp_path / "project"
    shutil.copytree(PROJECTS / "handed_trainer", folder)
    cache = open_cache(tmp_path / "cache", EVERY_RULE)
    assert ("trainer.py", 23, "ACC503") in reported(folder, cache=cache)
    assert ("trainer.py", 23, "ACC503") in reported(folder, cache=cache)  # warm
    train = folder / "train.py"
    # a second construction hands a model nobody prepared: the calls no longer agree
    train.write_text(
        train.read_text().replace(
            "    trainer.fit(3)\n",
            "    trainer.fit(3)\n    Trainer(accelerator, torch.nn.Linear(8, 2), optimizer, [])\n",
        )
    )
    warm = reported(folder, cache=cache)
    assert ("trainer.py", 23, "ACC503") not in warm
    assert warm == reported(folder)


def test_a_change_in_a_module_the_caller_imports_lints_the_called_module_again(tmp_path: Path):
    """trainer.py's finding comes from what train.py hands it, and train.py's accelerator from
    setup_util's factory: a module trainer.py neither imports nor is imported by. The cache
    entry holds the digest of every module read, so a factory that no longer builds an
    Accelerator lints trainer.py again (the cached run says what ``--no-cache`` says)."""
    folder = tmp_path / "project"
    shutil.copytree(PROJECTS / "accelerator_kept_under_another_name", folder)
    cache = open_cache(tmp_path / "cache", EVERY_RULE)
    assert ("trainer.py", 9, "ACC202") in reported(folder, cache=cache)
    assert ("trainer.py", 9, "ACC202") in reported(folder, cache=cache)  # warm
    factory = folder / "setup_util.py"
    factory.write_text(factory.read_text().replace("Accelerator()", "object()"))
    warm = reported(folder, cache=cache)
    assert ("trainer.py", 9, "ACC202") not in warm
    assert warm == reported(folder)
    factory.write_text(factory.read_text().replace("object()", "Accelerator()"))
    assert ("trainer.py", 9, "ACC202") in reported(folder, cache=cache)


def test_a_function_the_module_calls_itself_carries_nothing(tmp_path: Path):
    """evaluation.py's own ``smoke_test`` calls ``predict`` with a loader nobody prepared: its
    call sites speak for it, so what train.py hands ``predict`` (a prepared loader, on every
    rank) is not carried, and no message says it was."""
    folder = tmp_path / "project"
    shutil.copytree(PROJECTS / "handed_trainer", folder)
    evaluation = folder / "evaluation.py"
    evaluation.write_text(
        evaluation.read_text()
        + "\n\ndef smoke_test(accelerator, model):\n"
        + "    loader = torch.utils.data.DataLoader(torch.randn(32, 8), batch_size=8)\n"
        + "    return predict(accelerator, model, loader)\n"
    )
    found = reported(folder)
    assert ("evaluation.py", 21, "ACC404") not in found
    assert not any("calls predict()" in message for message in found.values())
    assert ("evaluation.py", 11, "ACC403") in found  # accuracy() is still train.py's alone


def test_a_call_under_a_rank_test_carries_nothing(tmp_path: Path):
    folder = tmp_path / "project"
    shutil.copytree(PROJECTS / "handed_trainer", folder)
    train = folder / "train.py"
    train.write_text(
        train.read_text().replace(
            "    trainer = Trainer(",
            "    if accelerator.is_main_process:\n        trainer = Trainer(",
        )
    )
    assert ("trainer.py", 23, "ACC503") not in reported(folder)


def test_project_modules_resolve_as_python_would_find_them(tmp_path: Path):
    package = tmp_path / "src" / "pkg"
    (package / "engine").mkdir(parents=True)
    for name in ("__init__.py", "utils.py", "engine/__init__.py", "engine/loop.py"):
        (package / name).write_text("")
    (tmp_path / "src" / "scripts").mkdir()
    script = package / "engine" / "loop.py"
    assert module_file(script, "..utils") == package / "utils.py"
    assert module_file(script, ".") is None
    assert module_file(package / "utils.py", ".engine") == package / "engine" / "__init__.py"
    assert module_file(script, "pkg.utils") == package / "utils.py"  # from the package root
    assert module_file(script, "torch.nn") is None  # a library: no file of the project
    assert module_file(package / "utils.py", "utils") is None  # never the file itself
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train_util.py").write_text("")
    assert module_file(folder / "train.py", "project.train_util") == folder / "train_util.py"


def test_a_package_beside_the_scripts_folder_is_the_projects(tmp_path: Path):
    """``scripts/train.py`` importing ``src.train_eval`` (``src/`` beside ``scripts/``, the
    project root put on sys.path or ``python -m scripts.train``) names ``src/train_eval.py``;
    a library it imports still names no file, nor a package too far up."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train_eval.py").write_text("")
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "train.py"
    assert module_file(script, "src.train_eval") == tmp_path / "src" / "train_eval.py"
    assert module_file(script, "src.missing") is None
    assert module_file(script, "torch.nn") is None
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    assert module_file(deep / "train.py", "src.train_eval") is None  # three folders up


def test_importers_are_the_linted_files_that_import_a_module(tmp_path: Path):
    (tmp_path / "trainer.py").write_text("import torch\n")
    (tmp_path / "train.py").write_text("from trainer import Trainer\nfrom . import utils\n")
    (tmp_path / "utils.py").write_text("import trainer as t\n")
    files = sorted(tmp_path.glob("*.py"))
    found = importers_of(files, read)
    assert found[tmp_path / "trainer.py"] == [tmp_path / "train.py", tmp_path / "utils.py"]
    assert found[tmp_path / "utils.py"] == [tmp_path / "train.py"]
    assert tmp_path / "train.py" not in found


def test_a_method_is_named_with_its_class():
    messages = reported(PROJECTS / "method_of_a_handed_instance")
    assert (
        "train.py:15 calls Trainer.evaluate() with loader a prepared dataloader"
        in (messages[("trainer.py", 15, "ACC403")])
    )


def test_the_called_module_is_linted_again_only_when_what_it_is_handed_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """trainer.py's findings are keyed on what train.py's calls hand it (the facts), not on
    train.py's text: a change in train.py that hands the same lints train.py alone; one that
    moves its calls lints trainer.py again, whose message names the new line."""
    from accelify.lint import cli

    folder = tmp_path / "project"
    shutil.copytree(PROJECTS / "handed_trainer", folder)
    cache = open_cache(tmp_path / "cache", EVERY_RULE)
    linted: list[str] = []

    def counted(data, path, *args, **kwargs):
        linted.append(Path(path).name)
        return lint_source(data, path, *args, **kwargs)

    monkeypatch.setattr(cli, "lint_source", counted)
    cold = reported(folder, cache=cache)
    assert sorted(linted) == ["evaluation.py", "train.py", "trainer.py"]  # each analysed once
    linted.clear()
    assert reported(folder, cache=cache) == cold and linted == []
    train = folder / "train.py"
    train.write_text(train.read_text() + "# a comment below the calls\n")
    assert reported(folder, cache=cache) == cold and linted == ["train.py"]
    linted.clear()
    train.write_text("# a line above the calls\n" + train.read_text())
    moved = reported(folder, cache=cache)
    assert sorted(linted) == ["evaluation.py", "train.py", "trainer.py"]
    assert "train.py:20 calls Trainer with" in moved[("trainer.py", 23, "ACC503")]
    monkeypatch.undo()
    assert moved == reported(folder)  # what --no-cache says


def test_facts_reach_a_module_in_an_import_cycle(tmp_path: Path):
    """train.py imports helpers.py, which imports train.py back: one of the two waits for
    the other; the one that cannot wait reads the other's analysis itself. The same findings
    whatever the order and the number of processes."""
    (tmp_path / "helpers.py").write_text(
        "import train\n\n\n"
        "def accuracy(accelerator, model, loader):\n"
        "    correct, total = 0, 0\n"
        "    for batch in loader:\n"
        "        correct += (model(batch).argmax(-1) == train.LABEL).sum().item()\n"
        "        total += len(batch)\n"
        "    return correct / total\n"
    )
    (tmp_path / "train.py").write_text(
        (PROJECTS / "helper_naming_no_accelerator" / "train.py")
        .read_text()
        .replace("from scoring import score", "from helpers import accuracy\n\nLABEL = 0")
        .replace("score(accelerator, model, loader)", "accuracy(accelerator, model, loader)")
    )
    files = sorted(tmp_path.glob("*.py"))
    found = set()
    for order in (files, files[::-1]):
        for jobs in (1, 2):
            results = _lint_all(order, EVERY_RULE, False, jobs, False, None)
            found.add(
                frozenset((Path(r.path).name, f.line, f.code) for r in results for f in r.findings)
            )
    assert found == {frozenset({("helpers.py", 8, "ACC403")})}


def test_every_project_together_on_two_processes_reports_what_one_reports():
    files = sorted(PROJECTS.rglob("*.py"))
    one = _lint_all(files, EVERY_RULE, False, 1, False, None)
    two = _lint_all(files, EVERY_RULE, False, 2, False, None)
    assert [(r.path, [(f.line, f.code, f.message) for f in r.findings]) for r in one] == [
        (r.path, [(f.line, f.code, f.message) for f in r.findings]) for r in two
    ]


def test_an_accelerator_built_elsewhere_is_not_called_ddp_only():
    """ACC104 on a model prepared by an Accelerator another module's factory builds (with a
    DeepSpeedPlugin there on some runs): the message names DeepSpeed's engine, not
    DistributedDataParallel only."""
    folder = PROJECTS / "accelerator_factory_of_another_module_maybe_deepspeed"
    message = reported(folder)[("train.py", 19, "ACC104")]
    assert "only when several processes" not in message
    assert "DeepSpeed" in message


def test_an_accelerator_from_an_unread_factory_is_not_called_ddp_only(tmp_path: Path):
    """The same script alone, its factory's module out of reach: nothing says which backend
    the Accelerator sets up, so the message does not say DistributedDataParallel only."""
    source = PROJECTS / "accelerator_factory_of_another_module_deepspeed_good" / "train.py"
    path = tmp_path / "train.py"
    shutil.copy(source, path)
    found = lint_source(path.read_bytes(), str(path), EVERY_RULE, importers=()).findings
    messages = [f.message for f in found if f.code == "ACC104"]
    assert len(messages) == 1
    assert "only when several processes" not in messages[0]
    assert "built elsewhere" in messages[0]


def test_a_prompt_in_a_helper_module_is_reported_at_the_call_naming_the_input():
    """prompts.py names no accelerator and is never linted alone: its input() is reported at
    the training script's call of the helper, the place of the fix, naming the helper's line."""
    message = reported(PROJECTS / "prompt_in_a_helper_module")[("train.py", 15, "ACC216")]
    assert "confirm_overwrite(), which asks input() (prompts.py:2)" in message
    assert (
        "[confirm_overwrite(args.output_dir) if accelerator.is_main_process else None]" in message
    )


def test_a_dict_of_batch_stats_is_advised_a_reduce_of_each_value():
    """nanoT5's ``averager.update(stats)``: the advice reduces the dict's values over the ranks
    (the fix `averaged_eval_reduced_good` applies), not a gather of predictions and labels."""
    message = reported(PROJECTS / "averaged_eval_handed_on")[("loops.py", 21, "ACC403")]
    assert message.startswith("Reduce `stats` over the ranks before folding it in")
    assert 'accelerator.reduce(torch.tensor(v, device=accelerator.device), "mean")' in message


@pytest.mark.parametrize(
    "folder, line", [("stats_dict_cond_keys", 17), ("stats_dict_nonscalar", 29)]
)
def test_a_dict_of_changing_keys_or_of_strings_is_advised_the_gather(folder: str, line: int):
    """A reduce per key hangs where one rank adds a key (``if loss > 10: stats["spike"] =
    1.0``), and raises on a string or a list: only a dict of fixed keys and scalar values is
    advised the reduce (review8a)."""
    message = reported(PROJECTS / folder)[("evaluate.py", line, "ACC403")]
    assert message.startswith("Gather before accumulating the metric")
    assert ".reduce(" not in message


def test_a_prompting_helper_that_runs_collectives_is_advised_to_ask_inside():
    """Wrapping evaluate_and_confirm() in ``if accelerator.is_main_process`` would leave its
    all_reduce and the model's forward to the main process alone (a hang): the advice goes to
    the input() inside the helper (review8a)."""
    folder = PROJECTS / "prompt_in_a_helper_running_collectives"
    message = reported(folder)[("train.py", 17, "ACC216")]
    assert "inside the helper" in message
    assert "at utils.py:15" in message
    assert "evaluate_and_confirm(model, eval_loader) if" not in message


def test_a_caller_module_that_cannot_be_decoded_leaves_the_helper_reported(tmp_path: Path):
    """ACC403 reads the importing modules' text for other names of a helper it would take as
    gathered by its callers: one that cannot be decoded is unread (the helper stays reported),
    not an internal error of the helper's file (review9a)."""
    folder = tmp_path / "project"
    shutil.copytree(PROJECTS / "helper_metric_gathered_by_its_callers_good", folder)
    (folder / "report.py").write_bytes(b'import utils\ns = "\xff"\nx = utils.evaluate(m, l)\n')
    results = _lint_all(sorted(folder.glob("*.py")), EVERY_RULE, False, 1, False, None)
    assert all(not result.error for result in results), [r.error for r in results]
    assert ("utils.py", 13, "ACC403") in reported(folder)


def test_a_grad_scaler_beside_a_handed_accelerator_names_the_line_that_makes_it():
    """trainer.py is handed train.py's ``Accelerator(mixed_precision="fp16")``: ACC504 names
    that line, where the precision is changed, instead of an accelerator "made elsewhere"."""
    messages = reported(PROJECTS / "grad_scaler_beside_a_handed_fp16_accelerator")
    message = messages[("trainer.py", 9, "ACC504")]
    assert "made elsewhere" not in message
    assert "the Accelerator made at train.py:7 has mixed_precision 'fp16'" in message
    assert "make the mixed_precision of the Accelerator made at train.py:7 'no'" in message


def test_per_token_logprobs_of_a_helper_module_name_where_the_padding_is_made():
    """common_dpo: train.py's ``encode`` returns the padded ids and mask as a tuple, and
    ``token_logprobs`` of logprobs.py turns them into one log-probability per token: ACC413
    reports the gather, naming the tokenizer call and both helpers."""
    messages = reported(PROJECTS / "per_token_logprobs_from_a_helper_module_gathered")
    message = messages[("train.py", 19, "ACC413")]
    assert "tokenized with padding=True at line 8, from encode() at line 6" in message
    assert "from token_logprobs() at logprobs.py:4" in message
    assert "chosen_logps = accelerator.pad_across_processes(chosen_logps, dim=1)" in message


def test_an_accelerator_handed_on_through_a_module_names_where_it_is_made():
    """trainer.py hands engine.py the accelerator train.py made and handed it: the finding in
    engine.py knows its mixed_precision and names train.py's line, where it is changed."""
    messages = reported(PROJECTS / "grad_scaler_two_modules_from_an_fp16_accelerator")
    assert "made at train.py:9 has mixed_precision 'fp16'" in messages[("engine.py", 7, "ACC504")]
    factory = reported(PROJECTS / "grad_scaler_beside_an_fp16_accelerator_of_a_factory")
    assert (
        "made at setup_util.py:6 has mixed_precision 'fp16'" in factory[("train.py", 14, "ACC504")]
    )
