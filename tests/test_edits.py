"""One set of edits for convert and lint: `Plan` composes edits (nested ones chain, a rewrite
asked for twice is one, two rewrites of one node are a conflict it refuses with a review line),
and each rewrite convert and `lint --fix` share is written once, so both write the same code
for the same site."""

from __future__ import annotations

import re
from pathlib import Path

import libcst as cst
import pytest

from accelify.convert import convert_source
from accelify.edits import rewrites
from accelify.edits.apply import ApplyPlan
from accelify.edits.collective_rewrites import collective_stop
from accelify.edits.kinds import InsertBefore, Replace, Wrap
from accelify.edits.node_rewrites import Swap, WithKeyword
from accelify.edits.plan import NoteKind, Plan, statement
from accelify.lint.engine import lint_source
from accelify.lint.selection import Selection

ROOT = Path(__file__).resolve().parent.parent


def applied(module: cst.Module, plan: Plan) -> str:
    return module.visit(ApplyPlan(plan)).code


def call_in(module: cst.Module, index: int = 0) -> cst.Call:
    """The call of the ``index``-th line (``f(x)`` or ``y = f(x)``)."""
    small = module.body[index].body[0]  # type: ignore[attr-defined]
    return small.value  # type: ignore[return-value]


# -- Plan: composition ------------------------------------------------------------------------


def test_a_second_rewrite_of_one_node_is_refused_with_a_review_line():
    module = cst.parse_module("loss.backward()\n")
    call = call_in(module)
    plan = Plan()
    assert plan.add(rewrites.backward(call, "accelerator"), line=1, text="backward")
    refused = plan.add(Replace(call, Swap("other()")), line=1, text="other")
    assert not refused
    assert applied(module, plan) == "accelerator.backward(loss)\n"
    assert [(n.line, n.text) for n in plan.reviews] == [
        (1, "`other` not made: another edit already rewrites this code")
    ]
    assert [n.text for n in plan.changes] == ["backward"]


def test_a_rewrite_asked_for_twice_is_made_and_noted_once():
    module = cst.parse_module("model.save_pretrained(d)\n")
    owner = call_in(module).func.value  # type: ignore[attr-defined]
    plan = Plan()
    plan.add(rewrites.unwrap(owner, "accelerator"), line=1, text="unwrapped")
    plan.add(rewrites.unwrap(owner, "accelerator"), line=1, text="unwrapped again")
    assert applied(module, plan) == "accelerator.unwrap_model(model).save_pretrained(d)\n"
    assert [n.text for n in plan.changes] == ["unwrapped"]
    assert plan.reviews == []


def test_a_review_said_twice_is_one_line_marked_if_either_saying_marks_it():
    """The kind is not part of a note's equality: the same line and text is one line of the
    summary; the step that knows the number differs on N ranks need not be the first to say
    it, and its mark is kept."""
    plan = Plan()
    plan.review(3, "loss is this rank's")
    plan.review(3, "loss is this rank's", NoteKind.DIFFERS_ON_N_RANKS)
    plan.review(3, "loss is this rank's")
    assert [(n.line, n.text, n.kind) for n in plan.reviews] == [
        (3, "loss is this rank's", NoteKind.DIFFERS_ON_N_RANKS)
    ]


def test_an_edit_inside_an_edited_node_chains():
    module = cst.parse_module("torch.save(model.state_dict(), p)\n")
    save = call_in(module)
    model = save.args[0].value.func.value  # type: ignore[attr-defined]
    plan = Plan()
    plan.add(*rewrites.save(save, "accelerator"))
    plan.add(rewrites.unwrap(model, "accelerator"))
    assert applied(module, plan) == (
        "accelerator.save(accelerator.unwrap_model(model).state_dict(), p)\n"
    )


def test_wraps_stack_on_a_replacement_in_the_order_added():
    module = cst.parse_module("train(model)\n")
    call = call_in(module)
    plan = Plan()
    plan.add(Wrap(call, WithKeyword("accelerator", "accelerator")))
    plan.add(Replace(call, Swap("fit(model)")))
    plan.add(Wrap(call, WithKeyword("epochs", "3")))
    assert applied(module, plan) == "fit(model, accelerator=accelerator, epochs=3)\n"


