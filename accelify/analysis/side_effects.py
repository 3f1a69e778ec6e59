"""Effects meant to happen once per run, not once per rank: files written or deleted by any API
(``save_image``, ``savefig``, ``np.save``, ``json.dump``, safetensors, ``save_pretrained``,
``shutil.rmtree``...), TensorBoard writers, and directories created with a check-then-create race
(``if not os.path.exists(d): os.makedirs(d)``: two ranks pass the check, one dies with
FileExistsError), and uploads to the Hub (N commits racing on one repo)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis import names
from accelify.analysis.loops import first_enumerate_name
from accelify.analysis.placement import Placement
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import argument_value, dotted, target_names, walk

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts


@dataclass
class Write:
    """A statement that writes or deletes files; ``call`` is the writing call in it."""

    statement: cst.SimpleStatementLine
    call: cst.Call


@dataclass
class MakedirsRace:
    """``os.makedirs(d)``/``os.mkdir(d)`` without ``exist_ok``, bare or under ``if not exists``."""

    statement: cst.CSTNode  # the call's statement, or the whole ``if``
    call: cst.Call


@dataclass
class SummaryWriterUse:
    """A TensorBoard writer: its creation and every statement that uses it, or why not all
    uses can be guarded (the writer passed on, returned, used in an expression)."""

    name: str
    created: cst.SimpleStatementLine
    uses: list[cst.SimpleStatementLine]
    escapes: int | None  # line of a use that is not a statement of its own


def writes(model: ScriptModel, placement: Placement, with_torch_save: bool = False) -> list[Write]:
    """Statements whose call writes or deletes files (``torch.save`` too when asked: the
    saving step handles it apart)."""
    writers = names.FILE_WRITERS | names.TORCH_SAVE if with_torch_save else names.FILE_WRITERS
    found = []
    for line, call in placement.expression_statements():
        if (
            model.call_names(call) & writers
            or writes_by_method(model, call)
            or uploads(model, call)
        ):
            found.append(Write(line, call))
    return found


def writes_by_method(model: ScriptModel, call: cst.Call) -> bool:
    """``model.save_pretrained(d)``, ``df.to_csv(p)``: a method that writes files. Not
    ``self.save_pretrained(d)`` in a class that defines ``save_pretrained``, itself or in a
    base class of the file or of another module of the project (trlx's trainer: its method
    saves the model with ``is_main_process=`` and the tokenizer under a guard): its writes are
    judged in its body, and a guard at the call would put the method's barrier and state-dict
    gather on one rank (a hang)."""
    func = call.func
    if not isinstance(func, cst.Attribute) or func.attr.value not in names.FILE_WRITING_METHODS:
        return False
    if dotted(func.value) != "self":
        return True
    owner = model.index.enclosing_class(call)
    return owner is None or not defines_method(model, owner, func.attr.value)


def defines_method(model: ScriptModel, owner: cst.ClassDef, name: str, depth: int = 0) -> bool:
    """``owner`` (a class of ``model``'s file) or one of its base classes defines ``name``:
    a base of the file, or one imported from another module of the project (``from
    base_trainer import RLTrainer``), looked up in its own module and, in turn, its bases."""
    if model.call_graph.lookup(owner, name) is not None:
        return True
    if model.project is None or depth > 8:
        return False
    for base in owner.bases:
        based = dotted(base.value)
        imported = model.project.imported_class(model, based) if based else None
        if imported is not None and defines_method(*imported, name, depth + 1):
            return True
    return False


#: Methods that write through an open file (``f.write(line)``), and through a csv writer made
#: over one (``csv.writer(f).writerow(row)``).
_HANDLE_WRITING_METHODS = {"write", "writelines"}
_CSV_WRITING_METHODS = {"writerow", "writerows", "writeheader"}
_CSV_WRITERS = {"csv.writer", "csv.DictWriter"}


def handle_writes(model: ScriptModel, placement: Placement) -> list[Write]:
    """Statements that write through a handle the file opened for writing (``log =
    open(path, "w")`` or ``with open(path, "a") as log``): ``log.write(...)``,
    ``log.writelines(...)``, ``print(..., file=log)``, ``csv.writer(log).writerow(...)``. Every
    rank that opens the path and writes through it writes the same file."""
    found = []
    for line, call in placement.expression_statements():
        if opened_for_writing(model, call) is not None:
            found.append(Write(line, call))
    return found


def opened_for_writing(model: ScriptModel, call: cst.Call) -> cst.Call | None:
    """The ``open(path, "w")`` (``"a"``, ``"x"``) whose handle ``call`` writes through: as the
    receiver of ``write``/``writelines``, as ``print``'s ``file=``, through a ``csv.writer``
    over it, or handed to a writer (``json.dump(rows, f)``). None where the name is bound to
    anything else in the call's scope (one rank's file, a sink, a parameter)."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in _HANDLE_WRITING_METHODS:
        return _open_of(model, func.value, call)
    if isinstance(func, cst.Attribute) and func.attr.value in _CSV_WRITING_METHODS:
        writer = _bound_value(model, func.value, call)
        if (
            isinstance(writer, cst.Call)
            and model.call_names(writer) & _CSV_WRITERS
            and writer.args
            and not isinstance(writer.args[0].value, cst.Call)
        ):
            return _open_of(model, writer.args[0].value, writer)
        return None
    if dotted(func) == "print":
        target = argument_value(call, "file", None)
        return _open_of(model, target, call) if target is not None else None
    if model.call_names(call) & names.FILE_WRITERS:
        for argument in call.args:
            if argument.keyword is None and isinstance(argument.value, cst.Name):
                opened = _open_of(model, argument.value, call)
                if opened is not None:
                    return opened
    return None


