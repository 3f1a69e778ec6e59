"""Training that runs in another file of the project (``train.py`` calls ``engine.py``'s
``train_one_epoch``): the entry script is not "not a training script"; each call that reaches a
sibling module's backward gets a review line naming that file and line, and neither file is
changed (the conversion reads one file at a time)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import libcst as cst
import pytest

from accelify.convert import Options
from accelify.convert.conversion import Conversion
from accelify.convert.files import collect, convert_all
from conftest import FIXTURES, assert_ok, launch, run_accelify, run_python

PROJECT = FIXTURES / "projects" / "trains_in_a_sibling_module"


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(PROJECT, tmp_path / "project")
    return tmp_path / "project"


def test_the_entry_script_is_reviewed_at_the_call_into_the_module_that_trains(tmp_path: Path):
    project = _copy(tmp_path)
    (result,) = convert_all(list(collect([project / "train.py"])), Options(), 1)
    assert not result.changed
    assert "trains through train_one_epoch() of another module" in result.skipped
    (review,) = result.reviews
    assert review.line == 18  # train_one_epoch(model, train_loader, optimizer, criterion)
    assert "train_one_epoch() trains in engine.py (its .backward() at line 10)" in review.text


def test_a_directory_converts_the_driver_and_its_engine_together(tmp_path: Path):
    project = _copy(tmp_path)
    result = run_accelify("convert", project, "--write")
    assert_ok(result)
    train = (project / "train.py").read_text()
    engine = (project / "engine.py").read_text()
    assert "accelerator = Accelerator()" in train
    assert "model, train_loader, optimizer, criterion, accelerator=accelerator" in train
    assert "evaluate(model, val_loader, accelerator=accelerator)" in train
    assert "def train_one_epoch(model, loader, optimizer, criterion, accelerator):" in engine
    assert "accelerator.backward(loss)" in engine
    assert "accelerator.gather_for_metrics((outputs, y))" in engine
    assert "engine.py:10: loss.backward() -> accelerator.backward(loss)" in result.stdout


def test_a_driver_and_its_engine_converted_together_keep_the_marks_of_their_reviews(
    tmp_path: Path,
):
    """The two files are converted as one script and its notes are given back to each file
    with their lines renumbered: the mark `accelify verify` reads goes with them."""
    from accelify.verify.review_notes import differs_on_n_ranks

    project = _copy(tmp_path)
    results = convert_all(list(collect([project])), Options(), 1)
    marked = {
        (Path(result.path).name, note.line)
        for result in results
        for note in result.reviews
        if differs_on_n_ranks(note)
    }
    assert marked == {("train.py", 20), ("engine.py", 13)}


_FIT_THROUGH_AN_ALIAS = """

def fit(model, train_loader, val_loader, optimizer, criterion, epochs):
    step = train_one_epoch
    for epoch in range(epochs):
        loss = step(model, train_loader, optimizer, criterion)
        acc = evaluate(model, val_loader)
        print(f"epoch {epoch} loss {loss:.4f} acc {acc:.4f}")
