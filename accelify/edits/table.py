"""The edits of a plan, by the node each is made at, and the rules by which they compose: what
is already planned, what conflicts, which default gives way, and the order of inserts. `Plan`
holds one and is the only way in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import libcst as cst

from accelify.edits.kinds import (
    Edit,
    Guard,
    Insert,
    InsertAfter,
    InsertBefore,
    Remove,
    Replace,
    Rewrite,
    Within,
    Wrap,
    target,
)
from accelify.edits.node_rewrites import TakenOut


@dataclass
class Fallback:
    """Edits made only where no other edit replaces or removes one of ``gives_way_to``."""

    edits: tuple[Edit, ...]
    gives_way_to: tuple[cst.CSTNode, ...]


@dataclass
class Emptied:
    """A statement removed when every statement of each of its blocks is removed."""

    blocks: tuple[Sequence[cst.CSTNode], ...]


@dataclass
class EditTable:
    replacements: dict[cst.CSTNode, Rewrite] = field(default_factory=dict)
    wraps: dict[cst.CSTNode, list[Rewrite]] = field(default_factory=dict)
    removals: set[cst.CSTNode] = field(default_factory=set)
    emptied: dict[cst.CSTNode, Emptied] = field(default_factory=dict)
    fallbacks: list[Fallback] = field(default_factory=list)
    #: inserts at each anchor: the early ones (set up what the others use) come first.
    before: dict[cst.CSTNode, list[tuple[bool, Insert]]] = field(default_factory=dict)
    after: dict[cst.CSTNode, list[tuple[bool, Insert]]] = field(default_factory=dict)
    guards: dict[cst.CSTNode, str] = field(default_factory=dict)
    contexts: dict[cst.CSTNode, str] = field(default_factory=dict)
    new_parameters: dict[cst.CSTNode, str] = field(default_factory=dict)

    # -- composition ------------------------------------------------------------------------

    def planned(self, edit: Edit) -> bool:
        """``edit`` is in the table already (asked for by a second site or step)."""
        if isinstance(edit, Replace):
            return self.replacements.get(edit.node) == edit.rewrite or any(
                edit == other for f in self.fallbacks for other in f.edits
            )
        if isinstance(edit, Wrap):
            return edit.wrapper in self.wraps.get(edit.node, [])
        if isinstance(edit, Remove):
            return edit.statement in self.removals
        if isinstance(edit, Guard):
            return self.guards.get(edit.statement) == edit.test
        if isinstance(edit, Within):
            return self.contexts.get(edit.statement) == edit.context
        inserts = self.before if isinstance(edit, InsertBefore) else self.after
        code = _code(edit.statement)
        return code is not None and any(
            _code(item) == code for _, item in inserts.get(edit.anchor, [])
        )

    def conflicts(self, edit: Edit) -> bool:
        """A second, different replacement of one node (or a second test around a statement)."""
        if isinstance(edit, Replace):
            return edit.node in self.replacements
        if isinstance(edit, Guard):
            return edit.statement in self.guards
        return False

    def store(self, edit: Edit, early: bool = False) -> None:
        if isinstance(edit, Replace):
            self.replacements[edit.node] = edit.rewrite
        elif isinstance(edit, Wrap):
            self.wraps.setdefault(edit.node, []).append(edit.wrapper)
        elif isinstance(edit, Remove):
            self.removals.add(edit.statement)
        elif isinstance(edit, Guard):
            self.guards[edit.statement] = edit.test
        elif isinstance(edit, Within):
            self.contexts[edit.statement] = edit.context
        elif isinstance(edit, InsertBefore):
            self.before.setdefault(edit.anchor, []).append((early, edit.statement))
        else:
            self.after.setdefault(edit.anchor, []).append((early, edit.statement))

    def in_effect(self, fallback: Fallback) -> bool:
        return not any(
            node in self.replacements or node in self.removals or self._emptied_now(node)
            for node in fallback.gives_way_to
        )

    def fallback_of(self, edit: Edit) -> Fallback | None:
        return next((f for f in self.fallbacks if edit in f.edits), None)

    def all_removed(self, emptied: Emptied) -> bool:
        return all(s in self.removals for block in emptied.blocks for s in block)

    def every_edit(self) -> list[tuple[Edit, bool]]:
        """The edits stored (not the defaults), each with whether it is an early insert."""
        found: list[tuple[Edit, bool]] = []
        found += [(Replace(n, r), False) for n, r in self.replacements.items()]
        found += [(Wrap(n, w), False) for n, ws in self.wraps.items() for w in ws]
        found += [(Remove(n), False) for n in self.removals]
        found += [(Guard(n, t), False) for n, t in self.guards.items()]
        found += [(Within(n, c), False) for n, c in self.contexts.items()]
        for inserts, kind in ((self.before, InsertBefore), (self.after, InsertAfter)):
            found += [(kind(a, i), e) for a, items in inserts.items() for e, i in items]
        return found

    def edited_nodes(self) -> tuple[list[cst.CSTNode], list[cst.CSTNode]]:
        """The nodes rewritten where they stand (replaced, wrapped, given a parameter), and the
        statements whose block is rebuilt around them (removed, inserted at, guarded, run in a
        context, removed when emptied), defaults included."""
        rewritten = [*self.replacements, *self.wraps, *self.new_parameters]
        rebuilt = [*self.removals, *self.before, *self.after, *self.guards, *self.contexts]
        rebuilt += list(self.emptied)
        for fallback in self.fallbacks:
            for edit in fallback.edits:
                into = rewritten if isinstance(edit, (Replace, Wrap)) else rebuilt
                into.append(target(edit))
        return rewritten, rebuilt

    # -- lookups, for applying -------------------------------------------------------------

    @property
    def empty(self) -> bool:
        return not (
            self.replacements
            or self.wraps
            or self.removals
            or self.before
            or self.after
            or self.guards
            or self.contexts
            or any(self.in_effect(f) for f in self.fallbacks)
        )

    def rewrite_of(self, node: cst.CSTNode) -> Rewrite | None:
        """The replacement of ``node`` (or the default that stands in for one), then its wraps."""
        replace = self.replacements.get(node) or self._fallback_rewrite(node)
        wrappers = sorted(self.wraps.get(node, []), key=lambda w: isinstance(w, TakenOut))
        if replace is None and not wrappers:
            return None

        def rewrite(updated: cst.CSTNode) -> cst.CSTNode:
            if replace is not None:
                updated = replace(updated)
            for wrapper in wrappers:
                updated = wrapper(updated)
            return updated

        return rewrite

    def removes(self, statement: cst.CSTNode) -> bool:
        if statement in self.removals or self._emptied_now(statement):
            return True
        return any(
            isinstance(e, Remove) and e.statement is statement
            for f in self.fallbacks
            if self.in_effect(f)
            for e in f.edits
        )

    def inserted(self, statement: cst.CSTNode, after: bool) -> list[Insert]:
        items = (self.after if after else self.before).get(statement, [])
        return [item for early, item in items if early] + [i for e, i in items if not e]

    def block_around(self, statement: cst.CSTNode) -> tuple[str, str] | None:
        if statement in self.guards:
            return "if", self.guards[statement]
        if statement in self.contexts:
            return "with", self.contexts[statement]
        return None

    def _emptied_now(self, node: cst.CSTNode) -> bool:
        return node in self.emptied and self.all_removed(self.emptied[node])

    def _fallback_rewrite(self, node: cst.CSTNode) -> Rewrite | None:
        for fallback in self.fallbacks:
            for edit in fallback.edits:
                if isinstance(edit, Replace) and edit.node is node and self.in_effect(fallback):
                    return edit.rewrite
        return None


def _code(item: Insert) -> str | None:
    return cst.Module([]).code_for_node(item) if isinstance(item, cst.CSTNode) else None