def _open_of(model: ScriptModel, handle: cst.BaseExpression, at: cst.CSTNode) -> cst.Call | None:
    opened = _bound_value(model, handle, at)
    return opened if isinstance(opened, cst.Call) and opens_for_writing(opened) else None


def _bound_value(
    model: ScriptModel, handle: cst.BaseExpression, at: cst.CSTNode
) -> cst.BaseExpression | None:
    """What ``handle`` (a plain name, or ``self.name`` of the class ``at`` is in) is bound to:
    the item of the ``with`` around ``at`` that names it, else its one binding in ``at``'s scope
    (the class, for ``self.name``)."""
    name = dotted(handle)
    if name is None:
        return None
    if isinstance(handle, cst.Name):
        for ancestor in model.ancestors(at):  # ``with open(p, "w") as f:`` around it
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                break
            if isinstance(ancestor, cst.With):
                for item in ancestor.items:
                    if item.asname is not None and dotted(item.asname.name) == name:
                        return item.item
        scope = model.scope_of(at)
        values = [
            value for node, value in model.index.values_bound_to(name)
            if model.scope_of(node) is scope
        ]  # fmt: skip
    elif name.startswith("self.") and name.count(".") == 1:
        values = [assign.value for assign in model.index.assignments_in_class(name, at)]
    else:
        return None
    return values[0] if len(values) == 1 else None


def once_per_run(model: ScriptModel, call: cst.Call) -> bool:
    """A call that must run on one rank: it writes, deletes or uploads files, or reads the
    terminal (``input()``: only the launcher's first process has one)."""
    qualified = model.call_names(call)
    return (
        bool(qualified & (names.FILE_WRITERS | names.TORCH_SAVE | {"builtins.input"}))
        or writes_by_method(model, call)
        or uploads(model, call)
    )


def uploads(model: ScriptModel, call: cst.Call) -> bool:
    """An upload to the Hub: ``api.upload_folder(...)``, ``model.push_to_hub(...)``,
    ``create_repo(...)`` from ``huggingface_hub``. Not ``create_repo(..., exist_ok=True)`` (every
    rank may run it) nor a Trainer's ``push_to_hub`` (it uploads from the main process itself),
    nor ``self.push_to_hub(...)`` of a class that defines it in the file."""
    func = call.func
    if isinstance(func, cst.Attribute):
        method = func.attr.value
        receiver = (dotted(func.value) or "").rsplit(".", 1)[-1].lower()
        if method not in names.HUB_UPLOAD_METHODS or "trainer" in receiver:
            return False
        if dotted(func.value) == "self" and _own_method(model, call, method):
            return False  # the class's own push_to_hub: its uploads are judged where they are
    else:
        qualified = {q for q in model.call_names(call) if q.startswith("huggingface_hub.")}
        method = next(iter(qualified), "").rsplit(".", 1)[-1]
        if method not in names.HUB_UPLOAD_METHODS:
            return False
    return not any(
        a.keyword is not None and a.keyword.value == "exist_ok" and dotted(a.value) == "True"
        for a in call.args
    )