"""


def test_an_engine_that_trains_through_a_local_alias_is_converted_with_its_driver(
    tmp_path: Path,
):
    """``step = train_one_epoch`` then ``step(...)`` in the engine's ``fit()``, called at the
    driver's top level: the alias is followed (its calls are the function's callers), so both
    files are converted and each call hands the accelerator on. It was converted alone before,
    an ``Accelerator()`` inside ``train_one_epoch`` and nothing prepared."""
    project = _copy(tmp_path)
    engine = project / "engine.py"
    engine.write_text(engine.read_text() + _FIT_THROUGH_AN_ALIAS)
    driver = (PROJECT / "train.py").read_text()
    body = driver.split("def main():\n")[1].split("    for epoch")[0]
    top = "\n".join(line.removeprefix("    ") for line in body.splitlines())
    head = driver.split("def main():")[0].replace("evaluate, train_one_epoch", "fit")
    (project / "train.py").write_text(
        f"{head}{top}\nfit(model, train_loader, val_loader, optimizer, criterion, 2)\n"
    )
    original = run_python(project / "train.py", cwd=project)
    assert_ok(original)
    result = run_accelify("convert", project, "--write")
    assert_ok(result)
    converted = engine.read_text()
    assert "def train_one_epoch(model, loader, optimizer, criterion, accelerator):" in converted
    assert "step(model, train_loader, optimizer, criterion, accelerator=accelerator)" in converted
    assert "accelerator.gather_for_metrics((outputs, y))" in converted
    assert "Accelerator()" not in converted
    train = (project / "train.py").read_text()
    assert "model, optimizer, train_loader, val_loader = accelerator.prepare(" in train
    assert "fit(model, train_loader, val_loader, optimizer, criterion, 2, accelerator=" in train
    one = run_python(project / "train.py", cwd=project)
    assert_ok(one)
    assert one.stdout == original.stdout
    two = launch(project / "train.py", cwd=project)
    assert_ok(two)
    # gathered, the 64 samples all count; one rank's 32 over len(dataset) would be <= 0.5
    accuracies = [float(a) for a in re.findall(r"acc (\d\.\d+)", two.stdout)]
    assert len(accuracies) == 2
    assert all(a > 0.5 for a in accuracies), two.stdout


def test_data_a_sibling_helper_writes_and_returns_is_built_by_the_main_process_first(
    tmp_path: Path,
):
    """``vocab = build_vocab(texts, save_path="out/vocab.pkl")`` of the project's own module,
    which pickles what it returns: every rank needs the value, and run by every rank at once
    each would write the file while another is writing it. Converted, the main process builds
    it first under ``main_process_first()``; a call handed the model is not touched."""
    project = _copy(tmp_path)
    (project / "prep.py").write_text(
        "import os\nimport pickle\n\n\n"
        "def build_vocab(texts, save_path=None):\n"
        "    vocab = {w: i for i, w in enumerate(sorted({w for t in texts for w in t.split()}))}\n"
        "    if save_path:\n"
        "        os.makedirs(os.path.dirname(save_path), exist_ok=True)\n"
        "        with open(save_path, 'wb') as f:\n"
        "            pickle.dump(vocab, f)\n"
        "    return vocab\n"
    )
    train = project / "train.py"
    driver = train.read_text().replace(
        "from engine import", "from prep import build_vocab\nfrom engine import"
    )
    driver = driver.replace(
        "    model = nn.Linear(4, 2)\n",
        '    texts = ["a b", "b c"]\n'
        '    vocab = build_vocab(texts, save_path="out/vocab.pkl")\n'
        "    model = nn.Linear(4 + 0 * len(vocab), 2)\n",
    )
    train.write_text(driver)
    original = run_python(train, cwd=project)
    assert_ok(original)
    result = run_accelify("convert", project, "--write")
    assert_ok(result)
    converted = train.read_text()
    assert (
        "    with accelerator.main_process_first():\n"
        '        vocab = build_vocab(texts, save_path="out/vocab.pkl")\n'
    ) in converted
    assert converted.index("accelerator = Accelerator()") < converted.index("main_process_first")
    assert "train.py:16: build_vocab(...) writes a file" in result.stdout
    one = run_python(train, cwd=project)
    assert_ok(one)
    assert one.stdout == original.stdout


def test_a_script_of_a_scripts_folder_converts_with_the_package_beside_it(tmp_path: Path):
    """``scripts/train.py`` imports ``src.engine``, a package beside ``scripts/`` (run as
    ``python -m scripts.train`` from the root): ``accelify convert .`` at the root finds the
    engine and converts the two together, as it does a module beside the script."""
    root = tmp_path / "root"
    (root / "scripts").mkdir(parents=True)
    (root / "src").mkdir()
    (root / "src" / "__init__.py").write_text("")
    shutil.copy(PROJECT / "engine.py", root / "src" / "engine.py")
    driver = (PROJECT / "train.py").read_text()
    assert "from engine import" in driver
    (root / "scripts" / "train.py").write_text(driver.replace("from engine", "from src.engine"))
    result = run_accelify("convert", root, "--write")
    assert_ok(result)
    train = (root / "scripts" / "train.py").read_text()
    engine = (root / "src" / "engine.py").read_text()
    assert "accelerator = Accelerator()" in train
    assert "evaluate(model, val_loader, accelerator=accelerator)" in train
    assert "accelerator.backward(loss)" in engine


def test_a_module_that_trains_through_a_class_is_followed_to_its_method(tmp_path: Path):
    project = _copy(tmp_path)
    (project / "engine.py").write_text(
        "class Engine:\n"
        "    def step(self, model, x, y, optimizer):\n"
        "        optimizer.zero_grad()\n"
        "        loss = ((model(x) - y) ** 2).mean()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
    )
    (project / "train.py").write_text(
        "import torch\n"
        "from engine import Engine\n"
        "\n"
        "model = torch.nn.Linear(2, 1)\n"
        "engine = Engine()\n"
    )
    (result,) = convert_all(list(collect([project / "train.py"])), Options(), 1)
    (review,) = result.reviews
    assert review.line == 5
    assert "its .backward() at line 5" in review.text


def test_a_script_that_imports_a_module_without_training_is_still_skipped(tmp_path: Path):
    project = _copy(tmp_path)
    (project / "engine.py").write_text("def train_one_epoch(*args):\n    return 0.0\n")
    (result,) = convert_all(list(collect([project / "train.py"])), Options(), 1)
    assert result.skipped == "no .backward() call: not a training script"
    assert not result.reviews


WRITES = FIXTURES / "projects" / "writes_through_a_sibling_module"


def test_calls_of_a_sibling_module_that_only_writes_run_on_the_main_process(tmp_path: Path):
    shutil.copytree(WRITES, tmp_path / "project")
    (result,) = convert_all(list(collect([tmp_path / "project" / "train.py"])), Options(), 1)
    converted = result.converted.decode()
    # known by what they do (open/json.dump, a bare open and write), not by their names
    assert (
        "        if accelerator.is_main_process:\n"
        '            utils.write_log("train.log", f"epoch {epoch} loss {total:.4f}")\n'
    ) in converted
    assert (
        '    if accelerator.is_main_process:\n        dump_results({"loss": total})\n' in converted
    )
    changes = {note.text for note in result.changes}
    assert "dump_results(...) runs on the main process only (it only writes files: utils.py:4)" in (
        changes
    )
    # summarize() changes the list it is handed: every rank runs it
    assert "    utils.summarize(history)\n" in converted
    # save_everything() is handed the model: left for its review line (unwrap, barrier)
    assert '    utils.save_everything(model, "model.txt")\n' in converted
    assert any("utils.save_everything()" in note.text for note in result.reviews)
    assert (tmp_path / "project" / "utils.py").read_bytes() == (WRITES / "utils.py").read_bytes()


def test_a_sibling_writer_handed_a_loader_runs_on_every_rank(tmp_path: Path):
    # iterating a prepared loader synchronises the ranks: on the main process alone it would hang
    project = tmp_path / "project"
    shutil.copytree(WRITES, project)
    (project / "utils.py").write_text(
        "import json\n\n\ndef dump_sizes(loader, path):\n"
        "    with open(path, 'w') as f:\n"
        "        json.dump([len(x) for x, _ in loader], f)\n"
    )
    train = (project / "train.py").read_text()
    train = train.replace("from utils import dump_results", "from utils import dump_sizes")
    train = train.replace('dump_results({"loss": total})', 'dump_sizes(loader, "sizes.json")')
    (project / "train.py").write_text(train)
    (result,) = convert_all(list(collect([project / "train.py"])), Options(), 1)
    assert '\n    dump_sizes(loader, "sizes.json")\n' in result.converted.decode()


def test_a_sibling_writer_that_changes_a_module_global_or_raises_runs_on_every_rank(
    tmp_path: Path,
):
    # a list the other ranks read, or a raise that would stop the main process alone: guarded,
    # the ranks would drift apart or wait on rank 0
    for body in (
        "    SEEN.append(line)\n",
        "    if line != line:\n        raise ValueError(line)\n",
    ):
        project = tmp_path / f"project{len(body)}"
        shutil.copytree(WRITES, project)
        utils = (WRITES / "utils.py").read_text()
        utils = "SEEN = []\n" + utils.replace(
            "def write_log(path, line):\n", "def write_log(path, line):\n" + body
        )
        (project / "utils.py").write_text(utils)
        (result,) = convert_all(list(collect([project / "train.py"])), Options(), 1)
        converted = result.converted.decode()
        assert '\n        utils.write_log("train.log", f"epoch {epoch} loss {total:.4f}")\n' in (
            converted
        )
        assert "if accelerator.is_main_process:\n            utils.write_log(" not in converted
        # the helper that only writes is still guarded
        assert "    if accelerator.is_main_process:\n        dump_results(" in converted


LOADERS = FIXTURES / "projects" / "loaders_from_a_sibling_module"


def test_loaders_a_sibling_module_makes_are_prepared_and_their_evaluations_gathered(
    tmp_path: Path,
):
    shutil.copytree(LOADERS, tmp_path / "project")
    (result,) = convert_all(list(collect([tmp_path / "project" / "train.py"])), Options(), 1)
    # a method of an instance of the module's class, and a function of the module
    assert result.prepared == ["model", "optimizer", "train_loader", "val_loader", "test_loader"]
    converted = result.converted.decode()
    assert "outputs, targets = accelerator.gather_for_metrics((outputs, targets))" in converted
    assert not any("DataLoader" in note.text for note in result.reviews)


def test_loaders_of_a_sibling_module_are_not_followed_without_the_file(tmp_path: Path):
    # the same source converted alone (no data.py beside it): nothing says what the calls make
    source = (LOADERS / "train.py").read_bytes()
    (tmp_path / "train.py").write_bytes(source)
    (result,) = convert_all(list(collect([tmp_path / "train.py"])), Options(), 1)
    assert result.prepared == ["model", "optimizer"]
    assert "gather_for_metrics" not in result.converted.decode()


@pytest.mark.distributed
def test_loaders_of_a_sibling_module_train_sharded_on_two_ranks(tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(LOADERS, project)
    assert_ok(run_accelify("convert", project / "train.py", "-o", project / "converted.py"))
    result = run_accelify(
        "verify",
        project / "train.py",
        project / "converted.py",
        "--to-end",
        cwd=tmp_path,
        timeout=400,
    )
    assert_ok(result)
    assert "verdict: PASS" in result.stdout
    assert re.search(r"all [1-9]\d* printed lines identical", result.stdout), result.stdout


LOADER_DICT = FIXTURES / "projects" / "loaders_dict_from_a_sibling_module"


def test_a_dict_of_loaders_a_sibling_module_returns_is_prepared_loader_by_loader(
    tmp_path: Path,
):
    """``loaders = make_loaders(8)`` of data.py, which returns ``{"train": DataLoader(...),
    "val": DataLoader(...)}``: analysed as a dict made here, each loader is prepared where the
    dict is received (handed to prepare whole, the dict would come back untouched: nothing
    sharded, and the gathered evaluation would count each sample once per rank)."""
    shutil.copytree(LOADER_DICT, tmp_path / "project")
    (result,) = convert_all(list(collect([tmp_path / "project" / "train.py"])), Options(), 1)
    converted = result.converted.decode()
    assert (
        "    loaders = make_loaders(batch_size=8)\n"
        "    loaders = {key: accelerator.prepare(loader) for key, loader in loaders.items()}\n"
    ) in converted
    assert "model, optimizer = accelerator.prepare(model, optimizer)" in converted
    assert "accelerator.gather_for_metrics((outputs, y))" in converted
    assert not result.reviews


def test_a_dict_of_dicts_of_loaders_a_sibling_module_returns_is_left_with_why(tmp_path: Path):
    # ``{"a": {"train": ..., "val": ...}}``: prepare hands each inner dict back untouched too
    project = tmp_path / "project"
    shutil.copytree(LOADER_DICT, project)
    data = (project / "data.py").read_text()
    (project / "data.py").write_text(data.replace("return loaders", 'return {"a": loaders}'))
    train = (project / "train.py").read_text()
    (project / "train.py").write_text(train.replace('loaders["', 'loaders["a"]["'))
    (result,) = convert_all(list(collect([project / "train.py"])), Options(), 1)
    converted = result.converted.decode()
    assert "loaders.items()" not in converted
    assert "accelerator.prepare(model, optimizer)" in converted
    assert "gather_for_metrics" not in converted  # every rank evaluates the whole set
    assert any(
        review.line == 9 and "loaders is a dict of dicts of DataLoaders" in review.text
        for review in result.reviews
    )


@pytest.mark.distributed
def test_a_dict_of_loaders_of_a_sibling_module_trains_sharded_on_two_ranks(tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(LOADER_DICT, project)
    assert_ok(run_accelify("convert", project / "train.py", "-o", project / "converted.py"))
    result = run_accelify(
        "verify",
        project / "train.py",
        project / "converted.py",
        "--to-end",
        cwd=tmp_path,
        timeout=400,
    )
    assert_ok(result)
    assert "verdict: PASS" in result.stdout
    assert "all 2 printed lines identical" in result.stdout, result.stdout
    assert "losses differ per shard" in result.stdout


TRAINER = FIXTURES / "projects" / "trainer_class_in_a_sibling_module"


def test_a_trainer_class_handed_everything_by_another_file_is_left_with_why(tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(TRAINER, project)
    before = {p.name: p.read_bytes() for p in project.iterdir()}
    results = {
        r.path.rsplit("/", 1)[-1]: r for r in convert_all(list(collect([project])), Options(), 1)
    }
    trainer, run = results["trainer.py"], results["run.py"]
    assert not trainer.changed and not run.changed
    (review,) = trainer.reviews
    assert review.line == 38  # loss.backward()
    assert "ModelTrainer trains a model and optimizer made elsewhere and handed in" in review.text
    assert "each rank would train its own copy" in review.text
    (review,) = run.reviews
    assert "ModelTrainer() trains in trainer.py (its .backward() at line 38)" in review.text
    assert {p.name: p.read_bytes() for p in project.iterdir()} == before


def test_a_trainer_class_this_file_builds_or_is_handed_a_model_is_converted(tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(TRAINER, project)
    source = (TRAINER / "trainer.py").read_text()
    # built here: the file owns its training
    (project / "trainer.py").write_text(
        source + "\n\nModelTrainer(torch.nn.Linear(4, 1), 'cpu', 'm.pth').train(1)\n"
    )
    (result,) = convert_all(list(collect([project / "trainer.py"])), Options(), 1)
    assert result.changed
    # an optimizer the constructor makes over the model it keeps: prepared there, and the
    # other file's calls run as they are
    made = source.replace(
        "        self.optimizer = None\n",
        "        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.05)\n",
    )
    (project / "trainer.py").write_text(made)
    (result,) = convert_all(list(collect([project / "trainer.py"])), Options(), 1)
    assert result.prepared == ["self.model", "self.optimizer"]


STEPS = FIXTURES / "projects" / "model_steps_defined_in_a_sibling_module"


def test_a_model_step_of_a_sibling_class_that_runs_its_forward_is_left_with_why(tmp_path: Path):
    # fit.py calls model.training_step(), which litmodel.py defines and which runs self(x):
    # through unwrap_model DDP's forward never runs and the gradients are never averaged
    project = tmp_path / "project"
    shutil.copytree(STEPS, project)
    (result,) = convert_all(list(collect([project / "fit.py"])), Options(), 1)
    assert not result.changed
    (review,) = result.reviews
    assert review.line == 16  # loss = model.training_step(batch, i)
    assert "model.training_step() (defined at litmodel.py:16)" in review.text
    assert "runs the model's layers outside its forward during training" in review.text
    # validation_step runs under no_grad: nothing of it reaches a backward, no review there


def test_a_model_step_of_a_class_the_conversion_cannot_read_gets_a_review_line(tmp_path: Path):
    # without litmodel.py the method cannot be read: kept through unwrap_model, and the loop
    # never calls the prepared model itself, so the review line says what that would cost
    project = tmp_path / "project"
    shutil.copytree(STEPS, project)
    (project / "litmodel.py").unlink()
    (result,) = convert_all(list(collect([project / "fit.py"])), Options(), 1)
    assert result.changed
    (review,) = [r for r in result.reviews if r.line == 16]
    assert "model.training_step() is a method of a model class this conversion cannot read" in (
        review.text
    )
    assert "the gradients are never averaged across ranks" in review.text


def test_an_optimizer_a_sibling_factory_makes_with_the_loaders_is_prepared_with_them(
    tmp_path: Path,
):
    project = tmp_path / "project"
    shutil.copytree(LOADERS, project)
    (project / "cfg.py").write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n\n\n"
        "def init_config(model, bsz, lr):\n"
        "    x = torch.randn(64, 4)\n"
        "    ds = TensorDataset(x, (x.sum(1) > 0).long())\n"
        "    train_loader = DataLoader(ds, batch_size=bsz, shuffle=True)\n"
        "    valid_loader = DataLoader(ds, batch_size=bsz)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=lr)\n"
        "    return train_loader, valid_loader, optimizer, torch.nn.CrossEntropyLoss()\n"
    )
    (project / "train.py").write_text(
        "import torch\n"
        "from cfg import init_config\n\n"
        "model = torch.nn.Linear(4, 2)\n"
        "train_loader, valid_loader, optimizer, criterion = init_config(model, 8, 0.1)\n"
        "for x, y in train_loader:\n"
        "    optimizer.zero_grad()\n"
        "    criterion(model(x), y).backward()\n"
        "    optimizer.step()\n"
    )
    (result,) = convert_all(list(collect([project / "train.py"])), Options(), 1)
    # the loss module it also returns is no object prepare takes
    assert result.prepared == ["model", "optimizer", "train_loader", "valid_loader"]
    assert not result.reviews


CONFIGURED = FIXTURES / "projects" / "config_and_factories_in_a_sibling_module"


def test_an_optimizer_factory_handed_the_config_first_prepares_the_model_it_is_handed(
    tmp_path: Path,
):
    # ``build_optimizer(cfg, model)`` of config.py: the model is the name the script uses as one
    # (``build_model(cfg).to(device)``, ``model.load_state_dict``), not the config before it
    shutil.copytree(CONFIGURED, tmp_path / "project")
    (result,) = convert_all(list(collect([tmp_path / "project" / "train.py"])), Options(), 1)
    assert result.prepared == ["model", "optimizer", "train_loader", "val_loader"]
    converted = result.converted.decode()
    assert "unwrap_model(cfg)" not in converted
    assert "logits, targets = accelerator.gather_for_metrics((logits, targets))" in converted


@pytest.mark.distributed
def test_a_project_configured_by_a_dataclass_trains_in_step_on_two_ranks(tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(CONFIGURED, project)
    assert_ok(run_accelify("convert", project / "train.py", "-o", project / "converted.py"))
    result = run_accelify(
        "verify",
        project / "train.py",
        project / "converted.py",
        "--to-end",
        cwd=tmp_path,
        timeout=400,
    )
    assert_ok(result)
    assert "verdict: PASS" in result.stdout
    assert re.search(r"all [1-9]\d* printed lines identical", result.stdout), result.stdout


BUILDS = FIXTURES / "projects" / "trainer_class_builds_everything"


def _converted_together(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    project = tmp_path / "project"
    shutil.copytree(BUILDS, project)
    results = {
        r.path.rsplit("/", 1)[-1]: r for r in convert_all(list(collect([project])), Options(), 1)
    }
    return project, results


def test_an_entry_script_of_a_trainer_converted_on_its_own_prints_through_its_accelerator(
    tmp_path: Path,
):
    _, results = _converted_together(tmp_path)
    trainer, train = results["trainer.py"], results["train.py"]
    assert trainer.prepared == [
        "self.model",
        "self.optimizer",
        "self.train_loader",
        "self.val_loader",
    ]
    assert train.changed and not train.prepared
    converted = train.converted.decode()
    assert 'trainer.accelerator.print(f"epoch {epoch} val_acc {acc:.4f} n {n}")' in converted
    assert 'print("starting")' in converted  # before the trainer exists: reviewed, kept
    (said, printed) = train.changes
    assert said.line == 10
    assert "whose own conversion creates the Accelerator there and prepares self.model" in said.text
    assert "nothing to create or prepare here (this file reaches it as trainer.accelerator)" in (
        said.text
    )
    assert printed.line == 14
    assert printed.text == "print -> trainer.accelerator.print (local main process only)"
    (review,) = train.reviews
    assert review.line == 5 and "runs on every rank" in review.text


def test_an_entry_script_converted_without_its_trainer_says_to_convert_both(tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(BUILDS, project)
    (result,) = convert_all(list(collect([project / "train.py"])), Options(), 1)
    assert not result.changed  # trainer.accelerator does not exist until trainer.py is converted
    review = next(r for r in result.reviews if r.line == 10)
    assert "it is not converted in this run: convert trainer.py as well" in review.text
    assert "print through trainer.accelerator.print" in review.text
    assert "neither file is converted" not in review.text


def test_a_project_whose_trainer_builds_everything_prints_each_line_once_on_two_ranks(
    tmp_path: Path,
):
    project = tmp_path / "project"
    shutil.copytree(BUILDS, project)
    assert_ok(run_accelify("convert", project, "--write"))
    result = launch(project / "train.py", cwd=project, timeout=300)
    assert_ok(result)
    epochs = [line for line in result.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 2, result.stdout  # once each, not once per rank
    assert all(line.endswith(" n 103") for line in epochs), epochs  # the whole validation set


DRIVES = FIXTURES / "projects" / "driver_of_an_already_converted_trainer"


def test_a_driver_of_an_already_converted_trainer_prints_through_its_accelerator(
    tmp_path: Path,
):
    project = tmp_path / "project"
    shutil.copytree(DRIVES, project)
    results = {
        r.path.rsplit("/", 1)[-1]: r for r in convert_all(list(collect([project])), Options(), 1)
    }
    assert results["trainer.py"].skipped == "already uses an Accelerator"
    train = results["train.py"]
    assert train.changed and not train.prepared  # not "no .backward() call: not a training script"
    (said, printed, saved) = train.changes
    assert said.line == 18
    assert "trains in trainer.py (its .backward() at line 19), which already creates" in said.text
    assert "prepares model, optimizer, loader" in said.text
    assert printed.line == 21
    converted = train.converted.decode()
    assert 'trainer.accelerator.print(f"epoch {epoch} loss {loss:.4f}")' in converted
    # torch.save(model.state_dict(), "model.pt") ran on every rank: once, after the others
    assert saved.line == 22 and "once, on the main process" in saved.text
    assert converted.endswith(
        "trainer.accelerator.wait_for_everyone()\n"
        'trainer.accelerator.save(model.state_dict(), "model.pt")\n'
    )
    assert not train.reviews


def test_a_driver_of_an_already_converted_trainer_prints_each_line_once_on_two_ranks(
    tmp_path: Path,
):
    project = tmp_path / "project"
    shutil.copytree(DRIVES, project)
    # the original as it is run alone (`python train.py`): its lines, without the launcher and
    # fresh rank a launch of 1 process starts for the same lines
    original = run_python(project / "train.py", cwd=project)
    assert_ok(original)
    assert_ok(run_accelify("convert", project, "--write"))
    assert_ok(run_accelify("convert", project, "--check"))  # converting again changes nothing
    alone = launch(project / "train.py", cwd=project, timeout=300, processes=1)
    assert alone.stdout == original.stdout
    result = launch(project / "train.py", cwd=project, timeout=300)
    assert_ok(result)
    epochs = [line for line in result.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 2, result.stdout  # once each, not once per rank


MAIN_DRIVEN = FIXTURES / "projects" / "trainer_driven_from_a_main_function"


def test_a_driver_written_as_a_main_function_prints_through_its_trainers_accelerator(
    tmp_path: Path,
):
    """``def main(): trainer = Trainer(cfg); ...`` as the module-level driver does: its prints
    after the trainer exists go through ``trainer.accelerator.print``, and its load of the
    checkpoint trainer.py saves on the main process waits for it."""
    project = tmp_path / "project"
    shutil.copytree(MAIN_DRIVEN, project)
    results = {
        r.path.rsplit("/", 1)[-1]: r for r in convert_all(list(collect([project])), Options(), 1)
    }
    train = results["train.py"]
    assert train.skipped is None and train.changed and not train.reviews
    converted = train.converted.decode()
    assert converted.count("trainer.accelerator.print(f") == 2
    waited = converted.index("    trainer.accelerator.wait_for_everyone()\n")
    assert waited < converted.index('torch.load("runs/best.pt")')
    assert waited > converted.index("best = trainer.fit()")
    (barrier,) = [note for note in train.changes if "wait_for_everyone" in note.text]
    assert barrier.line == 11 and "writes its files on the main process only" in barrier.text


def test_a_main_function_driver_loads_its_trainers_checkpoint_on_two_ranks(tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(MAIN_DRIVEN, project)
    assert_ok(run_accelify("convert", project, "--write"))
    result = launch(project / "train.py", cwd=project, timeout=300)
    assert_ok(result)
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [["best", "acc"], ["best", "epoch"]], lines


MAIN_GUARD = FIXTURES / "projects" / "trainer_driven_from_a_main_guard"


def _results(fixture: Path, tmp_path: Path) -> tuple[Path, dict[str, object]]:
    project = tmp_path / "project"
    shutil.copytree(fixture, project)
    results = {
        r.path.rsplit("/", 1)[-1]: r for r in convert_all(list(collect([project])), Options(), 1)
    }
    return project, results


def test_a_driver_under_a_main_guard_waits_before_each_rounds_read(tmp_path: Path):
    """``if __name__ == "__main__": trainer = Trainer(cfg); for round in ...: trainer.fit();
    torch.load(...)``: the guard's block is the driver's scope (its prints go through
    ``trainer.accelerator.print``, not "no accelerator is reachable"), the barrier goes just
    before the read inside the loop (above the loop, each later round's read would still race
    the main process's save), and the write already under a rank test is not reviewed."""
    _, results = _results(MAIN_GUARD, tmp_path)
    train = results["train.py"]
    assert train.skipped is None and train.changed and not train.reviews
    converted = train.converted.decode()
    assert 'trainer.accelerator.print(f"round {round}' in converted
    assert (
        "        best = trainer.fit()\n"
        "        trainer.accelerator.wait_for_everyone()\n"
        '        checkpoint = torch.load("runs/best.pt")\n'
    ) in converted
    assert converted.count("wait_for_everyone()") == 1
    (barrier,) = [note for note in train.changes if "wait_for_everyone" in note.text]
    assert barrier.line == 12


def test_a_read_under_a_per_rank_condition_gets_a_review_and_no_barrier(tmp_path: Path):
    """A barrier under ``if best > 0.5:`` (a value each rank computed) would hang the ranks
    that skip it: said, not placed."""
    project = tmp_path / "project"
    shutil.copytree(MAIN_GUARD, project)
    train_py = project / "train.py"
    source = train_py.read_text()
    train_py.write_text(
        source.replace(
            '        checkpoint = torch.load("runs/best.pt")\n',
            '        if best > 0.5:\n            checkpoint = torch.load("runs/best.pt")\n',
        ).replace('        print(f"round', '            print(f"round')
    )
    (train, _) = convert_all(list(collect([train_py, project / "trainer.py"])), Options(), 1)
    assert "wait_for_everyone" not in train.converted.decode()
    (review,) = train.reviews
    assert review.line == 13
    assert "a condition the ranks may disagree on holds it" in review.text


def test_a_driver_under_a_main_guard_reads_each_rounds_checkpoint_on_two_ranks(tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(MAIN_GUARD, project)
    original = run_python(project / "train.py", cwd=project)
    assert_ok(original)
    assert_ok(run_accelify("convert", project, "--write"))
    alone = launch(project / "train.py", cwd=project, timeout=300, processes=1)
    assert alone.stdout == original.stdout
    result = launch(project / "train.py", cwd=project, timeout=300)
    assert_ok(result)
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [["round", "0"], ["round", "1"]], lines


READS_BACK = FIXTURES / "projects" / "driver_reads_what_an_already_converted_trainer_saves"


def test_a_driver_of_an_already_converted_trainer_waits_before_reading_its_save(
    tmp_path: Path,
):
    """trainer.py already uses an Accelerator and saves ``best.pt`` on the main process: its
    source as written is what runs, so the driver's ``torch.load("best.pt")`` waits for it."""
    _, results = _results(READS_BACK, tmp_path)
    assert results["trainer.py"].skipped == "already uses an Accelerator"
    converted = results["train.py"].converted.decode()
    assert 'trainer.accelerator.wait_for_everyone()\nstate = torch.load("best.pt")\n' in converted
    (barrier,) = [n for n in results["train.py"].changes if "wait_for_everyone" in n.text]
    assert barrier.line == 17


ENGINE = FIXTURES / "projects" / "engine_module_of_a_driver"
ENGINE_WHOLE = FIXTURES / "projects" / "engine_module_imported_whole"
ENGINE_SHARED = FIXTURES / "projects" / "engine_module_with_a_second_caller"


@pytest.mark.parametrize("fixture", [ENGINE, ENGINE_WHOLE])
def test_a_driver_and_its_engine_module_are_converted_consistently(tmp_path: Path, fixture: Path):
    shutil.copytree(fixture, tmp_path / "project")
    files = list(collect([tmp_path / "project"]))
    results = {Path(r.path).name: r for r in convert_all(files, Options(), 1)}
    main, engine = results["main.py"], results["engine.py"]
    assert main.prepared == ["model", "optimizer", "train_loader", "val_loader"]
    called = "engine." if fixture == ENGINE_WHOLE else ""
    converted = main.converted.decode()
    assert f"{called}evaluate(model, val_loader, device, accelerator=accelerator)" in converted
    assert "epoch, accelerator=accelerator" in converted
    assert converted.count("accelerator.prepare(") == 1
    assert "accelerator.save(accelerator.get_state_dict(model), args.out)" in converted
    assert ("import engine\n" in converted) == bool(called)
    engine_code = engine.converted.decode()
    assert (
        "def train_one_epoch(model, loader, optimizer, device, epoch, log_every=5, *, accelerator):"
        in engine_code
    )
    assert "def evaluate(model, loader, device, accelerator):" in engine_code
    assert "accelerator.backward(loss)" in engine_code
    assert "out, y = accelerator.gather_for_metrics((out, y))" in engine_code
    assert "Accelerator" not in engine_code.split("def ")[0]  # handed in, not imported
    lines = {(n.line, n.text.split(" ")[0]) for n in engine.changes}
    assert (12, "loss.backward()") in lines  # the engine's own line numbers
    (review,) = engine.reviews
    assert review.line == 18 and "(line 15)" in review.text
    assert not main.reviews


def test_converting_only_the_driver_keeps_the_review(tmp_path: Path):
    shutil.copytree(ENGINE, tmp_path / "project")
    (result,) = convert_all(list(collect([tmp_path / "project" / "main.py"])), Options(), 1)
    assert not result.changed
    (review,) = result.reviews
    assert "train_one_epoch() trains in engine.py" in review.text
    assert "(engine.py is not converted in this run (the two are converted together" in (
        review.text
    )


def _why_unpaired(review: str) -> str:
    """The one reason the review line of a driver gives for leaving it and its engine."""
    return review.split("neither file is converted for it (", 1)[1].split("); by hand", 1)[0]


def test_an_engine_module_with_statements_of_its_own_is_said_to_be_why(tmp_path: Path):
    """The review line of the driver names the one pairing condition that fails (here: the
    engine runs a statement as it is imported), not every condition as if all applied."""
    project = tmp_path / "project"
    shutil.copytree(ENGINE, project)
    engine = (project / "engine.py").read_text()
    (project / "engine.py").write_text(engine + "\n\nSEEN = []\n")
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    assert not results["main.py"].changed
    reasons = {_why_unpaired(n.text) for n in results["main.py"].reviews}
    assert reasons == {"engine.py holds more than imports, functions and classes (statements)"}


ENGINE_CLASS = FIXTURES / "projects" / "engine_class_handed_the_model_in_a_sibling_module"


def test_an_engine_class_handed_the_model_is_converted_with_its_driver(tmp_path: Path):
    """trial12: ``Engine(model, optimizer, scheduler, cfg)`` of engine.py (a ``Meter`` class
    beside it) trains what train.py builds: the two are converted as one script, the
    Accelerator where the engine receives what it trains, train.py printing through it."""
    project = tmp_path / "project"
    shutil.copytree(ENGINE_CLASS, project)
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    engine, train = results["engine.py"], results["train.py"]
    assert engine.changed and train.changed
    converted = engine.converted.decode()
    assert "self.accelerator = Accelerator()" in converted
    assert "self.accelerator.backward(loss)" in converted
    assert "class Meter:\n    def __init__(self):\n        self.total = 0.0" in converted
    assert engine.prepared == ["self.model", "self.optimizer", "self.scheduler"]
    assert not train.prepared
    told = engine.changes[0].text
    assert told.startswith("converted with train.py, which builds what this file trains")
    driven = train.converted.decode()
    assert "engine.accelerator.print(" in driven
    assert "from accelify import" not in driven  # the engine's Accelerator: not read here
    # the loaders come from data.py's dict (``make_loaders(cfg) -> dict[str, DataLoader]``):
    # each prepared through the engine's accelerator once, before the loop that hands them on,
    # the evaluation over the val loader gathered
    assert (
        "    loaders = {\n"
        "        key: engine.accelerator.prepare(loader) for key, loader in loaders.items()\n"
        "    }\n"
        "    for epoch in range(start, cfg.epochs):\n"
    ) in driven
    assert "self.accelerator.gather_for_metrics((logits, x, y))" in converted
    reviews = " ".join(r.text for r in [*engine.reviews, *train.reviews])
    assert "every rank trains on all of it" not in reviews
    assert "not prepared" not in reviews


def test_an_engine_class_in_a_package_is_converted_with_the_driver_beside_the_package(
    tmp_path: Path,
):
    """trial12's layout: ``train.py`` beside ``src/`` (a package), ``from src.engine import
    Engine``: the driver is found in the folder above the package."""
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "__init__.py").write_text("")
    for name in ("config.py", "data.py", "engine.py"):
        shutil.copy(ENGINE_CLASS / name, project / "src" / name)
    train = (ENGINE_CLASS / "train.py").read_text()
    for name in ("config", "data", "engine"):
        train = train.replace(f"from {name} import", f"from src.{name} import")
    (project / "train.py").write_text(train)
    results = {
        Path(r.path).relative_to(project).as_posix(): r
        for r in convert_all(list(collect([project])), Options(), 1)
    }
    engine = results["src/engine.py"]
    assert engine.prepared == ["self.model", "self.optimizer", "self.scheduler"]
    assert engine.changes[0].text.startswith("converted with ../train.py, which builds")
    assert "engine.accelerator.print(" in results["train.py"].converted.decode()


def test_a_driver_indexing_the_engines_prepared_model_unwraps_it_through_the_engine(
    tmp_path: Path,
):
    """``engine.model[0]`` in train.py after the engine prepared ``self.model``: the DDP wrapper
    cannot be indexed (on 2 ranks: 'DistributedDataParallel' object is not subscriptable), and
    the engine's accelerator is reachable there as ``engine.accelerator`` (the review line said
    it was not)."""
    project = tmp_path / "project"
    shutil.copytree(ENGINE_CLASS, project)
    train = project / "train.py"
    text = train.read_text()
    last = '    print("done")\n'
    assert last in text
    train.write_text(text.replace(last, "    print(engine.model[0].weight.shape)\n" + last))
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    converted = results["train.py"].converted.decode()
    assert "engine.accelerator.unwrap_model(engine.model)[0].weight.shape" in converted
    assert not any("not reachable" in r.text for r in results["train.py"].reviews)


@pytest.mark.distributed
def test_an_engine_class_and_its_driver_run_on_two_ranks_over_the_whole_set(tmp_path: Path):
    project, untouched = tmp_path / "project", tmp_path / "original"
    shutil.copytree(ENGINE_CLASS, project)
    shutil.copytree(ENGINE_CLASS, untouched)
    original = run_python(project / "train.py", cwd=project)
    assert_ok(original)
    assert_ok(run_accelify("convert", project, "--write"))
    assert_ok(run_accelify("convert", project, "--check"))  # converting again changes nothing
    alone = launch(project / "train.py", cwd=project, timeout=300, processes=1)
    assert alone.stdout == original.stdout
    # data.py's dict of loaders is prepared: the ranks train on their own shards
    verified = run_accelify(
        "verify", untouched / "train.py", project / "train.py", cwd=tmp_path, timeout=400
    )
    assert_ok(verified)
    assert "losses differ per shard" in verified.stdout, verified.stdout
    result = launch(project / "train.py", "--resume", "--epochs", "3", cwd=project, timeout=300)
    assert_ok(result)
    lines = result.stdout.splitlines()
    assert len([line for line in lines if line.startswith("resumed from step 10 epoch 1")]) == 1
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert [line.split()[1] for line in epochs] == ["2"], result.stdout  # once, not per rank
    assert epochs[0].split(" n ")[1].startswith("100 ")  # the whole validation set


def test_an_engine_another_script_calls_is_left_in_both(tmp_path: Path):
    # eval.py calls evaluate(model, val_loader, "cpu"): a parameter added for the driver's
    # accelerator would break it, so neither file is converted (each keeps its review line)
    project = tmp_path / "project"
    shutil.copytree(ENGINE_SHARED, project)
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    assert not any(r.changed for r in results.values())
    assert results["main.py"].reviews and results["engine.py"].reviews
    assert {_why_unpaired(n.text) for n in results["main.py"].reviews} == {
        "engine.py is imported by other files of the folder too (eval.py), whose calls an "
        "added parameter would break"
    }


@pytest.mark.distributed
def test_a_driver_and_its_engine_train_on_two_ranks_over_the_whole_set(tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(ENGINE, project)
    original = run_python(project / "main.py", "--epochs", "2", cwd=project)
    assert_ok(original)
    assert_ok(run_accelify("convert", project, "--write"))
    assert_ok(run_accelify("convert", project, "--check"))  # converting again changes nothing
    (project / "best.pt").unlink()
    alone = launch(project / "main.py", "--epochs", "2", cwd=project, timeout=300, processes=1)
    assert alone.stdout == original.stdout
    result = launch(project / "main.py", "--epochs", "2", cwd=project, timeout=300)
    assert_ok(result)
    epochs = [line for line in result.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 2, result.stdout  # once each, not once per rank
    assert all(line.endswith("n=60") for line in epochs)  # the whole validation set
    saved = [line for line in result.stdout.splitlines() if line.startswith("saved best")]
    assert 1 <= len(saved) <= 2 and (project / "best.pt").is_file()


def _at_the_top_level(project: Path) -> None:
    """train.py's ``main()`` body moved to the module's top level (no ``main()``)."""
    source = (project / "train.py").read_text()
    body = source.split("def main():\n")[1].split("\n\nif __name__")[0]
    top = "\n".join(line.removeprefix("    ") for line in body.splitlines())
    (project / "train.py").write_text(source.split("def main():\n")[0] + top + "\n")


def test_a_driver_at_the_top_level_is_converted_with_its_engine(tmp_path: Path):
    """convfix36: trained at the module's top level, the accelerator is a global of the driver,
    which engine.py does not see: its functions take it as a parameter, the driver's
    top-level calls pass its global (before: neither file was converted)."""
    project = _copy(tmp_path)
    _at_the_top_level(project)
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    train, engine = results["train.py"], results["engine.py"]
    assert train.prepared == ["model", "optimizer", "train_loader", "val_loader"]
    converted = train.converted.decode()
    assert "\naccelerator = Accelerator()\n" in converted
    assert (
        "loss = train_one_epoch(\n        model, train_loader, optimizer, criterion, "
        "accelerator=accelerator\n    )" in converted
    )
    assert "acc = evaluate(model, val_loader, accelerator=accelerator)" in converted
    code = engine.converted.decode()
    assert "def train_one_epoch(model, loader, optimizer, criterion, accelerator):" in code
    assert "def evaluate(model, loader, accelerator):" in code
    assert "accelerator.backward(loss)" in code
    assert "Accelerator" not in code  # handed in, never a global of its own
    said = {(n.line, n.text) for n in engine.changes}
    assert (
        4,
        "train_one_epoch() takes the accelerator as a parameter (its callers pass it)",
    ) in said


def test_an_engine_method_that_prints_leaves_a_top_level_driver_with_why(tmp_path: Path):
    """A method of engine.py that needs the accelerator (``Meter.show`` prints) cannot take it
    as a parameter the way a function does: both files are left, and the driver's review line
    says that, not a reason that does not hold."""
    project = _copy(tmp_path)
    _at_the_top_level(project)
    engine = (project / "engine.py").read_text()
    meter = "class Meter:\n    def show(self, value):\n        print(f'loss {value:.4f}')\n\n\n"
    (project / "engine.py").write_text(
        engine.replace("def train_one_epoch", meter + "def train_one_epoch").replace(
            "    return total / len(loader)",
            "    Meter().show(total)\n    return total / len(loader)",
        )
    )
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    assert not any(r.changed for r in results.values())
    assert {_why_unpaired(n.text) for n in results["train.py"].reviews} == {
        "this file calls it at its top level, so the accelerator is a global of this file, and a "
        "function of engine.py that needs it cannot take it as a parameter (a method, a function "
        "handed on rather than called, or a call whose target the conversion cannot tell): it "
        "would read a global engine.py does not have"
    }


TOP_LEVEL_DRIVER = FIXTURES / "projects" / "engine_module_of_a_top_level_driver"


@pytest.mark.distributed
def test_a_top_level_driver_and_its_engine_train_on_two_ranks_over_the_whole_set(
    tmp_path: Path,
):
    """convfix36 (a sentiment project's ``scripts/train.py``): the driver trains at its top
    level through engine.py's functions, one of which calls another that runs the backward."""
    project = tmp_path / "project"
    shutil.copytree(TOP_LEVEL_DRIVER, project)
    original = run_python(project / "main.py", cwd=project)
    assert_ok(original)
    converting = run_accelify("convert", project, "--write")
    assert_ok(converting)
    assert "engine.py:5: _step() takes the accelerator as a parameter" in converting.stdout
    assert_ok(run_accelify("convert", project, "--check"))  # converting again changes nothing
    assert_ok(run_accelify("lint", "--select", "ALL", project))
    alone = launch(project / "main.py", cwd=project, timeout=300, processes=1)
    assert alone.stdout == original.stdout
    result = launch(project / "main.py", cwd=project, timeout=300)
    assert_ok(result)
    epochs = [line for line in result.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 3, result.stdout  # once each, not once per rank
    assert all(line.endswith("/40") for line in epochs)  # the whole validation set


ABSTRACT_BASE = FIXTURES / "projects" / "abstract_base_trainer_subclassed_by_the_driver"


@pytest.mark.parametrize("through_the_module", [False, True])
def test_a_subclass_in_the_driver_of_an_abstract_base_trainer_is_converted_with_it(
    tmp_path: Path, through_the_module: bool
):
    """convfix36: ``class ClassifierTrainer(BaseTrainer)`` of train.py says how a batch makes its
    loss; the loop is in ``BaseTrainer(ABC)`` of base.py, handed the model, optimizer and
    loaders. The two are converted as one (before: nothing, train.py "not a training
    script"): the Accelerator is created in ``BaseTrainer.__init__``, where they arrive. The
    same with ``import base`` and ``class ClassifierTrainer(base.BaseTrainer)``."""
    project = tmp_path / "project"
    shutil.copytree(ABSTRACT_BASE, project)
    if through_the_module:
        source = (project / "train.py").read_text()
        (project / "train.py").write_text(
            source.replace("from base import BaseTrainer", "import base").replace(
                "(BaseTrainer)", "(base.BaseTrainer)"
            )
        )
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    base, train = results["base.py"], results["train.py"]
    assert base.prepared == [
        "self.model",
        "self.optimizer",
        "self.train_loader",
        "self.val_loader",
    ]
    code = base.converted.decode()
    assert "        self.accelerator = Accelerator()\n" in code
    assert "self.accelerator.backward(loss)" in code
    assert "outputs, y = self.accelerator.gather_for_metrics((outputs, y))" in code
    assert not base.reviews and not train.reviews
    assert not train.changed  # it builds the trainer and prints nothing


@pytest.mark.distributed
def test_a_subclass_of_an_abstract_base_trainer_runs_on_two_ranks_over_the_whole_set(
    tmp_path: Path,
):
    project = tmp_path / "project"
    shutil.copytree(ABSTRACT_BASE, project)
    original = run_python(project / "train.py", cwd=project)
    assert_ok(original)
    assert_ok(run_accelify("convert", project, "--write"))
    assert_ok(run_accelify("convert", project, "--check"))  # converting again changes nothing
    assert_ok(run_accelify("lint", "--select", "ALL", project))
    alone = launch(project / "train.py", cwd=project, timeout=300, processes=1)
    assert alone.stdout == original.stdout
    result = launch(project / "train.py", cwd=project, timeout=300)
    assert_ok(result)
    epochs = [line for line in result.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 3, result.stdout  # once each, not once per rank
    assert all(line.endswith("/16") for line in epochs)  # the whole validation set


LOADER_BUILDER = FIXTURES / "projects" / "evaluator_building_its_loader_in_a_sibling_module"


def test_an_evaluator_building_its_own_loader_elsewhere_is_reviewed_where_it_is_made(
    tmp_path: Path,
):
    """convfix36: ``Evaluator(model, val_set)`` of evaluator.py builds its DataLoader in
    ``__init__`` and loops over it: the driver's conversion prepares the model it hands in, not
    that loader, so every rank evaluates the whole set. Said at the construction (before:
    nothing said), evaluator.py left as it is."""
    project = tmp_path / "project"
    shutil.copytree(LOADER_BUILDER, project)
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    train, evaluator = results["train.py"], results["evaluator.py"]
    assert train.prepared == ["model", "optimizer", "train_loader"]
    assert not evaluator.changed
    (review,) = train.reviews
    assert review.line == 15  # evaluator = Evaluator(model, val_set)
    assert review.text.startswith(
        "Evaluator() builds the DataLoader it evaluates over (evaluator.py:8), which is not "
        "prepared: every rank evaluates the whole set there"
    )


DICT_HANDED = FIXTURES / "projects" / "evaluation_module_handed_the_loaders_in_a_dict"


def test_loaders_handed_in_a_dict_to_an_evaluation_module_are_left_whole(tmp_path: Path):
    # main.py hands one dict (model, loaders, optimizer) to train() of train.py, converted with
    # it, and to test() of test.py, which runs no backward: the test loader stays whole (test()
    # would sum one rank's shard), and test()'s model.loss() on the DDP wrapper is said
    project = tmp_path / "project"
    shutil.copytree(DICT_HANDED, project)
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    main, train = results["main.py"], results["train.py"]
    assert main.prepared == ["model", "optimizer", "train_batcher"]
    assert not results["test.py"].changed
    (whole,) = [n for n in main.reviews if n.text.startswith("test_batcher is read only")]
    assert whole.line == 54
    assert "by test(), a function of another module that runs no backward" in whole.text
    (method,) = [n for n in main.reviews if "calls model.loss() at test.py:16" in n.text]
    assert method.line == 54 and "accelerator.unwrap_model(model).loss()" in method.text
    code = train.converted.decode()
    assert "accelerator.unwrap_model(model).loss(x, x_hat, z_mean, z_logvar)" in code
    assert "x = x.to(device)" not in code  # the dict's loader is the prepared one


SAVES_THROUGH = FIXTURES / "projects" / "trainer_saves_through_a_sibling_helper"


def test_a_sibling_helper_that_saves_a_state_dict_is_handed_the_unwrapped_model(tmp_path: Path):
    """``utils.save_checkpoint(path, self.model, ...)`` of a module whose function saves
    ``model.state_dict()``: handed the DDP wrapper it saves ``module.``-prefixed keys, which the
    resume's unwrapped model does not load; every rank calling it writes one file N times."""
    project = tmp_path / "project"
    shutil.copytree(SAVES_THROUGH, project)
    (result, _) = convert_all(list(collect([project])), Options(), 1)
    converted = result.converted.decode()
    assert (
        "                self.accelerator.wait_for_everyone()\n"
        "                if self.accelerator.is_main_process:\n"
        "                    utils.save_checkpoint(\n"
        '                        f"out/epoch{epoch}.pt",\n'
        "                        self.accelerator.unwrap_model(self.model),\n"
        "                        self.optimizer,\n"
        "                        epoch,\n"
        "                    )\n"
        "                self.accelerator.wait_for_everyone()\n"
    ) in converted
    # the one thing left to the user: the helper's own state_dict() under a sharding backend
    (review,) = result.reviews
    assert review.line == 30 and "under FSDP or ZeRO-3" in review.text
    assert "self.accelerator.get_state_dict(model)" in review.text
    texts = {note.text for note in result.changes}
    assert any("it saves model.state_dict() (utils.py:8)" in text for text in texts), texts


def test_a_sibling_helper_imported_by_name_is_handed_the_unwrapped_model(tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(SAVES_THROUGH, project)
    train = (project / "train.py").read_text()
    train = train.replace("import utils\n", "import utils\nfrom utils import save_checkpoint\n")
    train = train.replace("utils.save_checkpoint(", "save_checkpoint(")
    (project / "train.py").write_text(train)
    (result, _) = convert_all(list(collect([project])), Options(), 1)
    assert "self.accelerator.unwrap_model(self.model),\n" in result.converted.decode()


def test_a_trainer_saving_through_a_sibling_helper_resumes_on_two_ranks(tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(SAVES_THROUGH, project)
    original = run_python(project / "train.py", cwd=project)
    assert_ok(original)
    shutil.rmtree(project / "out")
    assert_ok(run_accelify("convert", project, "--write"))
    result = launch(project / "train.py", cwd=project, timeout=300)
    assert_ok(result)
    epochs = [line for line in result.stdout.splitlines() if line.startswith("epoch")]
    assert epochs == [f"epoch {n} trained" for n in range(1, 5)], result.stdout


def test_a_sibling_helper_that_saves_after_a_collective_keeps_its_review_line(tmp_path: Path):
    # run on the main process alone, its all_reduce would wait for ranks that never come
    project = tmp_path / "project"
    shutil.copytree(SAVES_THROUGH, project)
    utils = (project / "utils.py").read_text()
    utils = utils.replace(
        "    os.makedirs(", "    torch.distributed.barrier()\n    os.makedirs(", 1
    )
    (project / "utils.py").write_text(utils)
    (result, _) = convert_all(list(collect([project])), Options(), 1)
    converted = result.converted.decode()
    assert "is_main_process:\n                    utils.save_checkpoint(" not in converted
    (review,) = [note for note in result.reviews if "utils.save_checkpoint()" in note.text]
    assert "module.` prefix" in review.text


ANNOTATED = FIXTURES / "projects" / "loader_from_a_method_of_an_annotated_parameter"


def test_a_loader_from_a_method_of_an_annotated_parameter_is_prepared(tmp_path: Path):
    shutil.copytree(ANNOTATED, tmp_path / "project")
    (result,) = convert_all(list(collect([tmp_path / "project" / "train.py"])), Options(), 1)
    # ``trainset: Samples`` of samples.py, whose get_dataloader() makes a DataLoader
    assert result.prepared == ["self.model", "optimizer", "train_loader"]
    converted = result.converted.decode()
    assert "self.model, optimizer, train_loader = self.accelerator.prepare(" in converted
    assert not any("DataLoader" in note.text for note in result.reviews)


def test_an_annotation_of_a_name_the_file_binds_itself_is_not_followed(tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(ANNOTATED, project)
    source = (project / "train.py").read_text()
    # the parameter is rebound to something else before the call: its annotation says nothing
    (project / "train.py").write_text(
        source.replace(
            "        train_loader = trainset.get_dataloader(",
            "        trainset = Other()\n        train_loader = trainset.get_dataloader(",
        )
    )
    (result,) = convert_all(list(collect([project / "train.py"])), Options(), 1)
    assert "train_loader" not in result.prepared


@pytest.mark.distributed
def test_a_loader_from_a_method_of_an_annotated_parameter_trains_sharded_on_two_ranks(
    tmp_path: Path,
):
    project = tmp_path / "project"
    shutil.copytree(ANNOTATED, project)
    assert_ok(run_accelify("convert", project / "train.py", "-o", project / "converted.py"))
    result = run_accelify(
        "verify",
        project / "train.py",
        project / "converted.py",
        "--to-end",
        cwd=tmp_path,
        timeout=400,
    )
    assert_ok(result)
    assert "verdict: PASS" in result.stdout
    assert re.search(r"all [1-9]\d* printed lines identical", result.stdout), result.stdout


REEXPORTED = FIXTURES / "projects" / "engine_module_re_exported_by_a_package"


def test_a_driver_of_an_engine_a_package_re_exports_is_reviewed_at_its_calls(tmp_path: Path):
    shutil.copytree(REEXPORTED, tmp_path / "project")
    (result,) = convert_all(list(collect([tmp_path / "project" / "train.py"])), Options(), 1)
    # ``from engine import run_epoch`` of engine/__init__.py, defined in engine/loop.py
    assert not result.changed
    assert "trains through run_epoch() of another module" in result.skipped
    assert [note.line for note in result.reviews] == [22, 23]
    assert all(
        "run_epoch() trains in engine/loop.py (its .backward() at line 16)" in note.text
        for note in result.reviews
    )


SUBCLASS = FIXTURES / "projects" / "trainer_subclass_of_a_base_in_another_module"


def test_a_driver_of_a_subclass_whose_base_class_trains_prints_through_its_accelerator(
    tmp_path: Path,
):
    project = tmp_path / "project"
    shutil.copytree(SUBCLASS, project)
    results = {
        r.path.rsplit("/", 1)[-1]: r for r in convert_all(list(collect([project])), Options(), 1)
    }
    train = results["train.py"]
    assert results["base.py"].prepared == ["self.model", "optimizer", "loader"]
    # Small of small.py trains through its base class Model of base.py
    said = next(note for note in train.changes if note.line == 12)
    assert "Small() trains in base.py (its .backward() at line 26)" in said.text
    assert 'small.accelerator.print("saved small.pt")' in train.converted.decode()
    # torch.save(small.model.state_dict(), "small.pt"): once, of the plain model's keys
    assert not train.reviews
    saved = next(note for note in train.changes if note.line == 15)
    assert "get_state_dict() of the model that file prepares" in saved.text
    assert (
        "small.accelerator.wait_for_everyone()\n"
        'small.accelerator.save(small.accelerator.get_state_dict(small.model), "small.pt")\n'
    ) in train.converted.decode()


def test_a_driver_of_a_subclass_whose_base_class_trains_prints_once_on_two_ranks(
    tmp_path: Path,
):
    project = tmp_path / "project"
    shutil.copytree(SUBCLASS, project)
    assert_ok(run_accelify("convert", project, "--write"))
    result = launch(project / "train.py", cwd=project, timeout=300)
    assert_ok(result)
    assert result.stdout.splitlines().count("saved small.pt") == 1, result.stdout
    torch = pytest.importorskip("torch")
    saved = torch.load(project / "small.pt")
    assert sorted(saved) == ["bias", "weight"]  # the plain model's keys, not module.weight


_SKIPS_THE_BASE_INIT = """import torch.nn as nn

from base import Model


class Small(Model):
    def __init__(self):
        self.model = None

    def initialize_model(self):
        self.model = nn.Linear(4, 1)
"""


def test_a_base_class_a_subclass_elsewhere_does_not_construct_is_left_with_why(tmp_path: Path):
    """``Small.__init__`` of small.py runs no ``Model.__init__``: the ``self.accelerator``
    base.py's conversion would create there would not exist on a ``Small``, and ``train()``
    would fail with AttributeError at its first step. base.py is left as it is, and so is the
    driver, each saying why."""
    project = tmp_path / "project"
    shutil.copytree(SUBCLASS, project)
    (project / "small.py").write_text(_SKIPS_THE_BASE_INIT, encoding="utf-8")
    results = {
        r.path.rsplit("/", 1)[-1]: r for r in convert_all(list(collect([project])), Options(), 1)
    }
    base = results["base.py"]
    assert not base.changed
    (review,) = base.reviews
    assert review.line == 10  # def __init__(self): of Model
    assert "Small.__init__ (small.py, line 7) does not run Model.__init__" in review.text
    assert "AttributeError" in review.text
    train = results["train.py"]
    assert not train.changed
    assert any("Small.__init__ (small.py, line 7)" in note.text for note in train.reviews)


def test_a_subclass_two_modules_down_that_does_not_construct_its_base_is_found(tmp_path: Path):
    """``class Mid(Model)`` of mid.py runs ``Model.__init__`` (it has no ``__init__``); ``class
    Small(Mid)`` of small.py does not run it: followed down from base.py."""
    project = tmp_path / "project"
    shutil.copytree(SUBCLASS, project)
    (project / "mid.py").write_text("from base import Model\n\n\nclass Mid(Model):\n    pass\n")
    small = _SKIPS_THE_BASE_INIT.replace("from base import Model", "from mid import Mid")
    (project / "small.py").write_text(small.replace("Small(Model)", "Small(Mid)"))
    results = {
        r.path.rsplit("/", 1)[-1]: r for r in convert_all(list(collect([project])), Options(), 1)
    }
    (review,) = results["base.py"].reviews
    assert "Small.__init__ (small.py, line 7) does not run Model.__init__" in review.text
    assert not results["base.py"].changed


def test_a_subclass_elsewhere_that_calls_the_base_init_keeps_the_conversion(tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(SUBCLASS, project)
    calls = _SKIPS_THE_BASE_INIT.replace(
        "        self.model = None", "        super().__init__()\n        self.model = None"
    )
    (project / "small.py").write_text(calls, encoding="utf-8")
    results = {
        r.path.rsplit("/", 1)[-1]: r for r in convert_all(list(collect([project])), Options(), 1)
    }
    assert results["base.py"].prepared == ["self.model", "optimizer", "loader"]


@pytest.mark.parametrize(
    ("init", "bases"),
    [
        ("        Mixin.__init__(self)\n        self.model = None", "Mixin, Model"),
        ("        if fresh:\n            super().__init__()\n        self.model = None", "Model"),
    ],
)
def test_a_subclass_elsewhere_running_another_init_or_the_base_init_under_a_condition(
    tmp_path: Path, init: str, bases: str
):
    """``Mixin.__init__(self)`` of ``class Small(Mixin, Model)`` runs the mixin's alone, and
    ``if fresh: super().__init__()`` may not run: neither counts as running ``Model.__init__``
    (both did, and the inherited ``train()`` raised AttributeError on ``self.accelerator``)."""
    project = tmp_path / "project"
    shutil.copytree(SUBCLASS, project)
    small = _SKIPS_THE_BASE_INIT.replace("        self.model = None", init)
    small = small.replace(
        "class Small(Model):\n    def __init__(self):",
        (
            f"class Mixin:\n    def __init__(self):\n        self.log = []\n\n\n"
            f"class Small({bases}):\n    def __init__(self, fresh=False):"
        ),
    )
    (project / "small.py").write_text(small, encoding="utf-8")
    results = {
        r.path.rsplit("/", 1)[-1]: r for r in convert_all(list(collect([project])), Options(), 1)
    }
    (review,) = results["base.py"].reviews
    assert "Small.__init__ (small.py, line 12) does not run Model.__init__" in review.text
    assert not results["base.py"].changed


LOGGER = FIXTURES / "projects" / "logger_from_a_project_module"


def test_a_logger_a_project_module_returns_logs_on_the_main_process_only(tmp_path: Path):
    shutil.copytree(LOGGER, tmp_path / "project")
    (result,) = convert_all(list(collect([tmp_path / "project" / "train.py"])), Options(), 1)
    converted = result.converted.decode()
    assert "import logging\n" in converted  # the file did not import it
    assert "if not self.accelerator.is_local_main_process:\n" in converted
    assert "logging.disable(logging.WARNING)" in converted
    assert not any("logging" in note.text for note in result.reviews)


def test_a_logger_a_project_module_returns_logs_each_record_once_on_two_ranks(tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(LOGGER, project)
    assert_ok(run_accelify("convert", project, "--write"))
    result = launch(project / "train.py", cwd=project, timeout=300)
    assert_ok(result)
    lines = result.stdout.splitlines()
    assert lines.count("Regressor: Starting training") == 1, result.stdout
    assert lines.count("Regressor: Epoch 1 done") == 1, result.stdout


STOPPER = FIXTURES / "projects" / "early_stopping_object_in_a_sibling_module"


def _stopper(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    shutil.copytree(STOPPER, project)
    return project


def test_an_object_of_a_sibling_module_that_saves_is_handed_the_unwrapped_model(tmp_path: Path):
    """``self.early_stopping(val_loss, self.model)`` of stopping.py's ``EarlyStopping``, whose
    ``save_checkpoint`` saves ``model.state_dict()``: converted with the folder, the object is
    handed the unwrapped model, every rank waits after the call, and stopping.py's save runs on
    the main process only."""
    project = _stopper(tmp_path)
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    train, stopping = results["train.py"], results["stopping.py"]
    assert (
        "            self.early_stopping(val_loss, self.accelerator.unwrap_model(self.model))\n"
        "            self.accelerator.wait_for_everyone()\n"
        "            if self.early_stopping.early_stop:\n"
    ) in train.converted.decode()
    assert (
        "    def save_checkpoint(self, model):\n"
        "        if PartialState().is_main_process:\n"
        "            torch.save(model.state_dict(), self.path)\n"
    ) in stopping.converted.decode()
    assert "from accelify import PartialState\n" in stopping.converted.decode()
    (change,) = stopping.changes
    assert change.line == 25 and "made by train.py, converted with this file" in change.text
    waits = [n for n in train.changes if "every rank waits for the file" in n.text]
    assert [n.line for n in waits] == [66]
    assert "on the main process only (stopping.py is converted with this file)" in waits[0].text
    # what is left to the user: the state taken on one rank under a sharding backend
    assert [n.line for n in stopping.reviews] == [25]
    assert all("FSDP or ZeRO-3" in n.text for n in (*stopping.reviews, *train.reviews))


def test_a_saver_modules_prints_run_on_the_main_process_with_its_save(tmp_path: Path):
    """``print("saved best model")`` beside the save of an EarlyStopping every rank calls
    (trial11): once its save is the main process's, so is the print (it shares the save's
    ``if``); before, the line showed once per rank."""
    project = _stopper(tmp_path)
    stopping_py = project / "stopping.py"
    text = stopping_py.read_text()
    save = "        torch.save(model.state_dict(), self.path)\n"
    assert text.count(save) == 1
    stopping_py.write_text(text.replace(save, save + '        print("saved best model")\n'))
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    stopping = results["stopping.py"]
    assert (
        "        if PartialState().is_main_process:\n"
        "            torch.save(model.state_dict(), self.path)\n"
        '            print("saved best model")\n'
    ) in stopping.converted.decode()
    assert [n.line for n in stopping.changes if n.text.startswith("print ")] == [26]
    assert (
        stopping.done
        == "nothing to prepare here; 1 torch.save and 1 print put on the main process only"
    )


def test_an_object_saver_made_by_a_factory_leaves_the_modules_save_on_every_rank(tmp_path: Path):
    """``self.early_stopping = make_stopper(cfg, path)``: the conversion cannot follow the
    object to its calls, so it cannot wait after them nor unwrap what they are handed; were
    stopping.py's save put on the main process alone, rank 1 would read a file not yet
    written (review8b). The save stays on every rank, and the construction is reviewed."""
    project = _stopper(tmp_path)
    train_py = project / "train.py"
    text = train_py.read_text()
    made = 'EarlyStopping(patience=cfg["patience"], path=self.best_path)'
    assert made in text
    text = text.replace(made, "make_stopper(cfg, self.best_path)").replace(
        "\n\nclass ",
        '\n\ndef make_stopper(cfg, path):\n    return EarlyStopping(patience=cfg["patience"], '
        "path=path)\n\n\nclass ",
        1,
    )
    train_py.write_text(text)
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    assert b"is_main_process" not in results["stopping.py"].converted
    train = results["train.py"]
    (review,) = [n for n in train.reviews if "cannot follow this object" in n.text]
    assert "make_stopper" not in review.text and "unwrap_model(model)" in review.text
    assert text.splitlines()[review.line - 1].strip().startswith("return EarlyStopping(")
    assert not [n for n in train.changes if "every rank waits for the file" in n.text]


def test_an_object_saver_whose_module_is_not_converted_gets_a_review_line(tmp_path: Path):
    project = _stopper(tmp_path)
    (result,) = convert_all(list(collect([project / "train.py"])), Options(), 1)
    code = result.converted.decode()
    assert "self.early_stopping(val_loss, self.accelerator.unwrap_model(self.model))" in code
    assert "self.accelerator.wait_for_everyone()\n            if self.early_stopping" in code
    (review,) = result.reviews
    assert review.line == 66 and "on every rank: N writes racing on one path" in review.text
    assert "convert stopping.py with this file" in review.text
    assert (project / "stopping.py").read_text() == (STOPPER / "stopping.py").read_text()


def test_a_converted_saver_module_says_what_it_did(tmp_path: Path):
    from accelify.convert.report import summary

    project = _stopper(tmp_path)
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    head = summary(results["stopping.py"]).splitlines()[0]
    assert head.endswith(": nothing to prepare here; 1 torch.save put on the main process only")


@pytest.mark.parametrize(
    "call",
    [
        # not a statement of its own: no barrier can follow it
        "            _ = self.early_stopping(val_loss, self.model)\n",
        # a rank may have left the loop before it, on its own loss
        "            if val_loss > 10.0:\n                continue\n"
        "            self.early_stopping(val_loss, self.model)\n",
    ],
)
def test_a_saver_call_that_cannot_wait_leaves_the_modules_save_on_every_rank(
    tmp_path: Path, call: str
):
    """A call in train.py that gets only a review line (no barrier after it): stopping.py's
    save stays on every rank, since on the main process alone another rank could read the
    file back before it is written; the review line says both are left."""
    project = _stopper(tmp_path)
    train = (project / "train.py").read_text()
    train = train.replace("            self.early_stopping(val_loss, self.model)\n", call, 1)
    (project / "train.py").write_text(train)
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    assert not results["stopping.py"].changed
    (review,) = [n for n in results["train.py"].reviews if "early_stopping()" in n.text]
    if call.startswith("            _ ="):
        assert "wait_for_everyone" not in results["train.py"].converted.decode()
        assert "(stopping.py's save is left on every rank too)" in review.text
    else:  # the barrier follows the call, but the save is not moved
        assert "stopping.py, converted with this file, keeps that save on every rank" in (
            review.text
        )
    assert not any("(stopping.py is converted" in n.text for n in results["train.py"].changes)


def test_an_object_saver_with_a_collective_is_not_treated_as_one(tmp_path: Path):
    # run on the main process alone, its all_reduce would wait for ranks that never come
    project = _stopper(tmp_path)
    stopping = (project / "stopping.py").read_text()
    stopping = stopping.replace(
        "        torch.save(", "        torch.distributed.barrier()\n        torch.save(", 1
    )
    (project / "stopping.py").write_text(stopping)
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    assert not results["stopping.py"].changed
    assert "unwrap_model(self.model)" not in results["train.py"].converted.decode()


def test_a_method_that_hands_its_model_to_a_saving_method_is_a_saver(tmp_path: Path):
    from accelify.analysis.script_model import analyze
    from accelify.convert.project import class_state_savers, saver_class
    from accelify.source import parse

    module = analyze(parse((STOPPER / "stopping.py").read_bytes(), "stopping.py"))
    savers = class_state_savers(module, saver_class(module, "EarlyStopping"))  # type: ignore[arg-type]
    assert set(savers) == {"__call__", "save_checkpoint"}
    assert savers["__call__"].parameters == ("val_loss", "model")
    assert savers["__call__"].saved == {"model"}


def test_an_early_stopping_object_of_a_sibling_module_reloads_its_best_on_two_ranks(
    tmp_path: Path,
):
    project = _stopper(tmp_path)
    original = run_python(project / "train.py", cwd=project)
    assert_ok(original)
    shutil.rmtree(project / "checkpoints")
    assert_ok(run_accelify("convert", project, "--write"))
    alone = run_python(project / "train.py", cwd=project)
    assert_ok(alone)
    assert alone.stdout == original.stdout
    shutil.rmtree(project / "checkpoints")
    result = launch(project / "train.py", cwd=project, timeout=300)
    assert_ok(result)
    assert [line for line in result.stdout.splitlines() if line.startswith("test accuracy")] == [
        "test accuracy 19/32"
    ], result.stdout


_HELPER_SCRIPT = """import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def evaluate(model, loader):
    total = 0.0
    with torch.no_grad():
        for xb, yb in loader:
            total += nn.functional.cross_entropy(model(xb), yb, reduction="sum").item()
    return total


if __name__ == "__main__":
    x = torch.randn(64, 4)
    loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=8)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    print(evaluate(model, loader))
"""


@pytest.mark.parametrize(
    ("where", "importer"),
    [
        ("report.py", "from train import evaluate\n\nevaluate(None, [])\n"),
        ("report.py", "import train\n\ntrain.evaluate(None, [])\n"),
        ("report.py", "import train as t\n\nt.evaluate(None, [])\n"),
        (
            "tools/report.py",
            "import sys\nsys.path.insert(0, '..')\nfrom train import evaluate\n",
        ),
    ],
)
def test_a_helper_reading_the_guarded_global_accelerator_imported_elsewhere_is_said(
    tmp_path: Path, where: str, importer: str
):
    """``evaluate`` gathers through the global ``accelerator`` the conversion creates under the
    main guard; report.py imports it (also under another name, or from a folder below), where
    that global never exists (NameError)."""
    (tmp_path / "train.py").write_text(_HELPER_SCRIPT)
    (tmp_path / where).parent.mkdir(exist_ok=True)
    (tmp_path / where).write_text(importer)
    (result,) = convert_all(list(collect([tmp_path / "train.py"])), Options(), 1)
    assert "accelerator.gather_for_metrics" in result.converted.decode()
    (review,) = [n for n in result.reviews if "reads the global accelerator" in n.text]
    assert review.line == 6 and f"{where} imports evaluate from here" in review.text


def test_a_helper_imported_below_beside_a_namesake_module_is_not_said(tmp_path: Path):
    """``tools/report.py`` beside its own ``tools/train.py``: ``from train import evaluate``
    there reads the namesake, not this file."""
    (tmp_path / "train.py").write_text(_HELPER_SCRIPT)
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "train.py").write_text("def evaluate(model, loader):\n    return 0\n")
    (tmp_path / "tools" / "report.py").write_text("from train import evaluate\n")
    (result,) = convert_all(list(collect([tmp_path / "train.py"])), Options(), 1)
    assert not [n for n in result.reviews if "reads the global accelerator" in n.text]


def test_a_helper_reading_the_global_accelerator_imported_by_no_file_is_not_said(tmp_path: Path):
    (tmp_path / "train.py").write_text(_HELPER_SCRIPT)
    (tmp_path / "report.py").write_text("import torch\n")
    (result,) = convert_all(list(collect([tmp_path / "train.py"])), Options(), 1)
    assert not [n for n in result.reviews if "reads the global accelerator" in n.text]


OWN_LOGGER = FIXTURES / "projects" / "logger_factory_returning_an_object_of_its_own"


def test_a_factory_returning_no_logging_logger_is_not_taken_for_one(tmp_path: Path):
    """The factory calls ``logging.getLogger`` but returns a printer: turning ``logging`` off
    on the other ranks would not touch its lines, so no such guard is written for it."""
    shutil.copytree(OWN_LOGGER, tmp_path / "project")
    (result,) = convert_all(list(collect([tmp_path / "project" / "train.py"])), Options(), 1)
    converted = result.converted.decode()
    assert "logging.disable" not in converted
    assert "import logging\n" not in converted


HANDED = FIXTURES / "projects" / "loaders_handed_to_a_trainer_constructor_by_the_driver"


def _convert_handed(tmp_path: Path, trainer: str | None = None, driver: str | None = None):
    project = tmp_path / "project"
    shutil.copytree(HANDED, project)
    if trainer is not None:
        (project / "trainer.py").write_text(trainer)
    if driver is not None:
        (project / "main.py").write_text(driver)
    results = {
        r.path.rsplit("/", 1)[-1]: r for r in convert_all(list(collect([project])), Options(), 1)
    }
    return project, results["trainer.py"]


def test_loaders_a_driver_hands_a_trainers_constructor_are_prepared_there(tmp_path: Path):
    # main.py makes the loaders and hands them to AutoEncoderTrainer(...); the class builds
    # its model and optimizer in train(): the loaders are prepared as the constructor starts
    _, trainer = _convert_handed(tmp_path)
    assert trainer.prepared == ["model", "optimizer", "train_loader", "val_loader"]
    converted = trainer.converted.decode()
    assert (
        "train_loader, val_loader = self.accelerator.prepare(train_loader, val_loader)" in converted
    )
    assert "self.accelerator.gather_for_metrics((outputs, batch))" in converted
    assert not trainer.reviews
    (note,) = [n for n in trainer.changes if "prepares the loaders it receives" in n.text]
    assert "handed by main.py:19" in note.text  # AutoEncoderTrainer(...)


def test_loaders_handed_by_a_driver_that_constructs_in_a_loop_keep_the_review(tmp_path: Path):
    # one construction per round: each would prepare what it is handed, as a call of the file
    # in a loop would; the class is left as the file alone reads it
    driver = (HANDED / "main.py").read_text()
    looped = driver.replace(
        "    trainer = AutoEncoderTrainer(",
        "    for _ in range(1):\n        trainer = AutoEncoderTrainer(",
    ).replace("    trainer.train(num_epochs=3)", "        trainer.train(num_epochs=3)")
    _, trainer = _convert_handed(tmp_path, driver=looped)
    assert trainer.prepared == ["model", "optimizer"]
    assert any("not prepared" in n.text for n in trainer.reviews)


def test_loaders_a_constructor_hands_on_to_another_call_keep_the_review(tmp_path: Path):
    # what the constructor hands on (a helper of another module may evaluate it) is not followed
    source = (HANDED / "trainer.py").read_text()
    handed_on = source.replace(
        "        self.val_loader = val_loader\n",
        "        self.val_loader = val_loader\n        print(len(val_loader))\n",
    )
    _, trainer = _convert_handed(tmp_path, trainer=handed_on)
    assert trainer.prepared == ["model", "optimizer", "train_loader"]


def test_loaders_of_a_driver_that_trains_itself_are_not_prepared_by_the_class(tmp_path: Path):
    # a driver with its own backward is converted on its own and may prepare what it hands
    driver = (
        HANDED / "main.py"
    ).read_text() + "    torch.zeros(1, requires_grad=True).sum().backward()\n"
    _, trainer = _convert_handed(tmp_path, driver=driver)
    assert trainer.prepared == ["model", "optimizer"]


@pytest.mark.distributed
def test_loaders_a_driver_hands_a_trainers_constructor_shard_on_two_ranks(tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(HANDED, project)
    original = run_python(project / "main.py", cwd=project)
    assert_ok(original)
    assert_ok(run_accelify("convert", project, "--write"))
    one = launch(project / "main.py", processes=1, cwd=project)
    assert_ok(one)
    assert one.stdout == original.stdout
    two = launch(project / "main.py", cwd=project)
    assert_ok(two)
    # each line once; the evaluation covers the whole set (16 samples of 8 values) each epoch
    assert two.stdout.count("### End Training Procedure ###") == 1
    assert two.stdout.count("over 128 values") == 3, two.stdout


def test_a_trainer_that_star_imports_torch_from_a_sibling_module_is_converted(tmp_path: Path):
    """murumura/DCGAN-pytorch: train.py gets ``torch``, ``nn`` and ``optim`` through ``from
    dcgan import *`` (dcgan.py imports them and star imports utils.py in turn). Its
    ``optim.Adam(netD.parameters())`` makes an optimizer: the trainer's own models and
    optimizers are prepared, not left as if handed in from elsewhere."""
    (tmp_path / "utils.py").write_text("import torch.optim as optim\n")
    (tmp_path / "dcgan.py").write_text(
        "import torch\nimport torch.nn as nn\nfrom utils import *\n\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(4, 1)\n\n"
        "    def forward(self, x):\n"
        "        return self.fc(x)\n"
    )
    train = tmp_path / "train.py"
    train.write_text(
        "from dcgan import *\n\n\n"
        "class Trainer:\n"
        "    def train(self, loader):\n"
        "        net = Net()\n"
        "        optimizer = optim.Adam(net.parameters(), lr=0.01)\n"
        "        for x, y in loader:\n"
        "            optimizer.zero_grad()\n"
        "            loss = nn.functional.mse_loss(net(x), y)\n"
        "            loss.backward()\n"
        "            optimizer.step()\n"
    )
    (result,) = convert_all(list(collect([train])), Options(), 1)
    assert result.changed, result.skipped
    assert set(result.prepared) >= {"net", "optimizer"}
    assert "self.accelerator.backward(loss)" in result.converted.decode()


SUBCLASS_SAME_MODULE = FIXTURES / "projects" / "trainer_subclass_of_a_base_in_its_engine_module"


def test_a_driver_and_an_engine_whose_subclass_trains_through_its_base_convert_together(
    tmp_path: Path,
):
    """trial13: train.py builds ``ClassifierTrainer(BaseTrainer)`` of trainer.py, whose
    backward is in the base's ``train_epoch``: both files are converted as one (the engine
    alone once paired while the driver was skipped: its prints ran on every rank, its
    ``torch.load`` of the best checkpoint raced the main process's save, and its unprepared
    test loader went to an ``evaluate`` that now gathers, counting every sample twice)."""
    project = tmp_path / "project"
    shutil.copytree(SUBCLASS_SAME_MODULE, project)
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    trainer, train = results["trainer.py"], results["train.py"]
    assert trainer.changed and train.changed
    driver = train.converted.decode()
    assert "from accelify import PartialState\n" in driver  # not the engine's Accelerator
    assert "from accelify import Accelerator\n" in trainer.converted.decode()  # nor PartialState
    assert "wait_for_everyone()\n    model.load_state_dict(torch.load(" in driver
    assert "trainer.evaluate(\n        trainer.accelerator.prepare(test_loader)\n    )" in driver


@pytest.mark.distributed
def test_a_driver_and_an_engine_whose_subclass_trains_through_its_base_run_on_two_ranks(
    tmp_path: Path,
):
    project = tmp_path / "project"
    shutil.copytree(SUBCLASS_SAME_MODULE, project)
    original = run_python(project / "train.py", cwd=project)
    assert_ok(original)
    shutil.rmtree(project / "runs")
    assert_ok(run_accelify("convert", project, "--write"))
    alone = launch(project / "train.py", cwd=project, timeout=300, processes=1)
    assert alone.stdout == original.stdout
    shutil.rmtree(project / "runs")
    result = launch(project / "train.py", cwd=project, timeout=300)
    assert_ok(result)
    lines = result.stdout.splitlines()
    assert len([line for line in lines if line.startswith("best val acc")]) == 1, result.stdout
    (test,) = [line for line in lines if line.startswith("test: ")]
    assert test.endswith(" n=333")  # the whole test set, once


HELPER_OF_A_PACKAGE = FIXTURES / "projects" / "checkpoint_helper_of_a_package_module"


def _converted_package(tmp_path: Path) -> tuple[Path, str]:
    project = tmp_path / "project"
    shutil.copytree(HELPER_OF_A_PACKAGE, project)
    result = run_accelify("convert", project, "--write")
    assert_ok(result)
    return project, result.stdout


def test_a_checkpoint_helper_of_a_third_module_runs_on_the_main_process(tmp_path: Path):
    """trial14: ``src/engine.py``'s trainer, converted with its driver, calls ``save_checkpoint``
    of ``src/utils.py`` (``from .utils import ...``), which saves what it is handed: each call
    runs on the main process between two barriers, as a helper of a sibling module imported
    from the converted file itself is; the helper's module is left as it is."""
    project, summary = _converted_package(tmp_path)
    engine = (project / "src" / "engine.py").read_text()
    assert (
        "            self.accelerator.wait_for_everyone()\n"
        "            if self.accelerator.is_main_process:\n"
        "                save_checkpoint(\n"
    ) in engine
    assert '                        "model": self.accelerator.unwrap_model(self.model)' in engine
    assert (
        '                    f"{self.out_dir}/checkpoint.pth",\n'
        "                )\n"
        "            self.accelerator.wait_for_everyone()\n"
    ) in engine
    assert (project / "src" / "utils.py").read_bytes() == (
        HELPER_OF_A_PACKAGE / "src" / "utils.py"
    ).read_bytes()
    assert "src/engine.py:53: save_checkpoint() saves a model's state (src/utils.py:8)" in summary
    assert "the state_dict() calls in its arguments now run on the main process alone" in summary


def test_a_checkpoint_helper_that_does_more_than_save_is_left_with_why(tmp_path: Path):
    # it keeps a list every rank reads: run on the main process alone, the others' would differ
    project = tmp_path / "project"
    shutil.copytree(HELPER_OF_A_PACKAGE, project)
    utils = project / "src" / "utils.py"
    utils.write_text(
        utils.read_text().replace(
            "    torch.save(state, path)\n", "    torch.save(state, path)\n    SAVED.append(path)\n"
        )
        + "\n\nSAVED = []\n"
    )
    result = run_accelify("convert", project, "--write")
    assert_ok(result)
    engine = (project / "src" / "engine.py").read_text()
    assert "is_main_process:\n                save_checkpoint(" not in engine
    (review,) = [line for line in result.stdout.splitlines() if "src/engine.py:53:" in line]
    assert review.lstrip().startswith("review ")
    assert "save_checkpoint() is a function of another module that saves" in review
    assert "it does more than save" in review


def test_a_checkpoint_helper_of_a_third_module_resumes_on_two_ranks(tmp_path: Path):
    original = tmp_path / "original"
    shutil.copytree(HELPER_OF_A_PACKAGE, original)
    before = run_python(original / "train.py", cwd=original)
    assert_ok(before)
    project, _ = _converted_package(tmp_path)
    alone = run_python(project / "train.py", cwd=project)
    assert_ok(alone)
    assert alone.stdout == before.stdout  # every printed line, on one process
    shutil.rmtree(project / "out")
    assert_ok(launch(project / "train.py", cwd=project, timeout=300))
    assert (project / "out" / "best.pth").is_file()
    resumed = launch(
        project / "train.py",
        "--epochs",
        "3",
        "--resume",
        "out/checkpoint.pth",
        cwd=project,
        timeout=300,
    )
    assert_ok(resumed)
    assert "resumed at epoch 2" in resumed.stdout
    assert resumed.stdout.count("epoch 2 val") == 1, resumed.stdout


@pytest.mark.parametrize(
    ("line", "package", "expected"),
    [
        ("from .utils import save_checkpoint", ["src"], "from src.utils import save_checkpoint"),
        ("from . import utils", ["pkg", "src"], "from pkg.src import utils"),
        ("from ..common.io import save", ["pkg", "src"], "from pkg.common.io import save"),
        ("from ..io import save", ["src"], "from io import save"),
        ("from ...io import save", ["src"], "from ...io import save"),  # above the driver
        ("from . import utils", [], "from . import utils"),  # no module to name
        ("import torch", ["src"], "import torch"),
    ],
)
def test_an_engines_relative_import_is_read_from_the_drivers_folder(
    line: str, package: list[str], expected: str
):
    from accelify.convert.across import _rebased

    module = cst.parse_module(line + "\n")
    (small,) = module.body[0].body
    assert module.code_for_node(_rebased(small, package)).strip() == expected


DRIVER_SAVES = FIXTURES / "projects" / "driver_saves_the_model_its_trainer_prepares"


def test_a_driver_saves_the_model_its_trainer_prepares_once_with_plain_keys(tmp_path: Path):
    """``torch.save(trainer.model.state_dict(), path)`` in the driver of a trainer whose own
    conversion prepares ``self.model`` (realconv36's vae): as the trainer's own save, after a
    barrier, once, of the unwrapped model's keys; the reload below waits for it."""
    project, results = _results(DRIVER_SAVES, tmp_path)
    train = results["train.py"]
    assert not train.reviews, train.reviews
    converted = train.converted.decode()
    assert (
        "        trainer.accelerator.wait_for_everyone()\n"
        "        trainer.accelerator.save(\n"
        '            trainer.accelerator.get_state_dict(trainer.model), "checkpoints/model.pt"\n'
        "        )\n"
    ) in converted
    # the optimizer's state dict is its own (no wrapper keys): saved as it is, once
    assert 'trainer.accelerator.save(\n        {"optimizer": trainer.optimizer.state_dict()}' in (
        converted
    )
    read = converted.index('model.load_state_dict(torch.load("checkpoints/model.pt"))')
    assert converted.rindex("trainer.accelerator.wait_for_everyone()", 0, read) > converted.index(
        '"checkpoints/optimizer.pt"'
    )
    lines = {note.line: note.text for note in train.changes}
    assert "of trainer.accelerator.get_state_dict()" in lines[20]
    assert "get_state_dict" not in lines[21]
    assert "this file's saves above now write on the main process only" in lines[23]
    assert_ok(run_accelify("convert", project, "--write"))
    assert_ok(run_accelify("convert", project, "--check"))  # converting again changes nothing


DRIVER_SAVES_ALIAS = (
    FIXTURES / "projects" / "driver_saves_an_alias_of_the_model_its_trainer_prepares"
)


def test_a_driver_saves_an_alias_of_the_model_its_trainer_prepares_with_plain_keys(
    tmp_path: Path,
):
    """``net = trainer.model`` then ``torch.save(net.state_dict(), path)`` (review10a): the
    name is the prepared model, so its state is the accelerator's get_state_dict, not the DDP
    wrapper's ``module.`` keys (the reload below crashed on 2 ranks)."""
    _, results = _results(DRIVER_SAVES_ALIAS, tmp_path)
    train = results["train.py"]
    assert not train.reviews, train.reviews
    converted = train.converted.decode()
    assert "trainer.accelerator.get_state_dict(net)" in converted
    assert "net.state_dict()" not in converted


def test_a_helper_of_the_driver_handed_the_trainer_is_told_its_save_writes_module_keys(
    tmp_path: Path,
):
    """``def checkpoint(tr, path): torch.save(tr.model.state_dict(), path)`` called with the
    trainer (review10a p1): ``tr.model`` is the prepared model, so the review line at the save
    says what breaks (``module.`` keys the plain model does not load) and what to write there,
    through the accelerator the helper is handed (``tr.accelerator``)."""
    project = tmp_path / "project"
    shutil.copytree(DRIVER_SAVES_ALIAS, project)
    train_py = project / "train.py"
    source = train_py.read_text()
    source = source.replace(
        "def main():\n",
        "def checkpoint(tr, path):\n    torch.save(tr.model.state_dict(), path)\n\n\ndef main():\n",
    )
    source = source.replace(
        '        print(f"epoch {epoch} done")\n',
        '        print(f"epoch {epoch} done")\n'
        '        checkpoint(trainer, "checkpoints/helper.pt")\n',
    )
    train_py.write_text(source)
    results = {
        r.path.rsplit("/", 1)[-1]: r for r in convert_all(list(collect([project])), Options(), 1)
    }
    (review,) = results["train.py"].reviews
    assert review.line == 11
    assert "under if tr.accelerator.is_main_process" in review.text
    assert "module. prefix, which the plain model does not load" in review.text
    assert "save tr.accelerator.unwrap_model(tr.model).state_dict() instead of" in review.text


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        (  # a barrier under a per-rank condition would hang the ranks that skip it
            '        torch.save(trainer.model.state_dict(), "checkpoints/model.pt")\n',
            "        if torch.rand(1).item() > 0.5:\n"
            '            torch.save(trainer.model.state_dict(), "checkpoints/model.pt")\n',
            "unwrap_model(trainer.model).state_dict()",
        ),
        (  # the prepared wrapper pickled whole: no plain-keys form to write for it
            '        torch.save(trainer.model.state_dict(), "checkpoints/model.pt")\n',
            '        torch.save(trainer.model, "checkpoints/model.pt")\n',
            "under if trainer.accelerator.is_main_process",
        ),
    ],
)
def test_a_driver_save_that_cannot_be_made_once_keeps_its_review_line(
    tmp_path: Path, old: str, new: str, why: str
):
    project = tmp_path / "project"
    shutil.copytree(DRIVER_SAVES, project)
    train_py = project / "train.py"
    source = train_py.read_text()
    assert old in source
    train_py.write_text(source.replace(old, new))
    results = {
        r.path.rsplit("/", 1)[-1]: r for r in convert_all(list(collect([project])), Options(), 1)
    }
    train = results["train.py"]
    (review,) = [r for r in train.reviews if "checkpoints/model.pt" not in r.text]
    assert "each process writes the same file" in review.text and why in review.text
    assert "torch.save(trainer.model" in train.converted.decode()


@pytest.mark.distributed
def test_a_driver_saving_the_model_its_trainer_prepares_reloads_it_on_two_ranks(tmp_path: Path):
    """realconv36's vae on 2 ranks: the reload crashed on ``module.``-prefixed keys."""
    project = tmp_path / "project"
    shutil.copytree(DRIVER_SAVES, project)
    original = run_python(project / "train.py", cwd=project)
    assert_ok(original)
    assert_ok(run_accelify("convert", project, "--write"))
    result = launch(project / "train.py", cwd=project, timeout=300)
    assert_ok(result)
    assert result.stdout == original.stdout


def test_loaders_a_driver_gets_from_a_factory_module_are_prepared_by_the_class(tmp_path: Path):
    # realconv37 dcgan: main.py hands the trainer what ``get_dataloader()`` of dataloader.py
    # returns; before, only the model and optimizer were prepared and every rank trained on all
    # the data (the review line said the batches came from no DataLoader)
    driver = (HANDED / "main.py").read_text()
    made_elsewhere = driver.replace(
        "from trainer import AutoEncoderTrainer\n",
        "from trainer import AutoEncoderTrainer\nfrom loaders import make_loaders\n",
    ).replace(
        "    train_loader = DataLoader(TensorDataset(data[:32]), batch_size=4, shuffle=True)\n"
        "    val_loader = DataLoader(TensorDataset(data[32:]), batch_size=4)\n",
        "    train_loader, val_loader = make_loaders(data)\n",
    )
    assert "make_loaders(data)" in made_elsewhere
    project = tmp_path / "project"
    shutil.copytree(HANDED, project)
    (project / "main.py").write_text(made_elsewhere)
    (project / "loaders.py").write_text(
        "from torch.utils.data import DataLoader, TensorDataset\n\n\n"
        "def make_loaders(data):\n"
        "    train = DataLoader(TensorDataset(data[:32]), batch_size=4, shuffle=True)\n"
        "    return train, DataLoader(TensorDataset(data[32:]), batch_size=4)\n"
    )
    results = {
        r.path.rsplit("/", 1)[-1]: r for r in convert_all(list(collect([project])), Options(), 1)
    }
    trainer = results["trainer.py"]
    assert trainer.prepared == ["model", "optimizer", "train_loader", "val_loader"]
    assert not trainer.reviews


RUN_FOLDER = FIXTURES / "projects" / "run_folder_made_by_a_utils_module"


def _convert_run_folder(tmp_path: Path, utils: str | None = None):
    project = tmp_path / "project"
    shutil.copytree(RUN_FOLDER, project)
    if utils is not None:
        (project / "utils.py").write_text(utils)
    (result,) = convert_all(list(collect([project / "train.py"])), Options(), 1)
    return result


def test_a_run_folder_a_utils_function_makes_on_every_rank_is_reviewed_at_the_call(
    tmp_path: Path,
):
    """``out = make_run_dir(args.out)`` of utils.py, which is not converted with train.py: its
    ``if not os.path.exists(d): os.mkdir(d)`` races on 2 ranks (FileExistsError), and its
    timestamped name differs per rank. The call is reviewed, naming the helper's line."""
    result = _convert_run_folder(tmp_path)
    reviews = [n for n in result.reviews if "make_run_dir()" in n.text]
    assert [n.line for n in reviews] == [15], result.reviews
    assert "utils.py:11" in reviews[0].text
    assert "FileExistsError" in reviews[0].text and "time.strftime()" in reviews[0].text


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        # exist_ok: no race on the folder, only the name per rank
        ("        os.mkdir(d)\n", "        os.makedirs(d, exist_ok=True)\n", "time.strftime()"),
        # a name the ranks share: only the race
        ('time.strftime("%Y%m%d-%H%M%S")', '"latest"', "FileExistsError"),
    ],
)
def test_a_run_folder_a_utils_function_makes_is_reviewed_for_what_goes_wrong_only(
    tmp_path: Path, old: str, new: str, said: str
):
    utils = (RUN_FOLDER / "utils.py").read_text()
    assert old in utils
    result = _convert_run_folder(tmp_path, utils.replace(old, new))
    (review,) = [n.text for n in result.reviews if "make_run_dir()" in n.text]
    other = {"time.strftime()", "FileExistsError"} - {said}
    assert said in review and not any(o in review for o in other), review


def test_a_run_folder_a_utils_function_makes_safely_is_not_reviewed(tmp_path: Path):
    utils = (RUN_FOLDER / "utils.py").read_text()
    utils = utils.replace("        os.mkdir(d)\n", "        os.makedirs(d, exist_ok=True)\n")
    result = _convert_run_folder(tmp_path, utils.replace('time.strftime("%Y%m%d-%H%M%S")', '"x"'))
    assert not [n for n in result.reviews if "make_run_dir()" in n.text], result.reviews


PRINTERS = FIXTURES / "projects" / "progress_bar_of_a_utils_module"


def _convert_printers(tmp_path: Path, utils: str | None = None):
    project = tmp_path / "project"
    shutil.copytree(PRINTERS, project)
    if utils is not None:
        (project / "utils.py").write_text(utils)
    (result,) = convert_all(list(collect([project / "train.py"])), Options(), 1)
    return result


def test_calls_of_a_module_function_that_only_prints_run_on_the_local_main_process(
    tmp_path: Path,
):
    result = _convert_printers(tmp_path)
    converted = result.converted.decode()
    assert "        if accelerator.is_local_main_process:\n            progress_bar(" in converted
    assert '    if accelerator.is_local_main_process:\n        log("epoch %d done"' in converted
    notes = [n.text for n in result.changes if "it only prints" in n.text]
    assert len(notes) == 2 and "utils.py:13" in notes[0], notes


@pytest.mark.parametrize(
    ("old", "new", "helper"),
    [
        # a global another function reads: the ranks that skip the call would miss its update
        ("    print(line)\n", "    print(line, last_time)\n", "progress_bar"),
        # returns what it printed: the other ranks would have nothing
        ("    sys.stdout.flush()\n", "    sys.stdout.flush()\n    return msg\n", "progress_bar"),
        # writes a file too: that is the writers' business (and their barrier)
        ("    print(line)\n", '    print(line)\n    open("log.txt", "a").write(line)\n', "log"),
    ],
)
def test_a_module_function_that_does_more_than_print_is_not_taken_for_a_printer(
    tmp_path: Path, old: str, new: str, helper: str
):
    utils = (PRINTERS / "utils.py").read_text()
    assert old in utils
    result = _convert_printers(tmp_path, utils.replace(old, new))
    notes = "\n".join(n.text for n in result.changes)
    assert f"{helper}(...) runs on the local main process" not in notes, notes


_COUNTING_LOG = (
    'counts = {"n": 0}\n\n\ndef log(line):\n    counts["n"] += 1\n    print(counts["n"], line)\n'
)


def test_a_printer_that_counts_its_lines_in_a_module_dict_of_its_own_runs_on_the_main_process(
    tmp_path: Path,
):
    """``counts["n"] += 1; print(...)`` (review11a t7): the count only it reads; every rank
    printed each line before."""
    utils = (PRINTERS / "utils.py").read_text().replace("def log(line):\n    print(line)\n", "")
    result = _convert_printers(tmp_path, utils + "\n\n" + _COUNTING_LOG)
    assert '    if accelerator.is_local_main_process:\n        log("epoch %d done"' in (
        result.converted.decode()
    )


@pytest.mark.parametrize(
    "reader",
    [
        "\n\ndef total():\n    return counts['n']\n",  # another function of its module reads it
        None,  # the training script reads it
    ],
)
def test_a_printer_whose_count_is_read_elsewhere_stays_on_every_rank(
    tmp_path: Path, reader: str | None
):
    utils = (PRINTERS / "utils.py").read_text().replace("def log(line):\n    print(line)\n", "")
    utils += "\n\n" + _COUNTING_LOG + (reader or "")
    project = tmp_path / "project"
    shutil.copytree(PRINTERS, project)
    (project / "utils.py").write_text(utils)
    if reader is None:
        train = project / "train.py"
        train.write_text(
            train.read_text().replace("import log,", "import counts, log,") + "print(counts)\n"
        )
    (result,) = convert_all(list(collect([project / "train.py"])), Options(), 1)
    notes = "\n".join(n.text for n in result.changes)
    assert "log(...) runs on the local main process" not in notes, notes


_SAMPLES_UTILS = """import torch


def generate_new_image(generator, z, save_path):
    generator.eval()
    with torch.no_grad():
        images = generator(z)
    generator.train()
    torch.save(images, save_path)
"""

_SAMPLES_TRAIN = """import torch
from torch.utils.data import DataLoader, TensorDataset
from utils import generate_new_image

generator = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(generator.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4)
fixed_z = torch.randn(2, 4)
for epoch in range(2):
    for (x,) in loader:
        optimizer.zero_grad()
        loss = ((generator(x) - x) ** 2).mean()
        loss.backward()
        optimizer.step()
    generate_new_image(generator, fixed_z, "epoch-%d.pt" % epoch)
"""


@pytest.mark.parametrize("hands_loader", [False, True])
def test_a_module_function_that_runs_the_model_and_saves_a_file_gets_a_review_line(
    tmp_path: Path, hands_loader: bool
):
    # realconv37 dcgan: utils.generate_new_image(self.generator, z, save_path=...) runs the
    # prepared generator and torch.saves what it makes on every rank; nothing said so (lint's
    # ACC201 did). Handed a loader it may evaluate each rank's shard: not this advice.
    (tmp_path / "utils.py").write_text(_SAMPLES_UTILS)
    train = _SAMPLES_TRAIN
    if hands_loader:
        train = train.replace("(generator, fixed_z,", "(generator, loader,")
    (tmp_path / "train.py").write_text(train)
    (result,) = convert_all(list(collect([tmp_path / "train.py"])), Options(), 1)
    found = [n.text for n in result.reviews if "writes a file (utils.py:9)" in n.text]
    if hands_loader:
        assert not found
    else:
        (text,) = found
        assert "accelerator.unwrap_model(generator)" in text
        assert "`if accelerator.is_main_process:`" in text


_TRAINS_THEN_TESTS = {
    "train.py": (
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n\n\n"
        "def train(epochs):\n"
        "    x = torch.randn(32, 4)\n"
        "    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)\n"
        "    net = torch.nn.Linear(4, 1)\n"
        "    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "    for _ in range(epochs):\n"
        "        for xb, yb in loader:\n"
        "            optimizer.zero_grad()\n"
        "            loss = torch.nn.functional.mse_loss(net(xb), yb)\n"
        "            loss.backward()\n"
        "            optimizer.step()\n"
        '    torch.save(net.state_dict(), "net.pth")\n'
    ),
    "evaluate.py": (
        "import torch\n\n\n"
        "def test():\n"
        "    net = torch.nn.Linear(4, 1)\n"
        '    net.load_state_dict(torch.load("net.pth"))\n'
        "    x = torch.randn(16, 4)\n"
        "    loss = torch.nn.functional.mse_loss(net(x), x.sum(1, keepdim=True))\n"
        '    print("test loss", loss.item())\n'
    ),
    "main.py": "from evaluate import test\nfrom train import train\n\ntrain(2)\ntest()\n",
}


def test_a_driver_is_reviewed_where_it_calls_a_sibling_function_that_prints_and_loads(
    tmp_path: Path,
):
    """HandwrittenDigitRecognition (realconv38): ``train()`` of ``common/train.py`` is
    converted, then the driver calls ``test()`` of ``common/test.py``, which trains nothing (so
    is not converted), prints its accuracy and loads the checkpoint train() now saves on the
    main process only: each line would show once per rank, with nothing said."""
    for name, code in _TRAINS_THEN_TESTS.items():
        (tmp_path / name).write_text(code)
    result = run_accelify("convert", tmp_path)
    assert_ok(result)
    review = next(line for line in result.stdout.splitlines() if "main.py:5:" in line)
    assert "test() (evaluate.py, not converted: it trains nothing) prints on every rank" in review
    assert "PartialState().wait_for_everyone()" in review
    without_load = _TRAINS_THEN_TESTS["evaluate.py"].replace(
        '    net.load_state_dict(torch.load("net.pth"))\n', ""
    )
    (tmp_path / "evaluate.py").write_text(without_load)
    result = run_accelify("convert", tmp_path)
    review = next(line for line in result.stdout.splitlines() if "main.py:5:" in line)
    assert "prints on every rank" in review and "wait_for_everyone" not in review


def test_a_method_of_a_sibling_class_named_only_in_an_annotation_leaves_the_script_as_it_is(
    tmp_path: Path,
):
    """KDD-NPA (realconv38): ``def train(model: NPAModel, ...)`` trains through
    ``model.forward_train(...)``, a method of ``model.py``'s class that runs its layers (no
    ``forward``); the driver builds the model. Through ``unwrap_model`` the gradients would never
    be averaged, on the wrapper the method does not exist: the script is left as it is, as when
    this file builds the class itself, not unwrapped with a review line that only guesses."""
    (tmp_path / "netmod.py").write_text(
        "import torch.nn as nn\n\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(4, 2)\n\n"
        "    def forward_train(self, x):\n"
        "        return self.fc(x)\n"
    )
    (tmp_path / "train.py").write_text(
        "import torch\n"
        "from netmod import Net\n\n\n"
        "def train(model: Net, loader):\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for xb, yb in loader:\n"
        "        optimizer.zero_grad()\n"
        "        loss = torch.nn.functional.cross_entropy(model.forward_train(xb), yb)\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
    )
    result = run_accelify("convert", tmp_path / "train.py")
    assert_ok(result)
    assert "unwrap_model(model).forward_train" not in result.stdout
    assert (
        "model.forward_train() (defined at netmod.py:9) runs the model's layers outside its "
        "forward during training" in result.stdout
    ), result.stdout


METERS = FIXTURES / "projects" / "meters_of_a_sibling_module"


def test_a_meter_class_of_a_sibling_module_read_after_training_gets_a_review_line(
    tmp_path: Path,
):
    """The ImageNet example's ``AverageMeter`` lives in ``utils.py``: a training loop over a
    prepared loader fills it with its rank's batches only, as it does a meter of the script's
    own file; one read through a method that reduces across ranks is right as it is."""
    shutil.copytree(METERS, tmp_path / "project")
    (result,) = convert_all(list(collect([tmp_path / "project" / "train.py"])), Options(), 1)
    (review,) = result.reviews
    assert review.line == 20  # print(f"samples {losses.count} ...")
    assert review.text.startswith(
        "losses (AverageMeter) is updated with this rank's batches of loader only (line 15)"
    )
    edited = (METERS / "train.py").read_text().replace("synced.synced_avg()", "synced.avg")
    (tmp_path / "project" / "train.py").write_text(edited)
    (result,) = convert_all(list(collect([tmp_path / "project" / "train.py"])), Options(), 1)
    assert [(r.line, r.text.split(" is updated")[0]) for r in result.reviews] == [
        (20, "losses (AverageMeter)"),
        (21, "synced (meters.SyncedMeter)"),
    ]


def test_a_dict_of_loaders_an_engine_prepares_itself_is_named_in_the_drivers_note():
    """trial20: the driver's note on an already converted engine said "prepares , self.model":
    the dict prepared entry by entry has no input name; it is named as it is kept."""
    from accelify.convert.project import prepared_by_hand

    engine = (
        b"class Trainer:\n    def __init__(self, model, loaders):\n"
        b"        self.accelerator = Accelerator()\n"
        b"        self.loaders = {\n"
        b"            k: self.accelerator.prepare(v) for k, v in loaders.items()\n        }\n"
        b"        self.model = self.accelerator.prepare(model)\n"
    )
    assert prepared_by_hand(engine, "engine.py") == ["self.loaders", "model"]


NAMED_IN_AN_ANNOTATION = (
    FIXTURES / "projects" / "trainer_module_whose_class_the_driver_names_in_an_annotation"
)


def test_a_driver_that_names_a_class_of_its_trainer_module_in_an_annotation_converts_with_it(
    tmp_path: Path,
):
    """realconv40 (/tmp/realconv40/metric_trainer): ``def log_metrics(metrics: EpochMetrics)``
    reads the trainer module's dataclass in an annotation only, the same class in the combined
    script; the two were left unconverted with "the two do not combine into one script"."""
    project = tmp_path / "project"
    shutil.copytree(NAMED_IN_AN_ANNOTATION, project)
    results = {Path(r.path).name: r for r in convert_all(list(collect([project])), Options(), 1)}
    trainer, train = results["trainer.py"], results["train.py"]
    assert trainer.prepared == ["self.model", "self.optimizer", "train_loader", "val_loader"]
    code = trainer.converted.decode()
    assert "self.accelerator.backward(loss)" in code
    assert "outputs, y = self.accelerator.gather_for_metrics((outputs, y))" in code
    driver = train.converted.decode()
    assert "from trainer import EpochMetrics, Trainer\n" in driver
    assert "def log_metrics(metrics: EpochMetrics) -> None:\n    PartialState().print(" in driver
    assert not trainer.reviews and not train.reviews


LISTENERS = FIXTURES / "projects" / "listeners_handed_to_a_trainer"


def _converted_listeners(tmp_path: Path, names: list[str]) -> dict[str, Conversion]:
    project = tmp_path / "project"
    shutil.copytree(LISTENERS, project)
    files = list(collect([project / name for name in names]))
    return {r.path.rsplit("/", 1)[-1]: r for r in convert_all(files, Options(), 1)}


def test_listeners_a_trainer_calls_back_print_once_and_their_writes_are_reviewed(
    tmp_path: Path,
):
    """master_thesis' shape: ``train.py`` hands ``LossReporter()`` and ``ModelSaver(...)`` to the
    trainer, whose loop calls ``listener.report(state)``. ``listeners.py`` trains nothing and was
    skipped: on 2 ranks each line showed twice, each rank saved the wrapped model, nothing said
    so. Its prints are now put on the main process; the save gets a review line where the saver
    is made."""
    results = _converted_listeners(tmp_path, ["train.py", "trainer.py", "listeners.py"])
    listeners, train = results["listeners.py"], results["train.py"]
    text = listeners.converted.decode()
    assert "from accelify import PartialState" in text
    assert (
        "        if PartialState().is_main_process:\n"
        '            print("epoch %d loss %.4f" % (state["epoch"], state["loss"]))\n'
    ) in text
    assert '        torch.save(state["model"], self.path)\n' in text  # left: reviewed
    assert [note.line for note in listeners.changes] == [8]
    (review,) = train.reviews
    assert review.line == 15  # ModelSaver("model.pt"): LossReporter() at 14 needs none now
    assert "ModelSaver(...) is handed to Trainer(...)" in review.text
    assert "writes a file (listeners.py:16, torch.save(...))" in review.text
    assert "save accelerator.unwrap_model(model)" in review.text
    assert results["trainer.py"].changed


def test_listeners_of_a_module_outside_the_run_get_review_lines_for_their_prints(
    tmp_path: Path,
):
    results = _converted_listeners(tmp_path, ["train.py", "trainer.py"])
    reviews = {note.line: note.text for note in results["train.py"].reviews}
    assert "(listeners.py is not converted)" in reviews[14]
    assert "its report() prints (listeners.py:8), each line once per rank" in reviews[14]
    assert "listeners.py:16" in reviews[15]


def test_a_listener_object_handed_to_no_trainer_is_not_reviewed(tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(LISTENERS, project)
    driver = project / "train.py"
    source = driver.read_text()
    driver.write_text(
        source.replace('    ModelSaver("model.pt"),\n', "")
        + '\nsaver = ModelSaver("model.pt")\nprint(saver)\n'
    )
    files = list(collect([driver, project / "trainer.py"]))
    result = next(r for r in convert_all(files, Options(), 1) if r.path.endswith("train.py"))
    assert [note.line for note in result.reviews] == [14]  # LossReporter() only
