"""A plan as plain data: the text it changes, as ``(start, end, replacement)`` on the file's
characters (ruff's edit shape). Plans hold functions of libcst nodes and live only in the
process that parsed the file; text edits cross processes (``--jobs``) and go into JSON output.
Fixes are applied from plans, where the tree is (``lint --fix`` applies them in the worker).

A lint with a cache computes the edit of every fixable finding. Applying each plan to the whole
module and generating the whole file's code again cost more than parsing the file, once per
finding. `text_edits` generates the file's code once and records where the statements that
the plans rewrite start and end in it; each plan is then applied to that part alone (the
statement holding its nodes, the block whose statements it inserts, removes or guards, or the
run of top-level statements it touches), whose code is generated with the indentation it has in
the file. The edit is the same: applying a plan changes nothing outside that part."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a TextEdit read back from the lint cache needs no parser
    import libcst as cst

    from accelify.edits.plan import Plan


@dataclass(frozen=True)
class TextEdit:
    start: int  # offset of the first replaced character
    end: int  # offset after the last replaced character
    content: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def text_edit(module: cst.Module, plan: Plan, before: str) -> TextEdit | None:
    """The one span of ``module`` (whose code is ``before``) that ``plan`` rewrites (None when
    it changes nothing): the plan applied to the whole module."""
    from accelify.edits.apply import ApplyPlan

    return _difference(before, module.visit(ApplyPlan(plan)).code, 0, 0)


def text_edits(
    module: cst.Module,
    plans: Sequence[Plan],
    parent: Callable[[cst.CSTNode], cst.CSTNode | None],
) -> list[TextEdit | None]:
    """`text_edit` of each plan over ``module``, whose code is generated once (``parent``: a
    node's parent in ``module``). A plan whose part of the file cannot be told (a top-level
    insert of an import, a plan that spans the whole module) is applied to the whole module."""
    recording = _recording_state()
    if recording is None:  # a libcst release that moved its state: the whole module each
        before = module.code
        return [text_edit(module, plan, before) for plan in plans]
    parts = [_part(plan, parent) for plan in plans]
    wanted = {id(node) for part in parts if part is not None for node in part.ends}
    state = recording(module, wanted)
    module._codegen(state)
    before = "".join(state.tokens)
    edits = []
    for plan, part in zip(plans, parts, strict=True):
        edit = _edit_of_part(module, plan, part, before, state.spans, recording)
        edits.append(text_edit(module, plan, before) if edit is False else edit)
    return edits


@dataclass(frozen=True)
class _Part:
    """The part of the file a plan rewrites: one statement or block, or (``top_level``) a run
    of top-level statements, applied as a module of them (the module rebuilds its body)."""

    nodes: tuple[cst.CSTNode, ...]
    top_level: bool = False

    @property
    def ends(self) -> tuple[cst.CSTNode, cst.CSTNode]:
        return self.nodes[0], self.nodes[-1]


def _part(plan: Plan, parent: Callable[[cst.CSTNode], cst.CSTNode | None]) -> _Part | None:
    """The smallest part of the file that holds every edit of ``plan`` with what applying it
    reads: a node's replacement is made where the statement holding it is generated; an insert,
    a removal or a guard is made by the block around the statement (`ApplyPlan._rebuild_body`,
    which carries a removed statement's comment lines onto the next one). None: the whole
    module."""
    import libcst as cst

    if plan.imports:
        return None
    rewritten, rebuilt = plan.edited_nodes()
    # for each edit: the statement it is made in (a rewrite) or at (an insert, a removal), then
    # what holds it, up to the module; and how much of that chain applying it needs
    chains: list[tuple[list[cst.CSTNode] | None, int]] = []
    for node in rewritten:
        while node is not None and not isinstance(node, cst.BaseStatement):
            node = parent(node)
        chains.append((_chain(node, parent), 0))  # the statement holding it
    chains += [(_chain(statement, parent), 1) for statement in rebuilt]  # the block around
    if not chains or any(chain is None or len(chain) <= skip for chain, skip in chains):
        return None
    common = _common_ancestor([chain[skip:] for chain, skip in chains])  # type: ignore[index]
    while common is not None and not isinstance(
        common, (cst.BaseStatement, cst.IndentedBlock, cst.Module)
    ):
        common = parent(common)
    if common is None or not isinstance(common, cst.Module):
        return None if common is None else _Part((common,))
    # at top level: the run of statements from the first the plan touches to the last
    body = list(common.body)
    indices = {id(statement): index for index, statement in enumerate(body)}
    touched = [indices.get(id(chain[-2])) for chain, _ in chains]  # type: ignore[index]
    if None in touched:
        return None
    first, last = min(touched), max(touched)  # type: ignore[type-var]
    while last + 1 < len(body) and plan.removes(body[last]):
        last += 1  # a removed statement's comment lines move onto the next one
    if first == 0 and last == len(body) - 1:
        return None
    return _Part(tuple(body[first : last + 1]), top_level=True)


def _chain(
    node: cst.CSTNode | None, parent: Callable[[cst.CSTNode], cst.CSTNode | None]
) -> list[cst.CSTNode] | None:
    """``node`` and its ancestors, the module last; None when ``node`` is not in the tree."""
    import libcst as cst

    found = []
    while node is not None:
        found.append(node)
        if isinstance(node, cst.Module):
            return found
        node = parent(node)
    return None


def _common_ancestor(chains: list[list[cst.CSTNode]]) -> cst.CSTNode | None:
    shared = {id(node) for node in chains[0]}
    for chain in chains[1:]:
        shared &= {id(node) for node in chain}
    return next((node for node in chains[0] if id(node) in shared), None)


def _edit_of_part(
    module: cst.Module,
    plan: Plan,
    part: _Part | None,
    before: str,
    spans: dict[int, tuple[int, int, tuple[str, ...]]],
    recording: type,
) -> TextEdit | bool | None:
    """The edit of ``plan`` applied to ``part`` alone; False when it must be applied to the
    whole module (no part, or the part's code generated alone is not its text in the file)."""
    import libcst as cst

    from accelify.edits.apply import ApplyPlan
    from accelify.edits.fstring_quotes import requote

    first, last = (spans.get(id(node)) for node in part.ends) if part is not None else (None, None)
    if first is None or last is None:
        return False  # no part, or one the file's code generation did not reach
    start, _, indents = first
    end = last[1]
    original: Sequence[cst.CSTNode] = part.nodes
    if part.top_level:  # a module of them rebuilds its body as the file's does
        statements = cst.Module(
            body=part.nodes,  # type: ignore[arg-type]
            default_indent=module.default_indent,
            default_newline=module.default_newline,
        )
        edited: Sequence[cst.CSTNode] = statements.visit(ApplyPlan(plan)).body
    else:
        edited = [requote(part.nodes[0].visit(ApplyPlan(plan)))]
    if _generated(original, module, indents, recording) != before[start:end]:
        return False  # its code depends on more than its indentation: the whole module
    after = _generated(edited, module, indents, recording)
    return _difference(before, before[:start] + after + before[end:], start, len(before) - end)


def _generated(
    nodes: Sequence[cst.CSTNode], module: cst.Module, indents: tuple[str, ...], recording: type
) -> str:
    """The code of ``nodes`` as the file generates it where the indentation is ``indents``."""
    state = recording(module, set())
    state.indent_tokens = list(indents)
    for node in nodes:
        node._codegen(state)
    return "".join(state.tokens)


def _difference(before: str, after: str, same_start: int, same_end: int) -> TextEdit | None:
    """The span of ``before`` that ``after`` replaces: their common prefix and suffix cut off.
    ``same_start`` and ``same_end``: lengths of a prefix and a suffix known to be equal (the
    search starts there, the answer is that of a search from the ends)."""
    if after == before:
        return None
    limit = min(len(before), len(after))
    start = min(same_start, limit)
    while start < limit and before[start] == after[start]:
        start += 1
    common_suffix = min(same_end, limit - start)
    while (
        common_suffix < limit - start
        and before[len(before) - 1 - common_suffix] == after[len(after) - 1 - common_suffix]
    ):
        common_suffix += 1
    return TextEdit(start, len(before) - common_suffix, after[start : len(after) - common_suffix])


@functools.cache
def _recording_state() -> type | None:
    """libcst's code-generation state (a private class: None where a release moved it) made to
    record, for the nodes asked, where their code starts and ends in the file and the
    indentation in force there."""
    try:
        from libcst._nodes.internal import CodegenState
    except ImportError:
        return None

    class RecordingState(CodegenState):
        def __init__(self, module: cst.Module, wanted: set[int]) -> None:
            super().__init__(
                default_indent=module.default_indent, default_newline=module.default_newline
            )
            self.wanted = wanted
            self.length = 0
            self.spans: dict[int, tuple[int, int, tuple[str, ...]]] = {}
            self._starts: dict[int, tuple[int, tuple[str, ...]]] = {}

        def add_indent_tokens(self) -> None:
            for token in self.indent_tokens:
                self.add_token(token)

        def add_token(self, value: str) -> None:
            self.tokens.append(value)
            self.length += len(value)

        def before_codegen(self, node: cst.CSTNode) -> None:
            if id(node) in self.wanted:
                self._starts[id(node)] = (self.length, tuple(self.indent_tokens))

        def after_codegen(self, node: cst.CSTNode) -> None:
            key = id(node)
            if key in self.wanted:
                start, indents = self._starts[key]
                self.spans[key] = (start, self.length, indents)

    return RecordingState