def _own_method(model: ScriptModel, call: cst.Call, method: str) -> bool:
    owner = model.index.enclosing_class(call)
    return owner is not None and any(
        isinstance(statement, cst.FunctionDef) and statement.name.value == method
        for statement in owner.body.body
    )


#: Files the kernel keeps per process, and devices no write of one rank reaches another's
#: through; not ``/dev/shm``, a folder every process of the machine shares.
_PROCESS_OWN_FOLDERS = ("/proc/self/", "/proc/thread-self/", "/dev/fd/")
_DEVICES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"})


def _names_a_process_own_file(path: cst.BaseExpression) -> bool:
    value = path.evaluated_value if isinstance(path, cst.SimpleString) else None
    return isinstance(value, str) and (value.startswith(_PROCESS_OWN_FOLDERS) or value in _DEVICES)


def per_rank_path(model: ScriptModel, call: cst.Call) -> bool:
    """``np.save(f"preds_{rank}.npy", ...)``: one file per rank, meant to be written by each.
    Also through a local name (``process_idx = accelerator.process_index`` then
    ``plt.savefig(f"image_{process_idx}.png")``): named from the rank, each rank's file is its
    own. So is a file the kernel keeps per process (``open("/proc/self/clear_refs", "w")``) or a
    device (``/dev/null``): no rank's write reaches another's (``/dev/shm`` is shared)."""
    if call.args and _names_a_process_own_file(call.args[0].value):
        return True
    for argument in call.args:
        for node in walk(argument.value):
            if _reads_the_launchers_rank(model, node):
                return True
            name = dotted(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
            if name is None:
                continue
            if _names_the_rank(name) or (
                isinstance(node, cst.Name)
                and any(
                    _is_the_rank(bound)
                    for _, value in model.index.values_bound_to(name)
                    for inner in walk(value)
                    if isinstance(inner, (cst.Name, cst.Attribute))
                    and (bound := dotted(inner)) is not None
                )
            ):
                return True
    return False


def _reads_the_launchers_rank(model: ScriptModel, node: cst.CSTNode) -> bool:
    """``os.environ["RANK"]``, ``os.environ.get("LOCAL_RANK")``, ``os.getenv("RANK", "0")``:
    the launcher's variable for this process's rank, another value on every rank
    (``f"rng_{os.environ['RANK']}.pt"`` is one file per rank, as ``f"rng_{rank}.pt"`` is)."""
    if not isinstance(node, cst.SimpleString):
        return False
    text = node.evaluated_value
    if not (isinstance(text, str) and text in names.LAUNCHER_VARIABLES and "RANK" in text):
        return False
    holder = model.parent(node)
    if isinstance(holder, cst.Index):
        subscript = model.parent(model.parent(holder))
        return isinstance(subscript, cst.Subscript) and (dotted(subscript.value) or "").endswith(
            "environ"
        )
    if isinstance(holder, cst.Arg):
        read = model.parent(holder)
        return isinstance(read, cst.Call) and (dotted(read.func) or "").endswith(
            ("getenv", "environ.get")
        )
    return False


def _names_the_rank(name: str) -> bool:
    return "rank" in name.rsplit(".", 1)[-1] or name.endswith("process_index")


def _is_the_rank(name: str) -> bool:
    """What a local copies the rank from: stricter than a name that mentions it."""
    last = name.rsplit(".", 1)[-1]
    return last in ("rank", "get_rank", "local_rank", "global_rank") or last.endswith(
        "process_index"
    )


def deletes(model: ScriptModel, call: cst.Call) -> bool:
    return bool(model.call_names(call) & names.FILE_DELETERS) or (
        isinstance(call.func, cst.Attribute) and call.func.attr.value in names.FILE_DELETING_METHODS
    )


#: Exceptions whose handler swallows a path another rank deleted first.
_MISSING_PATH_ERRORS = {"FileNotFoundError", "OSError", "IOError", "EnvironmentError", "Exception"}


def tolerates_missing(model: ScriptModel, call: cst.Call) -> bool:
    """A delete that does not fail when another rank removed the path first:
    ``shutil.rmtree(d, ignore_errors=True)``, ``path.unlink(missing_ok=True)``, or a delete in
    the body of a ``try:`` whose handler catches ``FileNotFoundError`` (``OSError``,
    ``Exception``, a bare ``except:``) or under ``with contextlib.suppress(FileNotFoundError):``.
    Every rank running it ends with the path gone, which is what the author asked for."""
    for keyword in ("ignore_errors", "missing_ok"):
        given = argument_value(call, keyword, None)
        if given is not None and not (isinstance(given, cst.Name) and given.value == "False"):
            return True
    child: cst.CSTNode = call
    for ancestor in model.ancestors(call):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return False
        if (
            isinstance(ancestor, cst.Try)
            and child is ancestor.body
            and any(_catches_missing(handler) for handler in ancestor.handlers)
        ):
            return True
        if isinstance(ancestor, cst.With) and child is ancestor.body:
            for item in ancestor.items:
                suppressed = item.item
                if (
                    isinstance(suppressed, cst.Call)
                    and (dotted(suppressed.func) or "").rsplit(".", 1)[-1] == "suppress"
                    and any(_names_missing(a.value) for a in suppressed.args)
                ):
                    return True
        child = ancestor
    return False


def _catches_missing(handler: cst.ExceptHandler) -> bool:
    return handler.type is None or _names_missing(handler.type)


def _names_missing(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Tuple):
        return any(_names_missing(element.value) for element in node.elements)
    name = dotted(node) or ""
    return name.rsplit(".", 1)[-1] in _MISSING_PATH_ERRORS


def main_process_only(call: cst.Call) -> bool:
    """``save_pretrained(d, is_main_process=accelerator.is_main_process, save_function=...)``:
    the callee writes on the main process only."""
    return any(
        a.keyword is not None and a.keyword.value in ("is_main_process", "save_function")
        for a in call.args
    )


def makedirs_races(model: ScriptModel, placement: Placement) -> list[MakedirsRace]:
    found = []
    for line, call in placement.expression_statements():
        if not model.call_names(call) & names.MAKEDIRS:
            continue
        if any(a.keyword is not None and a.keyword.value == "exist_ok" for a in call.args):
            continue
        guard = model.parent(model.parent(line))
        if (
            isinstance(guard, cst.If)
            and guard.orelse is None
            and len(guard.body.body) == 1  # type: ignore[union-attr]
            and _tests_missing(model, guard.test, call)
        ):
            found.append(MakedirsRace(guard, call))
        else:
            found.append(MakedirsRace(line, call))
    return found


def folders_named_by_the_clock(model: ScriptModel, facts: Facts) -> list[tuple[cst.Call, cst.Call]]:
    """Each ``os.makedirs(d)``/``os.mkdir(d)`` whose folder's name comes from the clock
    (``d = os.path.join(root, time.strftime(...))``, also through what a function of the file
    returns: `SharedFiles.per_process`), with the call that reads the clock. Every rank reads
    its own clock, so ranks a second apart make two folders."""
    found = []
    for call in model.calls:
        if not model.call_names(call) & names.MAKEDIRS or not call.args:
            continue
        made = facts.shared_files.per_process(call.args[0].value)
        if made is not None and made.clock:
            found.append((call, made.source))
    return found


def _tests_missing(model: ScriptModel, test: cst.BaseExpression, call: cst.Call) -> bool:
    """``not os.path.exists(d)`` for the ``d`` that ``call`` creates."""
    if not (isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)):
        return False
    check = test.expression
    return (
        isinstance(check, cst.Call)
        and bool(model.call_names(check) & names.PATH_EXISTS)
        and bool(check.args)
        and bool(call.args)
        and model.module.code_for_node(check.args[0].value)
        == model.module.code_for_node(call.args[0].value)
    )


