from collections.abc import Iterator

import libcst as cst

from accelify.analysis.accelerator_objects import without_accelerator
from accelify.analysis.facts import Facts, facts_of
from accelify.analysis.repeated_effects import run_by_every_rank
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_at

_PREPARED = (
    "import torch\n"
    "model = torch.nn.Linear(4, 1)\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
)

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
        "def main(distributed):\n"
        "    accelerator = Accelerator() if distributed else None\n"
        "    if accelerator is None:\n"
        "        name = input('run name: ')\n"
        "    else:\n"
        "        name = 'run'\n"
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
        # a local function that shadows the builtin
        HEADER + "def input(prompt):\n    return 'y'\n\n\nanswer = input('Overwrite? ')\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        if "input" not in script.source or not _runs_on_several_processes(script):
            return
        facts = facts_of(script)
        placement, guards = facts.placement, facts.ranks.backend_guards
        for call in script.calls:
            if not _builtin_input(script, call) or _rank_tested_expression(script, facts, call):
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
            yield self.finding(script, call, message=_message(script, call))


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
    """``input(...)``, the builtin: not a name the file binds (``def input``, an import)."""
    func = call.func
    if not (isinstance(func, cst.Name) and func.value == "input"):
        return False
    return (
        "input" not in script.imports.bound
        and not script.index.assignments_to("input")
        and not any(
            isinstance(node, cst.FunctionDef) and node.name.value == "input"
            for node in script.index.of_type(cst.FunctionDef)
        )
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


def _message(script: ScriptModel, call: cst.Call) -> str:
    accelerator = accelerator_at(script, call) or "accelerator"
    prompt = script.module.code_for_node(call)
    return (
        "Ask on the main process only and broadcast the answer: every rank runs this input(), "
        "and the launcher gives the N processes one terminal, so the line typed reaches one of "
        "them and the others wait for another (hang; EOFError where stdin is closed); write "
        f"`answer = [{prompt} if {accelerator}.is_main_process else None]`, then "
        "`broadcast_object_list(answer)` (from accelerate.utils) on every rank, and read "
        "answer[0]"
    )
