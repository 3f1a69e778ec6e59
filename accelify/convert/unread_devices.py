"""``device = accelerator.device`` that nothing reads once the conversion is applied: the
device step rewrites ``device = torch.device("cuda" if ...)`` to the rank's device, and other
steps then remove every use of it (``model.to(device)``: prepare places the model; ``x.to(device)``
of batches a prepared loader already places). Left in, the line is dead code that a linter flags
(ruff F841) in the converted file. Removed here, on the applied module, where every other edit is
known: only in a function (a module's global may be imported by another file), only a binding
the conversion wrote, and only when that function reads the name nowhere, nested functions
included."""

from __future__ import annotations

import typing

import libcst as cst
from libcst.metadata import FunctionScope, MetadataWrapper, ScopeProvider

from accelify.analysis.syntax import dotted, walk
from accelify.edits.plan import Note

#: calls that read a function's locals by name: the binding may be read though no name is
_LOCALS_READERS = frozenset({"locals", "vars", "eval", "exec"})


def drop_unread_devices(
    module: cst.Module, original: bytes, changes: list[Note]
) -> tuple[cst.Module, list[Note]]:
    """``module`` without the unread ``name = <accelerator>.device`` lines the conversion
    wrote, and ``changes`` with the note of each such rewrite turned into one of its removal."""
    texts = [note.text for note in changes]
    if not any(text.endswith(".device") for text in texts):
        return module, changes  # no device binding written: no line of the module to look at
    # a text noted once: its note is this binding's (two functions' alike are left as they are)
    written = {note.text: note for note in changes if texts.count(note.text) == 1}
    kept = set(original.decode("utf-8", errors="replace").splitlines())
    candidates = [
        line
        for line in module.code.splitlines()
        if line.strip() in written and line.endswith(".device") and line not in kept
    ]
    if not candidates:
        return module, changes  # no rewritten device binding: no scopes to compute
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    scopes = wrapper.resolve(ScopeProvider)
    unread: dict[cst.SimpleStatementLine, Note] = {}
    bindings = _device_bindings(module)
    codes = [module.code_for_node(statement.body[0]) for statement in bindings]
    for statement, code in zip(bindings, codes, strict=True):
        if codes.count(code) != 1:
            continue  # which of them the note is about is not known: each stays
        assign = statement.body[0]
        assert isinstance(assign, cst.Assign)
        name = assign.targets[0].target
        assert isinstance(name, cst.Name)
        note = written.get(code)
        scope = scopes.get(assign)
        if note is None or not isinstance(scope, FunctionScope):
            continue
        assignments = scope.assignments[name.value]
        if len(assignments) != 1 or any(a.references for a in assignments):
            continue
        if _reads_locals_by_name(scope.node):
            continue
        unread[statement] = note
    if not unread:
        return module, changes
    notes = {id(note): note for note in unread.values()}
    updated = [
        Note(
            note.line,
            f"removed {note.text}: nothing reads it once the device moves are gone",
        )
        if id(note) in notes
        else note
        for note in changes
    ]
    return module.visit(_Remove(set(map(id, unread)))), updated


def _device_bindings(module: cst.Module) -> list[cst.SimpleStatementLine]:
    """Statements ``name = <something>.accelerator.device`` (or ``accelerator.device``)."""
    return [node for node in walk(module) if _binds_a_device(node)]


def _binds_a_device(node: cst.CSTNode) -> typing.TypeGuard[cst.SimpleStatementLine]:
    if not isinstance(node, cst.SimpleStatementLine) or len(node.body) != 1:
        return False
    assign = node.body[0]
    if not isinstance(assign, cst.Assign):
        return False
    value = dotted(assign.value) or ""
    return (
        len(assign.targets) == 1
        and isinstance(assign.targets[0].target, cst.Name)
        and value.split(".")[-2:-1] == ["accelerator"]
        and value.endswith(".device")
    )


def _reads_locals_by_name(function: cst.CSTNode | None) -> bool:
    return function is None or any(
        isinstance(node, cst.Call) and dotted(node.func) in _LOCALS_READERS
        for node in walk(function)
    )


class _Remove(cst.CSTTransformer):
    """Drops the statements, but never a block's last one (``if cuda: device = ...``)."""

    def __init__(self, statements: set[int]) -> None:
        super().__init__()
        self.statements = statements

    def leave_IndentedBlock(
        self, original: cst.IndentedBlock, updated: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        kept: list[cst.BaseStatement] = []
        blank: list[
            cst.EmptyLine
        ] = []  # a removed line's blank lines (not its comments) go to the next
        for statement, was in zip(updated.body, original.body, strict=True):
            if id(was) in self.statements:
                blank += [line for line in statement.leading_lines if line.comment is None]
                continue
            if blank:
                statement = statement.with_changes(leading_lines=[*blank, *statement.leading_lines])
                blank = []
            kept.append(statement)
        if not kept or len(kept) == len(updated.body):
            return updated
        return updated.with_changes(body=kept)
