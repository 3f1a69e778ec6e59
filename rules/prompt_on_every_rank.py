from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.accelerator_objects import without_accelerator
from accelify.analysis.facts import Facts, facts_of
from accelify.analysis.project_modules import read, split_member
from accelify.analysis.repeated_effects import run_by_every_rank
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import all_params, dotted, has_parameter, top_level_functions, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_at

if TYPE_CHECKING:
    from accelify.analysis.outside_callers import Load, ProjectView

_PREPARED = (
    "import torch\n"
    "model = torch.nn.Linear(4, 1)\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
)

#: A training loop: the script is written for several processes.
_TRAINS = "for x in loader:\n    accelerator.backward(model(x).sum())\n    optimizer.step()\n"

#: The fix: the main process asks, and every rank takes its answer from the broadcast.
_ASKED_ONCE = (
    "from accelerate.utils import broadcast_object_list\n"
    "answer = [input('Overwrite? [y/N] ') if accelerator.is_main_process else None]\n"
    "broadcast_object_list(answer)\n"
    "if answer[0] != 'y':\n"
    "    raise SystemExit\n"
)


class PromptOnEveryRank(Rule):
    """``input()`` run by every rank of an Accelerator script (a prompt before overwriting the
    output folder, a "press Enter to start"): the launcher starts the N processes with the one
    terminal as their standard input, so each waits for a line, the line typed reaches one of
    them, and the others wait for another (a hang: the rank that got it waits in the first
    collective for ranks still reading); where standard input is closed
    (a batch job), every rank reads EOF and stops with ``EOFError``. The main process asks, and
    the answer reaches the others through ``broadcast_object_list`` (called on every rank).

    Only in a script written for several processes (it trains, prepares a DataLoader, or
    gathers, reduces or waits for the ranks): a chat demo that makes an Accelerator for its
    device alone runs as one process, where ``input()`` is right. Counted where every rank
    runs the call: outside a rank test (not in ``input(...) if
    accelerator.is_main_process else None`` nor ``is_main and input()``), and in a function
    some call of which every rank makes (or that nothing in the file calls and that reaches a
    collective). ``is_main and X or input()`` is ACC208's (the guard defeated by precedence);
    the ``else`` of ``if accelerator is None:`` (one plain process) is left alone."""

    code = "ACC216"
    name = "prompt-on-every-rank"
    message = (
        "Ask on the main process only and broadcast the answer: every rank runs this input(), "
        "and the ranks share one terminal, so the line typed reaches one of them and the others "
        "wait for another (hang; EOFError where stdin is closed)"
    )
    why = "N processes read one terminal: one gets the answer, the others wait forever."
    bad = (
        Example(
            HEADER
            + _PREPARED
            + "answer = input('Overwrite? [y/N] ')\n"
            + "if answer != 'y':\n"
            + "    raise SystemExit\n"
            + "for x in loader:\n"
            + "    accelerator.backward(model(x).sum())\n",
            7,
            10,
        ),
        # inside the training function every rank calls
        Example(
            HEADER
            + "import os\n\n\n"
            + "def train(loader):\n"
            + "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "    if os.path.exists('out'):\n"
            + "        if input('out exists; overwrite? ').lower() != 'y':\n"
            + "            return\n"
            + "    for x in loader:\n"
            + "        accelerator.backward(model(x).sum())\n\n\n"
            + "train(loader)\n",
            9,
            12,
        ),
        # an ``input`` bound in another function does not shadow the builtin here
        Example(
            HEADER
            + _PREPARED
            + "def read_cfg():\n    input = 'cfg.yaml'\n    return input\n\n\n"
            + "reply = input('start? ')\n"
            + _TRAINS,
            12,
            9,
        ),
        # a prompt in a lambda that every rank calls
        Example(
            HEADER
            + _PREPARED
            + "confirm = lambda question: input(question) == 'y'\n"
            + "if not confirm('Overwrite?'):\n    raise SystemExit\n"
            + _TRAINS,
            7,
            28,
        ),
    )
    good = (
        # asked on the main process, the answer broadcast to every rank
        HEADER + _PREPARED + _ASKED_ONCE,
        # asked under a rank test, in a function only the main process calls
        HEADER
        + _PREPARED
        + "def confirm():\n    return input('Upload? ') == 'y'\n\n\n"
        + "if accelerator.is_main_process:\n"
        + "    if confirm():\n"
        + "        print('uploading')\n"
        + "ok = accelerator.is_main_process and input('Push? ') == 'y'\n",
        # no Accelerator on this path: one plain process
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        "def main(distributed, model, optimizer, loader):\n"
        "    accelerator = Accelerator() if distributed else None\n"
        "    if accelerator is None:\n"
        "        name = input('run name: ')\n"
        "    else:\n"
        "        name = 'run'\n"
        "        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        "        for x in loader:\n"
        "            accelerator.backward(model(x).sum())\n"
        "    return name\n",
        # a chat demo that makes an Accelerator for its device alone: run as one process
        "import torch\nfrom accelerate import Accelerator\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "accelerator = Accelerator()\n"
        "model = accelerator.prepare(AutoModelForCausalLM.from_pretrained('gpt2'))\n"
        "tokenizer = AutoTokenizer.from_pretrained('gpt2')\n"
        "while True:\n"
        "    prompt = input('> ')\n"
        "    ids = tokenizer(prompt, return_tensors='pt').input_ids.to(accelerator.device)\n"
        "    print(tokenizer.decode(model.generate(ids)[0]))\n",
        # a local function that shadows the builtin, and a class of that name
        HEADER
        + _PREPARED
        + _TRAINS
        + "def input(prompt):\n    return 'y'\n\n\nanswer = input('Overwrite? ')\n",
        HEADER
        + _PREPARED
        + _TRAINS
        + "class input:\n    def __init__(self, text=''):\n        self.text = text\n\n\n"
        + "record = input('hello')\n",
        # a prompt in a lambda that only the main process calls, and one nothing calls
        HEADER
        + _PREPARED
        + _TRAINS
        + "from accelerate.utils import broadcast_object_list\n"
        + "confirm = lambda question: input(f'{question} [y/N] ').strip().lower() == 'y'\n"
        + "ask = lambda p: input(p)\n"
        + "answer = [confirm('Push?') if accelerator.is_main_process else None]\n"
        + "broadcast_object_list(answer)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        if not _runs_on_several_processes(script):
            return
        if "input" not in script.source and script.project is None:
            return  # no input() here, and no helper module of the project that may ask it
        facts = facts_of(script)
        placement, guards = facts.placement, facts.ranks.backend_guards
        helpers = _prompting_helpers(script)
        for call in script.calls:
            if call not in helpers and not _builtin_input(script, call):
                continue
            if _rank_tested_expression(script, facts, call):
                continue
            if _lambda_never_called_by_every_rank(script, facts, call):
                continue
            function = placement.enclosing_function(call)
            if not guards.entered_by_all(call, within=function):
                continue
            if without_accelerator(script, call):
                continue  # ``if accelerator is None:``: one plain process
            if function is not None and not run_by_every_rank(
                script, placement, guards, facts.synchronising_call, function
            ):
                continue
            yield self.finding(script, call, message=_message(script, call, helpers.get(call)))


#: Accelerator methods of a script written for several processes (training, combining).
_MULTI_PROCESS = frozenset(
    {"backward", "gather", "gather_for_metrics", "reduce", "wait_for_everyone"}
)


def _runs_on_several_processes(script: ScriptModel) -> bool:
    """The script is written for a launch on several processes: it trains (a backward), shards
    a DataLoader through prepare, or combines or waits for the ranks. A chat or demo script that
    makes an Accelerator for its device alone is run as one process, where input() is right."""
    if script.backward_calls:
        return True
    if script.names_of(Kind.DATALOADER) & script.prepared_names:
        return True
    accelerators = script.names_of(Kind.ACCELERATOR)
    return any(
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value in _MULTI_PROCESS
        and dotted(call.func.value) in accelerators
        for call in script.calls
    )


def _builtin_input(script: ScriptModel, call: cst.Call) -> bool:
    """``input(...)``, the builtin: not a name bound where the call looks it up, in a function
    around it or in the module (``def input``, ``class input``, ``input = ...``, a parameter,
    an import); an ``input = ...`` in another function does not shadow it here."""
    func = call.func
    if not (isinstance(func, cst.Name) and func.value == "input"):
        return False
    if "input" in script.imports.bound:
        return False
    around = [a for a in script.ancestors(call) if isinstance(a, cst.FunctionDef)]
    if any(has_parameter(function, "input") for function in around):
        return False
    seen = {id(scope) for scope in (*around, script.module)}
    bindings: list[cst.CSTNode] = list(script.index.assignments_to("input"))
    bindings += [
        node
        for node in script.index.of_type((cst.FunctionDef, cst.ClassDef))
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)) and node.name.value == "input"
    ]
    return not any(id(_defining_scope(script, node)) in seen for node in bindings)