def test_a_stop_s_told_print_moves_under_the_check_as_rewritten():
    module = cst.parse_module(
        "for epoch in range(9):\n"
        "    if bad >= patience:\n"
        "        print('early stop')\n"
        "        stop = True\n"
        "    if stop:\n"
        "        break\n"
    )
    loop = module.body[0]
    told_if, stop_if = loop.body.body  # type: ignore[attr-defined]
    told = told_if.body.body[0]
    plan = Plan()
    plan.add(*collective_stop(stop_if, "accelerator", told=[told]))
    plan.add(rewrites.print_once(told.body[0].value, "accelerator"))
    assert applied(module, plan) == (
        "for epoch in range(9):\n"
        "    if bad >= patience:\n"
        "        stop = True\n"
        "    if stop:\n"
        "        accelerator.set_trigger()\n"
        "    if accelerator.check_trigger():\n"
        "        accelerator.print('early stop')\n"
        "        break\n"
    )


def test_a_shown_sum_becomes_the_mean_of_the_ranks_sums_before_its_line():
    module = cst.parse_module("print(total / len(loader))\n")
    plan = Plan()
    plan.add(rewrites.whole_run_sum(module.body[0], "total", "accelerator"))
    assert applied(module, plan) == (
        "total = sum(gather_object([total])) / accelerator.num_processes\n"
        "print(total / len(loader))\n"
    )


def test_an_edit_that_gives_way_is_dropped_with_its_note_where_another_decides():
    module = cst.parse_module("model = Net().cuda()\nx = y.cuda()\n")
    model_move, batch_move = call_in(module, 0), call_in(module, 1)
    plan = Plan()
    for call in (model_move, batch_move):
        plan.add(
            rewrites.cuda_to_device(call, "accelerator"),
            line=1 if call is model_move else 2,
            text=".cuda() -> .to(accelerator.device)",
            gives_way_to=[call],
        )
    plan.add(rewrites.drop_move(model_move), line=1, text="removed model move")
    assert applied(module, plan) == "model = Net()\nx = y.to(accelerator.device)\n"
    assert [(n.line, n.text) for n in plan.changes] == [
        (2, ".cuda() -> .to(accelerator.device)"),
        (1, "removed model move"),
    ]
    assert plan.reviews == []


def test_an_if_whose_blocks_the_plan_empties_goes_and_one_it_does_not_stays():
    module = cst.parse_module("if ddp:\n    setup()\nif ddp:\n    setup()\n    train()\n")
    emptied, kept = module.body
    plan = Plan()
    for node in (emptied, kept):
        plan.remove_if_emptied(node, [node.body.body], 1, "removed the empty if")  # type: ignore[attr-defined]
        plan.remove(node.body.body[0])  # type: ignore[attr-defined]
    assert applied(module, plan) == "if ddp:\n    train()\n"
    assert [n.text for n in plan.changes] == ["removed the empty if"]


def test_inserts_planned_early_come_before_the_others_at_that_place():
    module = cst.parse_module("train()\n")
    anchor = module.body[0]
    plan = Plan()
    plan.insert_before(anchor, statement("set_seed(0)"))
    plan.insert_before(anchor, statement("accelerator = Accelerator()"), early=True)
    plan.insert_before(anchor, statement("set_seed(0)"))  # a second asking: not doubled
    assert applied(module, plan) == "accelerator = Accelerator()\nset_seed(0)\ntrain()\n"


def test_a_confined_plan_refuses_edits_outside_and_drops_their_notes():
    module = cst.parse_module("print(1)\nprint(2)\n")
    inside, outside = call_in(module, 0), call_in(module, 1)
    plan = Plan()
    plan.confine(lambda node: node is inside, lambda node: range(2, 3))
    plan.add(rewrites.print_once(inside, "self.accelerator"), line=1, text="print 1")
    plan.add(rewrites.print_once(outside, "self.accelerator"), line=2, text="print 2")
    plan.add(rewrites.print_once(outside, "trainer.accelerator"), anywhere=True)
    assert applied(module, plan) == "self.accelerator.print(1)\ntrainer.accelerator.print(2)\n"
    assert [n.text for n in plan.changes] == ["print 1"]


def test_lint_merges_fixes_without_overwriting_one_another():
    module = cst.parse_module("x = a.to('cuda:0')\n")
    call = call_in(module)
    first = Plan.of(rewrites.drop_move(call))
    first.merge(Plan.of(rewrites.use_device(call, "accelerator")))
    first.merge(Plan.of(InsertBefore(module.body[0], statement("accelerator.wait_for_everyone()"))))
    assert applied(module, first) == "accelerator.wait_for_everyone()\nx = a\n"