def summary_writers(model: ScriptModel, placement: Placement) -> list[SummaryWriterUse]:
    found = []
    for node in placement.all_nodes():
        if not (
            isinstance(node, cst.SimpleStatementLine)
            and len(node.body) == 1
            and isinstance(node.body[0], cst.Assign)
            and isinstance(node.body[0].value, cst.Call)
            and model.call_names(node.body[0].value) & names.SUMMARY_WRITERS
            and len(node.body[0].targets) == 1
        ):
            continue
        name = dotted(node.body[0].targets[0].target)
        if name is None:
            continue
        found.append(_writer_uses(model, node, name))
    return found


def _writer_uses(
    model: ScriptModel, created: cst.SimpleStatementLine, name: str
) -> SummaryWriterUse:
    scope = model.scope_of(created)
    use = SummaryWriterUse(name, created, [], None)
    for node in walk(model.module):
        if not isinstance(node, (cst.Name, cst.Attribute)) or dotted(node) != name:
            continue
        if any(a is created for a in model.ancestors(node)):
            continue
        parent = model.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            call = model.parent(parent)
            statement = model.parent(model.parent(call)) if isinstance(call, cst.Call) else None
            if (
                isinstance(statement, cst.SimpleStatementLine)
                and len(statement.body) == 1
                and isinstance(statement.body[0], cst.Expr)
                and statement.body[0].value is call
                and (model.scope_of(node) is scope or name.startswith("self."))
            ):
                use.uses.append(statement)
                continue
        if isinstance(parent, cst.Attribute) and parent.value is not node:
            continue  # ``self.writer`` seen as the attribute chain itself
        use.escapes = model.line(node)
        break
    return use