def _defining_scope(script: ScriptModel, node: cst.CSTNode) -> cst.CSTNode:
    """The function, class body or module whose namespace a binding at ``node`` writes to (a
    method named ``input`` is the class's, not the module's)."""
    for ancestor in script.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Module)):
            return ancestor
    return script.module


def _lambda_never_called_by_every_rank(script: ScriptModel, facts: Facts, call: cst.Call) -> bool:
    """``call`` is in a lambda bound to a name (``confirm = lambda q: input(q) == "y"``) that
    no rank calls, or that only a rank test calls (``[confirm(q) if accelerator.is_main_process
    else None]``): defining the lambda asks nothing."""
    function = next((a for a in script.ancestors(call) if isinstance(a, cst.Lambda)), None)
    if function is None:
        return False
    statement = script.parent(function)
    if not (
        isinstance(statement, cst.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0].target, cst.Name)
    ):
        return False  # handed on or called in place: where it runs is not followed
    name = statement.targets[0].target.value
    placement, guards = facts.placement, facts.ranks.backend_guards
    return all(
        _rank_tested_expression(script, facts, use)
        or not guards.entered_by_all(use, within=placement.enclosing_function(use))
        for use in script.index.calls_named(name)
    )


def _rank_tested_expression(script: ScriptModel, facts: Facts, call: cst.Call) -> bool:
    """``input(...) if accelerator.is_main_process else None``, ``is_main and input(...)``, and
    ``is_main and X or input(...)`` (ACC208's): a rank test in the expression decides."""
    child: cst.CSTNode = call
    for ancestor in script.ancestors(call):
        if isinstance(ancestor, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            return False
        if (
            isinstance(ancestor, cst.IfExp)
            and child is not ancestor.test
            and facts.ranks.is_rank_test(ancestor.test)
        ):
            return True
        if (
            isinstance(ancestor, cst.BooleanOperation)
            and child is ancestor.right
            and any(facts.ranks.is_rank_test(node) for node in _operands(ancestor.left))
        ):
            return True
        child = ancestor
    return False


def _operands(node: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    yield node
    if isinstance(node, cst.BooleanOperation):
        yield from _operands(node.left)
        yield from _operands(node.right)


def _prompting_helpers(script: ScriptModel) -> dict[cst.Call, tuple[str, bool]]:
    """The file's calls of a function of another module of the project that asks ``input()``
    itself, on whichever ranks call it (``confirm_overwrite(args.output_dir)`` of a helper
    module that names no accelerator, so is never linted on its own), each with the place of
    its ``input()`` (``prompts.py:2``) and whether the helper also does work every rank must
    share (`_shared_work`): the call site is where the fix goes, else the ``input()`` itself.
    The helper's own
    ``input()`` counts where nothing in it tests the rank (`_rank_tested_expression`, a rank
    guard around it); a helper that only hands on to another is not followed, nor one of a
    module that names an accelerator (linted itself, where its ``input()`` is reported)."""
    project = script.project
    load = (project.load_alone or project.load) if project is not None else None
    if project is None or load is None:
        return {}
    found: dict[cst.Call, tuple[str, bool]] = {}
    places: dict[tuple[Path, str], tuple[str, bool] | None] = {}  # each helper read once
    for call in script.calls:
        name = dotted(call.func)
        qualified = script.imports.resolve(name) if name is not None else None
        split = split_member(qualified, project.path) if qualified else None
        if split is None:
            continue
        if split not in places:
            places[split] = _place_asked(project, load, split[0], split[1])
        if places[split] is not None:
            found[call] = places[split]  # type: ignore[assignment]
    return found


def _place_asked(
    project: ProjectView, load: Load, file: Path, name: str
) -> tuple[str, bool] | None:
    """``prompts.py:2``: where function ``name`` of the project module ``file`` asks
    `_asked_in`, and whether it does work every rank must share (`_shared_work`); None where
    it does not ask, or where the module names an accelerator (linted itself, its ``input()``
    reported there)."""
    text = read(file)
    if b"input(" not in text or b"ccelerator" in text:
        return None
    project.read.add(file)  # an edit of the helper changes the answer
    other = load(file)
    asked = _asked_in(other, name) if other is not None else None
    if other is None or asked is None:
        return None
    where = os.path.relpath(file.resolve(), project.path.resolve().parent)
    function = other.index.enclosing_function(asked)
    shared = function is not None and _shared_work(other, function)
    return f"{where}:{other.line(asked)}", shared


#: Collectives by their own name: a helper that runs one needs every rank in it.
_COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_object",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "reduce_scatter",
        "gather",
        "gather_object",
        "barrier",
        "gather_for_metrics",
        "wait_for_everyone",
    }
)