# -- One rewrite, two callers: convert and the rule's fix write the same code ---------------

SCRIPT = """\
import torch
from torch import nn

model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
loader = torch.utils.data.DataLoader(data, batch_size=4)
device = torch.device("cuda:0")
for epoch in range(2):
    for x, y in loader:
        x = x.to("cuda:0")
        optimizer.zero_grad()
        loss = (model(x) - y.to("cuda:0")).pow(2).mean()
        loss.backward(retain_graph=True)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        print(loss.item())
torch.save(model.state_dict(), "model.pt")
"""

#: The AMP the conversion cannot carry over (a dtype in a variable): the scaler stays.
KEPT_AMP = """\
import torch
from torch import nn

amp_dtype = torch.float16
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
loader = torch.utils.data.DataLoader(data, batch_size=4)
scaler = torch.cuda.amp.GradScaler()
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=amp_dtype):
        loss = (model(x) - y).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""

#: (rewrite, script, rule, the code convert wrote -> the code as the user wrote it): the
#: conversion with that one site put back as it was is what the rule's fix starts from.
SHARED = [
    (
        "backward",
        SCRIPT,
        "ACC301",
        {
            "accelerator.backward(loss, retain_graph=True)": "loss.backward(retain_graph=True)",
        },
    ),
    (
        "backward-kept-scaler",
        KEPT_AMP,
        "ACC301",
        {"accelerator.backward(scaler.scale(loss))": "scaler.scale(loss).backward()"},
    ),
    (
        "clipping",
        SCRIPT,
        "ACC302",
        {
            "accelerator.clip_grad_norm_(model.parameters(), 1.0)": (
                "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)"
            ),
        },
    ),
    (
        "print",
        SCRIPT,
        "ACC203",
        {"accelerator.print(loss.item())": "print(loss.item())"},
    ),
    (
        "save-and-barrier",
        SCRIPT,
        "ACC201",
        {
            "accelerator.wait_for_everyone()\naccelerator.save(": "torch.save(",
        },
    ),
    (
        "unwrap",
        # the save itself becomes accelerator.get_state_dict(model), which ACC503 also accepts
        SCRIPT + 'model.load_state_dict(torch.load("model.pt"))\n',
        "ACC503",
        {"accelerator.unwrap_model(model).load_state_dict(": "model.load_state_dict("},
    ),
    (
        "device",
        SCRIPT,
        "ACC102",
        {"device = accelerator.device": 'device = torch.device("cuda:0")'},
    ),
    (
        "dropped-move",
        SCRIPT,
        "ACC101",
        {"(model(x) - y).pow(2)": '(model(x) - y.to("cuda:0")).pow(2)'},
    ),
    (
        "dropped-move-statement",
        SCRIPT,
        "ACC101",
        {
            "        optimizer.zero_grad()\n        loss": (
                '        x = x.to("cuda:0")\n        optimizer.zero_grad()\n        loss'
            )
        },
    ),
]


@pytest.mark.parametrize(
    ("script", "rule", "reverted"),
    [
        pytest.param(script, rule, reverted, id=f"{name}-{rule}")
        for name, script, rule, reverted in SHARED
    ],
)
def test_convert_and_the_rule_s_fix_write_the_same_code(script: str, rule: str, reverted: dict):
    converted = convert_source(script.encode(), "train.py").converted.decode()
    unfixed = converted
    for written, original in reverted.items():
        assert unfixed.count(written) == 1, f"convert no longer writes {written!r}"
        unfixed = unfixed.replace(written, original)
    fixed = lint_source(unfixed.encode(), "train.py", Selection(select=[rule]), fix=True).fixed
    assert fixed is not None, f"{rule} reports nothing (or has no fix) where convert rewrote"
    assert fixed.decode() == converted


# -- No step reaches into a plan --------------------------------------------------------------

PLAN_INTERNALS = re.compile(
    r"\.(_?replacements|_?removals|_?before|_?after|_?guards|_?contexts|_?new_parameters"
    r"|_?wraps|_?fallbacks|_?emptied|_edits)\b"
)


@pytest.mark.parametrize(
    "module",
    sorted(
        [
            *(ROOT / "accelify/convert").rglob("*.py"),
            *(ROOT / "accelify/lint").rglob("*.py"),
            *(ROOT / "rules").glob("*.py"),
        ]
    ),
    ids=lambda path: str(path.relative_to(ROOT)),
)
def test_no_step_or_rule_reads_or_writes_a_plan_s_edits(module: Path):
    """Steps and fixes add edits through `Plan`'s methods, and lint merges fixes through
    `Plan.merge`; how edits compose is the plan's."""
    found = [
        f"{module.name}:{number}: {line.strip()}"
        for number, line in enumerate(module.read_text().splitlines(), 1)
        if PLAN_INTERNALS.search(line)
    ]
    assert found == []