def opens_for_writing(node: cst.BaseExpression) -> bool:
    """``open(path, "w")`` (or ``"a"``, ``"x"``, ``mode="wb"``...). ``open(os.devnull, "w")``
    (a sink that silences a progress bar) writes no file."""
    return any(c in open_mode(node) for c in "wax")


def opens_truncating(node: cst.BaseExpression) -> bool:
    """``open(path, "w")``: the open itself empties the file, whoever writes to it after."""
    return "w" in open_mode(node)


def opens_exclusively(node: cst.BaseExpression) -> bool:
    """``open(path, "x")``: the open fails where the file exists (a second rank's does)."""
    return "x" in open_mode(node)


def open_mode(node: cst.BaseExpression) -> str:
    """The literal mode of a builtin ``open`` of a file (empty when not one, or not literal).
    ``open(path if accelerator.is_main_process else os.devnull, "w")`` writes the file on the
    ranks its test picks only: the script chose which, as under an ``if``."""
    if not isinstance(node, cst.Call) or dotted(node.func) != "open":
        return ""
    path = node.args[0].value if node.args else None
    if isinstance(path, cst.IfExp) and any(
        isinstance(n, (cst.Name, cst.Attribute)) and names.is_process_rank_name(dotted(n) or "")
        for n in walk(path.test)
    ):
        path = path.orelse
    if path is not None and (dotted(path) or "").rsplit(".", 1)[-1] == "devnull":
        return ""
    mode = argument_value(node, "mode", 1)
    if isinstance(mode, cst.IfExp):  # ``"a" if resuming else "w"``: either may run
        branches = (mode.body, mode.orelse)
        return "".join(str(b.evaluated_value) for b in branches if isinstance(b, cst.SimpleString))
    return str(mode.evaluated_value) if isinstance(mode, cst.SimpleString) else ""


#: Objects whose files are small and the same on every rank: settings, tokenizers, processors,
#: scheduler configs (``tokenizer.save_pretrained(d)``, ``json.dump(vars(args), f)``).
_SAME_EVERYWHERE = ("tokenizer", "processor", "config", "feature_extractor", "scheduler", "args")
_DUMPERS = {"json.dump", "yaml.dump", "yaml.safe_dump"}
#: Copies whose bytes are the source file's (or folder's): the same on every rank when the
#: source is.
_COPIES = {"shutil.copy", "shutil.copy2", "shutil.copyfile", "shutil.copytree"}
#: A table's writers (``frame.to_csv(path)``): same bytes on every rank when its rows are.
_TABLE_WRITERS = {"to_csv", "to_excel", "to_json", "to_parquet"}