def _shared_work(script: ScriptModel, function: cst.FunctionDef) -> bool:
    """``function`` runs a collective (``torch.distributed.all_reduce(...)``) or calls one of
    its parameters (``model(x)``: a prepared model's forward, under DDP a collective where
    the model holds buffers): run on the main process alone, it waits for ranks that never
    come, so the helper cannot be wrapped in a rank test; its ``input()`` must be."""
    parameters = {p.name.value for p in all_params(function.params)}
    for call in walk(function):
        if not isinstance(call, cst.Call):
            continue
        name = dotted(call.func) or ""
        if isinstance(call.func, cst.Name) and name in parameters:
            return True
        if name.rsplit(".", 1)[-1] in _COLLECTIVES and "." in name:
            return True
    return False


def _asked_in(script: ScriptModel, name: str) -> cst.Call | None:
    """The builtin ``input()`` the module-level function ``name`` of ``script`` runs on every
    call of it (none under a rank test of its own)."""
    functions = top_level_functions(script.module, name)
    if not functions:
        return None
    function = functions[0]
    facts = facts_of(script)
    guards = facts.ranks.backend_guards
    for call in script.calls:
        if (
            script.inside(call, function)
            and facts.placement.enclosing_function(call) is function
            and _builtin_input(script, call)
            and not _rank_tested_expression(script, facts, call)
            and guards.entered_by_all(call, within=function)
        ):
            return call
    return None


