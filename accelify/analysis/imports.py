"""What the names in a file refer to, read from its import statements.

``import torch.optim as optim`` makes ``optim.SGD`` mean ``torch.optim.SGD``; ``from torch import
nn`` makes ``nn.Linear`` mean ``torch.nn.Linear``. This is all the rules and the codemod ask of
name resolution, and it costs a dictionary lookup where libcst's scope analysis costs a second
and third pass over the tree. A name rebound after its import (a parameter called ``nn``) is the
one case it does not see.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst.helpers import get_full_name_for_node

#: What ``from MODULE import *`` binds, for the library modules whose names the analysis
#: recognises (their ``__all__``, as far as it asks).
STAR_EXPORTS: dict[str, tuple[str, ...]] = {
    "tqdm": ("tqdm", "trange"),
    "tqdm.auto": ("tqdm", "trange"),
    "tqdm.notebook": ("tqdm", "trange"),
    "tqdm.std": ("tqdm", "trange"),
    "torch.utils.data": (
        "DataLoader",
        "Dataset",
        "IterableDataset",
        "TensorDataset",
        "Subset",
        "random_split",
        "DistributedSampler",
    ),
}


@dataclass
class ImportTable:
    bound: dict[str, str] = field(default_factory=dict)  # local name -> what it names

    @classmethod
    def of_module(cls, module: cst.Module) -> ImportTable:
        """The imports at the top level (and in top-level ``if``/``try`` blocks), known before
        any code that uses them is read, wherever in the file they are written."""
        table = cls()
        for statement in _top_level_statements(module.body):
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if isinstance(small, (cst.Import, cst.ImportFrom)):
                        table.add(small)
        return table

    def add(self, node: cst.Import | cst.ImportFrom) -> None:
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = _name(alias.name)
                if alias.asname is not None:
                    self.bound[_name(alias.asname.name)] = full
                else:
                    root = full.split(".", 1)[0]
                    self.bound[root] = root
            return
        if isinstance(node.names, cst.ImportStar):
            # ``from tqdm import *`` (tugstugi's speech-commands trainer): the names of a library
            # module the analysis recognises, bound as an explicit import would bind them
            module = _name(node.module) if node.module and not node.relative else ""
            for exported in STAR_EXPORTS.get(module, ()):
                self.bound[exported] = f"{module}.{exported}"
            return
        module = "." * len(node.relative) + (_name(node.module) if node.module else "")
        separator = "" if module.endswith(".") else "."
        for alias in node.names:
            imported = _name(alias.name)
            local = _name(alias.asname.name) if alias.asname is not None else imported
            self.bound[local] = f"{module}{separator}{imported}"

    def resolve(self, dotted_name: str) -> str | None:
        """``nn.functional.relu`` -> ``torch.nn.functional.relu``; None for a name no import
        binds."""
        root, _, rest = dotted_name.partition(".")
        target = self.bound.get(root)
        if target is None:
            return None
        return f"{target}.{rest}" if rest else target


def _name(node: cst.BaseExpression) -> str:
    name = get_full_name_for_node(node)  # import names are always dotted Names
    assert name is not None
    return name


def _top_level_statements(body: object) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []
    for statement in body:  # type: ignore[attr-defined]
        found.append(statement)
        if isinstance(statement, (cst.If, cst.Try)):
            found += _top_level_statements(statement.body.body)
            handlers = getattr(statement, "handlers", ())
            for handler in handlers:
                found += _top_level_statements(handler.body.body)
            orelse = statement.orelse
            if isinstance(orelse, cst.Else):
                found += _top_level_statements(orelse.body.body)
            elif isinstance(orelse, cst.If):  # elif
                found += _top_level_statements([orelse])
    return found