TRAINER_AND_MODULE_CODE = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self):
        self.model = nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)))

    def fit(self):
        for x, y in self.loader:
            self.optimizer.zero_grad()
            loss = (self.model(x) - y).pow(2).mean()
            loss.backward()
            self.optimizer.step()


trainer = Trainer()
trainer.fit()
print("done")
loss = trainer.model(torch.randn(2, 4)).sum()
loss.backward()
"""


def test_a_conversion_in_a_class_changes_outside_it_only_what_needs_no_accelerator():
    """``self.accelerator`` exists in the class alone: outside it, a print and a backward go
    through the instance (``trainer.accelerator``); the seed sync, which needs the accelerator
    itself, is not made there: the data ``__init__`` draws before it builds the accelerator is
    reviewed at the draw, naming the module's line that runs it (``trainer = Trainer()``), and
    the forward after training gets no note."""
    conversion = convert_source(TRAINER_AND_MODULE_CODE.encode(), "train.py")
    converted = conversion.converted.decode()
    assert "            self.accelerator.backward(loss)\n" in converted
    assert converted.endswith(
        'trainer.accelerator.print("done")\n'
        "loss = trainer.model(torch.randn(2, 4)).sum()\ntrainer.accelerator.backward(loss)\n"
    )
    assert "from accelify import Accelerator\n" in converted  # no unused synchronize_rng_states
    assert [n.line for n in conversion.reviews] == [10]
    assert conversion.reviews[0].text.startswith(
        "random values drawn before training with no seed set, run from line 20, where "
        "self.accelerator is not reachable: every rank draws its own values"
    )
    assert not any(note.line == 23 for note in conversion.changes)
    assert [note.text for note in conversion.changes if note.line == 24] == [
        "loss.backward() -> trainer.accelerator.backward(loss)"
    ]


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("f(a, b)", "f(a, b, acc=acc)"),
        ("f(a, b,)", "f(a, b, acc=acc,)"),
        ("f(\n    a,\n    b\n)", "f(\n    a,\n    b,\n    acc=acc\n)"),
        ("f(\n    a,\n    b,\n)", "f(\n    a,\n    b,\n    acc=acc,\n)"),
        ("f()", "f(acc=acc)"),
        ("f(\n    a\n)", "f(\n    a, acc=acc\n)"),
    ],
)
def test_a_keyword_added_to_a_call_one_argument_a_line_goes_on_a_line_of_its_own(
    call: str, expected: str
):
    """The sentiment tutorial's ``train_epoch(\\n model,\\n ...,\\n len(df_train)\\n)``: the
    break before ``)`` belongs to the last argument; the keyword used to follow it with a comma
    and a trailing space on the closing parenthesis's line."""
    updated = WithKeyword("acc", "acc")(cst.parse_expression(call))
    assert cst.Module([]).code_for_node(updated) == expected


@pytest.mark.parametrize(
    ("loss", "given"),
    [
        ("(loss / accum)", "loss / accum"),  # its parentheses go: an argument needs none
        ("(loss)", "loss"),
        ("(loss, aux)[0]", "(loss, aux)[0]"),
    ],
)
def test_a_parenthesised_loss_is_handed_to_backward_without_its_parentheses(loss, given):
    module = cst.parse_module(f"{loss}.backward()\n")
    call = module.body[0].body[0].value  # type: ignore[attr-defined]
    plan = Plan()
    plan.add(rewrites.backward(call, "accelerator"), line=1, text="backward")
    assert applied(module, plan) == f"accelerator.backward({given})\n"


def test_a_parenthesised_tuple_or_generator_keeps_its_parentheses_as_an_argument():
    from accelify.edits.node_rewrites import bare_argument

    for code in ("(a, b)", "(x for x in y)"):
        node = cst.parse_expression(code)
        assert cst.Module([]).code_for_node(bare_argument(node)) == code