def _message(script: ScriptModel, call: cst.Call, helper: tuple[str, bool] | None = None) -> str:
    accelerator = accelerator_at(script, call) or "accelerator"
    prompt = script.module.code_for_node(call)
    runs = "this input()"
    if helper is not None:
        place, shared = helper
        runs = f"{dotted(call.func)}(), which asks input() ({place})"
        if shared:
            return (
                f"Ask on the main process only and broadcast the answer, inside the helper: "
                f"every rank runs {runs}, and the launcher gives the N processes one "
                "terminal, so the line typed reaches one of them and the others wait for "
                "another (hang; EOFError where stdin is closed); the helper also runs a "
                "collective or the model's forward, which every rank must reach, so it "
                f"cannot run on the main process alone: at {place}, write `answer = "
                "[input(...) if PartialState().is_main_process else None]`, then "
                "`broadcast_object_list(answer)` on every rank (PartialState from accelerate, "
                "broadcast_object_list from accelerate.utils), and use answer[0]"
            )
    return (
        f"Ask on the main process only and broadcast the answer: every rank runs {runs}, "
        "and the launcher gives the N processes one terminal, so the line typed reaches one of "
        "them and the others wait for another (hang; EOFError where stdin is closed); write "
        f"`answer = [{prompt} if {accelerator}.is_main_process else None]`, then "
        "`broadcast_object_list(answer)` (from accelerate.utils) on every rank, and read "
        "answer[0]"
    )
