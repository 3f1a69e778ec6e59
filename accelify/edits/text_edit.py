"""A plan as plain data: the text it changes, as ``(start, end, replacement)`` on the file's
characters (ruff's edit shape). Plans hold functions of libcst nodes and live only in the
process that parsed the file; text edits cross processes (``--jobs``) and go into JSON output.
Fixes are applied from plans, where the tree is (``lint --fix`` applies them in the worker).

A lint with a cache computes the edit of every fixable finding. Applying each plan to the whole
module and generating the whole file's code again cost more than parsing the file, once per
finding. `text_edits` generates the file's code once; each plan is then applied to the part of
the file it rewrites alone (the statement holding its nodes, the statement whose block it
inserts in, removes from or guards, or the run of top-level statements it touches), whose code
is generated with the indentation it has in the file and found there, at the line the part's
position gives. The edit is the same: applying a plan changes nothing outside that part. Only
libcst's public API is used (`Module.code_for_node`, nodes built and generated as any code
generation builds them), so a libcst release that reorganises its internals changes nothing."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a TextEdit read back from the lint cache needs no parser
    import libcst as cst
    from libcst.metadata import CodeRange

    from accelify.edits.plan import Plan


#: libcst's own (position_provider.NEWLINE_RE): what ends a line, for positions' line numbers
_NEWLINE = re.compile(r"\r\n?|\n")


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
    position: Callable[[cst.CSTNode], CodeRange],
) -> list[TextEdit | None]:
    """`text_edit` of each plan over ``module``, whose code is generated once (``parent``: a
    node's parent in ``module``; ``position``: its range, as libcst's `PositionProvider` gives
    it). A plan whose part of the file cannot be told (a top-level insert of an import, a plan
    that spans the whole module) is applied to the whole module."""
    before = module.code
    lines = _line_starts(before)
    edits = []
    for plan in plans:
        part = _part(plan, parent)
        edit = False if part is None else _edit_of_part(module, plan, part, before, lines, position)
        edits.append(text_edit(module, plan, before) if edit is False else edit)
    return edits


@dataclass(frozen=True)
class _Part:
    """The part of the file a plan rewrites: one statement of a block or of the module, or
    (``top_level``) a run of top-level statements, applied as a module of them (the module
    rebuilds its body)."""

    nodes: tuple[cst.BaseStatement, ...]
    top_level: bool = False


def _part(plan: Plan, parent: Callable[[cst.CSTNode], cst.CSTNode | None]) -> _Part | None:
    """The smallest part of the file that holds every edit of ``plan`` with what applying it
    reads: a node's replacement is made where the statement holding it is generated; an insert,
    a removal or a guard is made by the block around the statement (`ApplyPlan._rebuild_body`,
    which carries a removed statement's comment lines onto the next one), so by the statement
    that holds that block. None: the whole module."""
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
    if common is not None and not isinstance(common, cst.Module):
        # the statement of a block (or of the module) that holds it: an ``elif`` or a block
        # generates its code only inside the statement that holds it
        while common is not None and not (
            isinstance(common, cst.BaseStatement)
            and isinstance(parent(common), (cst.IndentedBlock, cst.Module))
        ):
            common = parent(common)
        return None if common is None else _Part((common,))  # type: ignore[arg-type]
    if common is None:
        return None
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
    part: _Part,
    before: str,
    lines: list[int],
    position: Callable[[cst.CSTNode], CodeRange],
) -> TextEdit | bool | None:
    """The edit of ``plan`` applied to ``part`` alone; False when it must be applied to the
    whole module (the part's code, generated alone, is not found in the file where it is)."""
    import libcst as cst

    from accelify.edits.apply import ApplyPlan
    from accelify.edits.fstring_quotes import requote

    statement = position(part.nodes[0]).start  # where its first statement's syntax starts
    if not 1 <= statement.line <= len(lines):
        return False
    line_start = lines[statement.line - 1]
    indent = before[line_start : line_start + statement.column] if not part.top_level else ""
    if indent.strip():
        return False  # not a statement's indentation
    original = _generated(part.nodes, module, indent)
    # its code ends past the line its syntax starts on and starts at or before that line (its
    # comment lines and decorators come first): the last place it is found that far
    start = before.rfind(original, 0, line_start + len(original))
    at_line_start = start >= 0 and lines[bisect_right(lines, start) - 1] == start
    if not at_line_start or start + len(original) <= line_start:
        return False  # its code depends on more than its indentation: the whole module
    if part.top_level:  # a module of them rebuilds its body as the file's does
        statements = cst.Module(
            body=part.nodes,
            default_indent=module.default_indent,
            default_newline=module.default_newline,
        )
        edited: Sequence[cst.CSTNode] = statements.visit(ApplyPlan(plan)).body
    else:
        edited = [requote(part.nodes[0].visit(ApplyPlan(plan)))]
    after = _generated(edited, module, indent)
    end = start + len(original)
    return _difference(before, before[:start] + after + before[end:], start, len(before) - end)


def _generated(nodes: Sequence[cst.CSTNode], module: cst.Module, indent: str) -> str:
    """The code of the statements ``nodes`` as the file generates them where the indentation
    is ``indent``: as the body of a block indented by it (whose header, a newline, is cut)."""
    import libcst as cst

    if not indent:
        return "".join(module.code_for_node(node) for node in nodes)
    block = cst.IndentedBlock(body=nodes, indent=indent)  # type: ignore[arg-type]
    code = module.code_for_node(block)
    newline = module.default_newline
    return code[len(newline) :] if code.startswith(newline) else code


def _line_starts(code: str) -> list[int]:
    """The offset of each line's first character, lines ended as libcst ends them."""
    return [0, *(match.end() for match in _NEWLINE.finditer(code))]


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