def same_on_every_rank(model: ScriptModel, call: cst.Call) -> bool:
    """A small file every rank writes with the same bytes: a tokenizer's, a processor's or a
    config's ``save_pretrained``, the run's settings dumped to JSON or YAML or the config file
    copied (``shutil.copy(config_path, log_dir)``) into the run's folder, a fixed source folder
    snapshotted there (``shutil.copytree("./models", run_dir / "models", dirs_exist_ok=True)``),
    or an HF Trainer's log
    history (``pd.DataFrame(trainer.state.log_history).to_csv(...)``: every rank logs the same
    values, the losses gathered across ranks first). Written by every rank before a barrier,
    the file is whole when anyone reads it (unlike a checkpoint, whose ranks may hold different
    state and whose size makes a torn read likely)."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in ("save_pretrained", "to_json_file"):
        return _names_settings(func.value)
    if isinstance(func, cst.Attribute) and func.attr.value in _TABLE_WRITERS:
        frame = func.value  # pd.DataFrame(rows).to_csv(path)
        return (
            isinstance(frame, cst.Call)
            and bool(frame.args)
            and (dotted(frame.func) or "").rsplit(".", 1)[-1] == "DataFrame"
            and _trainer_log_history(frame.args[0].value)
        )
    if model.call_names(call) & _COPIES and call.args:
        source = call.args[0].value  # a settings name, or a fixed path (``"./models"``)
        return _names_settings(source) or repository_path(model, source)
    if model.call_names(call) & _DUMPERS and call.args:
        value = call.args[0].value
        if isinstance(value, cst.Call) and dotted(value.func) == "vars" and value.args:
            value = value.args[0].value
        return _names_settings(value) or _trainer_log_history(value)
    return False


def repository_path(model: ScriptModel, node: cst.BaseExpression) -> bool:
    """``node`` is a fixed path (``"./models"``) that no other string of the file names: the
    repository's own file, never one the run wrote (``torch.save(state, "last.pt")`` on main
    then ``shutil.copy("last.pt", "best.pt")`` copies what this run saved: not the same bytes
    on every rank while main writes it). Compared by value: ``'last.pt'`` is ``"last.pt"``."""
    if not isinstance(node, cst.SimpleString):
        return False
    path = node.evaluated_value
    if not isinstance(path, str):
        return False
    if model.source.count(path) == 1:
        return True  # the text holds it once, unescaped: no other string can name it
    return not any(
        other is not node and other.evaluated_value == path  # type: ignore[attr-defined]
        for other in model.index.of_type(cst.SimpleString)
    )


def _trainer_log_history(node: cst.BaseExpression) -> bool:
    """``trainer.state.log_history``: the same list on every rank of an HF Trainer run."""
    name = dotted(node) if isinstance(node, cst.Attribute) else None
    return name is not None and name.endswith(".state.log_history")


def _names_settings(node: cst.BaseExpression) -> bool:
    name = dotted(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
    if name is None:
        return False
    name = name.removesuffix(".__dict__")
    last = name.rsplit(".", 1)[-1].lower()
    return any(word in last for word in _SAME_EVERYWHERE) or last in ("cfg", "opt", "hparams")


def per_batch_files(model: ScriptModel, write: cst.Call) -> tuple[cst.For, bool] | None:
    """A write inside a loop over a prepared DataLoader whose path is made from the loop's own
    names: one file per batch. Named by the loop's counter (``f"{data_id}.pth"``), the files
    collide: each rank reads its own shard but counts from 0, so the ranks write different data
    under the same names, and a guard would keep the main process's shard only (``True``).
    Named by the batch itself (its file names, ids), each rank writes files of its own
    (``False``): nothing races. A write through a handle (``f.write(pred)``) is judged by the
    ``open`` that names its file."""
    write = opened_for_writing(model, write) or write
    loaded = model.prepared_before(write)
    for loop in model.loops:
        if loop.iterable not in loaded or not any(a is loop.node for a in model.ancestors(write)):
            continue
        counter = first_enumerate_name(loop.node.target)
        batch = target_names(loop.node.target) - counter
        for argument in write.args:
            value = argument.value
            if isinstance(value, (cst.Name, cst.Attribute, cst.SimpleString)):
                continue  # the object written, or a fixed path
            used = {n.value for n in walk(value) if isinstance(n, cst.Name)}
            if used & counter:
                return loop.node, True
            if used & batch:
                return loop.node, False
    return None


def calls_for_effect(function: cst.FunctionDef) -> bool:
    """``function`` makes a call whose value it drops (``logger.info("Using device: CPU.")``,
    ``print(...)``): calling it does more than compute what it returns, so a conversion that
    replaces what it returns still calls it."""
    return any(
        isinstance(node, cst.Expr) and isinstance(node.value, cst.Call)
        for node in walk(function.body)
    )


def writes_into(node: cst.CSTNode, block: cst.With) -> bool:
    """``node`` is one of ``block``'s own items (``open(p, "w")``) or reads a name it binds
    (``json.dump(rows, f)`` in ``with open(p, "w") as f:``): it writes into the block's file."""
    if any(node is item.item for item in block.items):
        return True
    handles = {
        item.asname.name.value
        for item in block.items
        if item.asname is not None and isinstance(item.asname.name, cst.Name)
    }
    return any(isinstance(n, cst.Name) and n.value in handles for n in walk(node))
