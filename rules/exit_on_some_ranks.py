from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, statement_lines, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_name

#: What ends the process where it is called.
_EXITS = {"builtins.exit", "builtins.quit", "sys.exit", "os._exit"}
#: An early-stopping object handed the epoch's gathered score, called where the guard says.
_STOPPER = (
    HEADER
    + "class EarlyStopping:\n"
    + "    def __init__(self, patience):\n"
    + "        self.patience, self.best, self.bad, self.early_stop = patience, None, 0, False\n\n"
    + "    def __call__(self, score):\n"
    + "        if self.best is None or score > self.best:\n"
    + "            self.best, self.bad = score, 0\n"
    + "        else:\n"
    + "            self.bad += 1\n"
    + "            self.early_stop = self.bad >= self.patience\n\n\n"
    + "stopper = EarlyStopping(3)\n"
    + "for epoch in range(15):\n"
    + "    for batch in loader:\n"
    + "        accelerator.backward(model(batch).loss)\n"
    + "    val = accelerator.gather(val_loss).mean().item()\n"
    + "    if accelerator.is_main_process:\n"
    + "        stopper(val)\n"
    + "    if stopper.early_stop:\n"
    + "        break\n"
)
#: The early stop of a trainer's epoch loop, decided and taken in the main process's block;
#: the ranks that stay meet it next at the epoch's closing barrier (line 11).
EXIT_BEFORE_THE_BARRIER = (
    HEADER
    + "import sys\n"
    + "for epoch in range(10):\n"
    + "    for batch in loader:\n"
    + "        accelerator.backward(model(batch).loss)\n"
    + "    if accelerator.is_main_process:\n"
    + "        if evaluate(accelerator.unwrap_model(model)) < best:\n"
    + "            sys.exit()\n"
    + "        save(accelerator.unwrap_model(model))\n"
    + "    accelerator.wait_for_everyone()\n"
)
#: One rank exits in the batch loop (trial17's ``sys.exit(3)`` on rank 1): the others wait in
#: the next batch's ``backward`` (line 6), not at the evaluation's gather after the batch loop
#: (line 9), which they reach only after the last batch.
EXIT_IN_THE_BATCH_LOOP = (
    HEADER
    + "import sys\n"
    + "for epoch in range(10):\n"
    + "    for batch in loader:\n"
    + "        accelerator.backward(model(batch).loss)\n"
    + "        if epoch == 1 and accelerator.process_index == 1:\n"
    + "            sys.exit(3)\n"
    + "    scores = accelerator.gather_for_metrics(evaluate(model))\n"
)
_LOOP = (
    "for step, batch in enumerate(loader):\n"
    "    accelerator.backward(model(batch).loss)\n"
    "    optimizer.step()\n"
)


class ExitOnSomeRanks(Rule):
    """``exit()`` (``sys.exit``, ``quit``, ``os._exit``) under a rank test inside a training
    loop: ``if step >= max_steps and accelerator.is_main_process: save(); exit()``. The main
    process leaves; the other ranks go on to the loop's next ``backward`` (or barrier, gather,
    ``save_state``) and wait there for a rank that is gone, until the collective times out.
    Outside a loop the same holds for what comes after the exit: ``if
    accelerator.is_local_main_process and os.path.exists(out): exit(0)`` before ``prepare``
    and training leaves the other ranks waiting at the first collective. A loop with nothing
    every rank synchronises on, nothing but rank-guarded work after the exit, and an exit every
    rank takes, are left alone. A flag an early-stopping object sets (``if stopper.early_stop:
    break``) changes where its call runs: called under ``if accelerator.is_main_process:``, only
    that rank's object ever stops."""

    code = "ACC210"
    name = "exit-on-some-ranks"
    message = (
        "Exit on every rank: only the ranks under the rank test leave here, and the others wait "
        "at the loop's next collective for a rank that is gone (hang)"
    )
    why = "A rank that exits alone leaves the others waiting at the next collective."
    bad = (
        Example(  # seed-vc's V2 trainer: the step limit ends the main process only
            HEADER
            + "import torch\n"
            + "for step, batch in enumerate(loader):\n"
            + "    accelerator.backward(model(batch).loss)\n"
            + "    optimizer.step()\n"
            + "    if step >= max_steps and accelerator.is_main_process:\n"
            + "        torch.save(accelerator.unwrap_model(model).state_dict(), 'last.pt')\n"
            + "        exit()\n",
            9,
            9,
        ),
        Example(  # through the trainer's own method that runs the step
            HEADER
            + "import sys\n\n\n"
            + "class Trainer:\n"
            + "    def step(self, batch):\n"
            + "        accelerator.backward(self.model(batch).loss)\n\n"
            + "    def train(self):\n"
            + "        for batch in self.loader:\n"
            + "            self.step(batch)\n"
            + "            if accelerator.is_main_process and self.done():\n"
            + "                sys.exit(0)\n",
            14,
            17,
        ),
        Example(  # CZSL: the local main process leaves when the output exists, before training
            HEADER
            + "import os\n"
            + "if accelerator.is_local_main_process and os.path.exists(out):\n"
            + "    exit(0)\n"
            + "model, optimizer = accelerator.prepare(model, optimizer)\n"
            + "accelerator.backward(model(x).sum())\n",
            5,
            5,
        ),
        # a reranker's early stopping decided on the main process alone: it leaves the epochs,
        # the others start the next epoch's backward
        Example(
            HEADER
            + "for epoch in range(3):\n"
            + "    for batch in loader:\n"
            + "        accelerator.backward(model(batch).loss)\n"
            + "        optimizer.step()\n"
            + "    if accelerator.is_main_process:\n"
            + "        score = evaluate(accelerator.unwrap_model(model))\n"
            + "        if score < best:\n"
            + "            break\n",
            10,
            13,
        ),
        # a FLAVA classifier's early stopping: the patience counter counted on the main
        # process alone, tested on every rank; only the main process ever breaks
        Example(
            HEADER
            + "patience_counter = 0\n"
            + "for epoch in range(15):\n"
            + "    for batch in loader:\n"
            + "        accelerator.backward(model(batch).loss)\n"
            + "    val = accelerator.gather(val_loss).mean().item()\n"
            + "    if accelerator.is_main_process:\n"
            + "        if val < best:\n"
            + "            best, patience_counter = val, 0\n"
            + "        else:\n"
            + "            patience_counter += 1\n"
            + "    if patience_counter >= patience:\n"
            + "        break\n",
            14,
            9,
        ),
        # an early-stopping object called on the main process alone (it saves the best
        # checkpoint): only that rank's flag is ever set
        Example(_STOPPER, 23, 9),
        Example(  # the rank read once into a name of the file's
            HEADER
            + "import torch.distributed as dist\n"
            + "rank = dist.get_rank()\n"
            + "for epoch in range(3):\n"
            + "    for batch in loader:\n"
            + "        accelerator.backward(model(batch).loss)\n"
            + "    if rank == 0 and evaluate(model) < best:\n"
            + "        break\n",
            9,
            9,
        ),
        # vilmedic's Accelerate trainor: the early stop decided in the main process's
        # evaluation block exits it; the others wait at the epoch's closing barrier
        Example(EXIT_BEFORE_THE_BARRIER, 9, 13),
        Example(EXIT_IN_THE_BATCH_LOOP, 8, 13),
        Example(
            HEADER
            + "def train():\n"
            + "    for batch in loader:\n"
            + "        accelerator.backward(model(batch).loss)\n"
            + "        if accelerator.is_main_process and done():\n"
            + "            return\n\n\n"
            + "train()\n",
            7,
            13,
        ),
    )
    good = (
        # the stop decided on the main process, taken by every rank (Accelerate's trigger)
        HEADER
        + "for epoch in range(3):\n"
        + "    for batch in loader:\n"
        + "        accelerator.backward(model(batch).loss)\n"
        + "    if accelerator.is_main_process and evaluate(model) < best:\n"
        + "        accelerator.set_trigger()\n"
        + "    if accelerator.check_trigger():\n"
        + "        break\n",
        # a loop of the main process alone, inside its guard
        HEADER
        + "for batch in loader:\n"
        + "    accelerator.backward(model(batch).loss)\n"
        + "if accelerator.is_main_process:\n"
        + "    for path in paths:\n"
        + "        if accelerator.is_main_process and exists(path):\n"
        + "            break\n",
        # outside a loop, nothing but the main process's own work comes after the exit
        HEADER
        + "if accelerator.is_main_process and args.export_only:\n"
        + "    exit(0)\n"
        + "if accelerator.is_main_process:\n"
        + "    export(model)\n",
        # every rank leaves together once the main process has saved
        HEADER
        + _LOOP
        + "    if step >= max_steps:\n"
        + "        if accelerator.is_main_process:\n"
        + "            accelerator.save(model.state_dict(), 'last.pt')\n"
        + "        exit()\n",
        # the counter counted on every rank from the gathered loss: every rank stops together
        HEADER
        + "patience_counter = 0\n"
        + "for epoch in range(15):\n"
        + "    for batch in loader:\n"
        + "        accelerator.backward(model(batch).loss)\n"
        + "    val = accelerator.gather(val_loss).mean().item()\n"
        + "    if val < best:\n"
        + "        best, patience_counter = val, 0\n"
        + "    else:\n"
        + "        patience_counter += 1\n"
        + "    if accelerator.is_main_process:\n"
        + "        print(patience_counter)\n"
        + "    if patience_counter >= patience:\n"
        + "        break\n",
        # the early-stopping object called on every rank with the gathered score
        _STOPPER.replace(
            "    if accelerator.is_main_process:\n        stopper(val)\n", "    stopper(val)\n"
        ),
        # decided on the main process, then handed to every rank before the test
        HEADER
        + "from accelerate.utils import broadcast_object_list\n"
        + "for epoch in range(15):\n"
        + "    for batch in loader:\n"
        + "        accelerator.backward(model(batch).loss)\n"
        + "    stop = [False]\n"
        + "    if accelerator.is_main_process:\n"
        + "        stop = [evaluate(model) < best]\n"
        + "    broadcast_object_list(stop)\n"
        + "    if stop[0]:\n"
        + "        break\n",
        # after the loop: nothing is left to wait for
        HEADER + _LOOP + "if accelerator.is_main_process:\n    exit()\n",
        # a metric named like a rank, gathered: the same on every rank, every rank stops
        HEADER
        + "for epoch in range(10):\n"
        + "    for batch in loader:\n"
        + "        accelerator.backward(model(batch).loss)\n"
        + "    scores = accelerator.gather_for_metrics(model(next(iter(val_loader))).logits)\n"
        + "    reciprocal_rank = (1.0 / scores.argmin(-1).add(1)).mean().item()\n"
        + "    if reciprocal_rank <= best_mrr:\n"
        + "        break\n"
        + "    best_mrr = reciprocal_rank\n",
        # a loop of the main process alone
        HEADER
        + "for path in paths:\n"
        + "    if accelerator.is_main_process and not exists(path):\n"
        + "        exit(1)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        yield from self._loops_left_by_some_ranks(script)
        yield from self._loops_left_on_a_rank_only_value(script)
        facts = facts_of(script)
        for call in script.calls:
            if not script.call_names(call) & _EXITS or not script.under_rank_guard(call):
                continue
            function = facts.placement.enclosing_function(call)
            loop = _outermost_loop(script, call, function)
            if loop is None:
                waiting = _collective_below(script, call, function)
                if waiting is not None:
                    yield self.finding(
                        script,
                        call,
                        message=(
                            "Exit on every rank: only the ranks under the rank test leave here, "
                            "and the others go on to the collective at line "
                            f"{script.line(waiting)} and wait there for a rank that is gone "
                            "(hang); test the condition on every rank and exit together"
                        ),
                    )
                continue
            waiting = _first_met_around(script, call, function)
            if waiting is None:
                continue
            yield self.finding(
                script,
                call,
                message=(
                    "Exit on every rank: only the ranks under the rank test leave here, and the "
                    f"others go on to the collective at line {script.line(waiting)} and wait "
                    "there for a rank that is gone (hang); end the loop on every rank, saving "
                    "on the main process first"
                ),
            )

    def _loops_left_by_some_ranks(self, script: ScriptModel) -> Iterator[Finding]:
        """``break`` (or ``return``) under a rank test inside a loop whose other statements
        every rank runs into a collective: a reranker's early stopping, decided on the main
        process alone (``if no_improve >= patience: break`` under ``if
        accelerator.is_main_process:``), ends the main process's epochs while the others start
        the next epoch's ``backward`` and wait there for it."""
        for node, loop in _loop_exits(script):
            test = _rank_test_between(script, node, loop)
            if test is None:
                continue
            waiting = _where_the_others_wait(script, loop, node)
            if waiting is None:
                continue
            leaves = "break" if isinstance(node, cst.Break) else "return"
            accelerator = accelerator_name(script, node)
            yield self.finding(
                script,
                node,
                covers=_collectives_left_behind(script, node, loop),
                message=(
                    f"Leave the loop on every rank: only the ranks that pass the rank test at "
                    f"line {script.line(test)} {leaves} here, and the others go on to the "
                    f"collective at line {script.line(waiting)} and wait there for a rank that "
                    f"is gone (hang); call {accelerator}.set_trigger() here instead, and after "
                    f"the test, on every rank, `if {accelerator}.check_trigger(): {leaves}`"
                ),
            )

    def _loops_left_on_a_rank_only_value(self, script: ScriptModel) -> Iterator[Finding]:
        """``break`` (or ``return``) outside any rank test, under a test of a value the loop
        changes only under one: an early stop whose patience counter the main process alone
        counts (``if accelerator.is_main_process: ... patience_counter += 1`` then, on every
        rank, ``if patience_counter >= patience: break``). The other ranks keep the value they
        had, never pass the test, and go on to the loop's next collective, where they wait for
        the main process that left (hang)."""
        for node, loop in _loop_exits(script):
            if _rank_test_between(script, node, loop) is not None:
                continue
            changed = _changed_under_a_rank_test_only(script, node, loop)
            if changed is None:
                continue
            name, guard = changed
            waiting = _where_the_others_wait(script, loop, node)
            if waiting is None:
                continue
            leaves = "break" if isinstance(node, cst.Break) else "return"
            accelerator = accelerator_name(script, node)
            yield self.finding(
                script,
                node,
                covers=_collectives_left_behind(script, node, loop),
                message=(
                    f"Leave the loop on every rank: {name} changes only under the rank test at "
                    f"line {script.line(guard)}, so the ranks disagree on the test that leads "
                    f"here and only the ranks under that rank test {leaves}; the others go on "
                    f"to the collective at line {script.line(waiting)} and wait there for a "
                    f"rank that is gone (hang); change {name} on every rank (from values every "
                    f"rank holds alike), or call {accelerator}.set_trigger() under the rank "
                    f"test and `if {accelerator}.check_trigger(): {leaves}` on every rank"
                ),
            )


def _collectives_left_behind(
    script: ScriptModel, node: cst.Break | cst.Return, loop: cst.For | cst.While
) -> list[tuple[int, int, str]]:
    """ACC202's findings (line, column, code) at the collectives after ``node`` in ``loop``
    that the ranks leaving there skip, and that every rank would reach without that leaving
    ``if`` (``if accelerator.is_main_process and done: break`` then
    ``accelerator.wait_for_everyone()``): the same hang, whose fix (every rank leaves
    together) is this rule's advice; "call it on every rank" at the barrier would not fix it."""
    leaving = tuple(
        ancestor
        for ancestor in script.ancestors(node)
        if isinstance(ancestor, cst.If) and script.inside(ancestor, loop)
    )
    facts = facts_of(script)
    start = script.order(node)
    covered = []
    for use in facts.collective_uses:
        if (
            use.skipped_on
            and script.order(use.call) > start
            and script.inside(use.call, loop)
            and not facts.collective_reach.skipped_but_for(use, leaving)
        ):
            position = script.position(use.call).start
            covered.append((position.line, position.column + 1, "ACC202"))
    return covered


def _changed_under_a_rank_test_only(
    script: ScriptModel, node: cst.CSTNode, loop: cst.For | cst.While
) -> tuple[str, cst.If] | None:
    """A name (or attribute) read in a test of an ``if`` between ``loop`` and ``node`` that the
    loop binds (``=``, ``+=``) only under a rank test, at least once: what it holds differs
    between the ranks. The name and the rank test of its first such binding."""
    for ancestor in script.ancestors(node):
        if ancestor is loop:
            return None
        if not isinstance(ancestor, cst.If):
            continue
        read = {
            spelled
            for n in walk(ancestor.test)
            if isinstance(n, (cst.Name, cst.Attribute)) and (spelled := dotted(n)) is not None
        }
        for name in sorted(read):
            bindings = [
                b for b in _bindings_of(script, name) if script.inside(b, loop) and b is not node
            ]
            if not bindings:  # ``stopper.early_stop``: set by the method a call runs
                bindings = _calls_that_set(script, name, loop)
            guards = [_rank_test_between(script, b, loop) for b in bindings]
            if bindings and all(guard is not None for guard in guards):
                return name, guards[0]  # type: ignore[return-value]
    return None


def _calls_that_set(script: ScriptModel, name: str, loop: cst.For | cst.While) -> list[cst.Call]:
    """For an attribute of an object of a class of the file (``stopper.early_stop``), the calls
    in ``loop`` of the object (``stopper(val_loss)``) or of its methods that set it: the method
    the call runs (or another method of its class that one calls on ``self``) assigns
    ``self.early_stop``. An early-stopping object called under ``if
    accelerator.is_main_process:`` (it saves the best checkpoint) decides on that rank alone."""
    if "." not in name:
        return []
    receiver, attribute = name.rsplit(".", 1)
    graph = script.call_graph
    found: list[cst.Call] = []
    for call in walk(loop.body):
        if not isinstance(call, cst.Call):
            continue
        func = call.func
        if dotted(func) != receiver and not (
            isinstance(func, cst.Attribute) and dotted(func.value) == receiver
        ):
            continue
        methods = [method for method, implicit in graph.callees(call) if implicit == 1]
        if any(_sets(script, method, attribute, 2) for method in methods):
            found.append(call)
    return found


def _sets(script: ScriptModel, method: cst.FunctionDef, attribute: str, depth: int) -> bool:
    """``method`` binds ``self.<attribute>``, or calls on ``self`` a method of its class that
    does (``depth`` calls deep)."""
    target = f"self.{attribute}"
    for node in walk(method.body):
        if isinstance(node, cst.Assign | cst.AugAssign | cst.AnnAssign) and any(
            dotted(t) == target for t in _targets_of(node)
        ):
            return True
    if depth == 0:
        return False
    graph = script.call_graph
    owner = graph.owner(method)
    for call in script.index.calls_directly_in(method):
        if isinstance(call.func, cst.Attribute) and dotted(call.func.value) == "self":
            for inner, implicit in graph.callees(call):
                if (
                    inner is not method
                    and implicit == 1
                    and graph.owner(inner) is owner
                    and _sets(script, inner, attribute, depth - 1)
                ):
                    return True
    return False


def _targets_of(node: cst.Assign | cst.AugAssign | cst.AnnAssign) -> list[cst.BaseExpression]:
    if isinstance(node, cst.Assign):
        found: list[cst.BaseExpression] = []
        for target in node.targets:
            value = target.target
            found += [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
        return found
    return [node.target]


def _bindings_of(script: ScriptModel, name: str) -> list[cst.CSTNode]:
    """``name = ...`` and ``name += ...`` (``op=`` of any operator) anywhere in the file."""
    augmented = [
        node
        for node in script.index.of_type(cst.AugAssign)
        if isinstance(node, cst.AugAssign) and dotted(node.target) == name
    ]
    return [*script.index.assignments_to(name), *augmented]


def _loop_exits(
    script: ScriptModel,
) -> Iterator[tuple[cst.Break | cst.Return, cst.For | cst.While]]:
    """Each ``break`` with the loop it leaves, and each ``return`` with the outermost loop of
    its function it leaves."""
    placement = facts_of(script).placement
    for node in script.index.of_type(cst.Break) + script.index.of_type(cst.Return):
        loop = (
            script.index.enclosing_loop(node)
            if isinstance(node, cst.Break)
            else _outermost_loop(script, node, placement.enclosing_function(node))
        )
        if loop is not None:
            yield node, loop


def _rank_test_between(
    script: ScriptModel, node: cst.CSTNode, loop: cst.For | cst.While
) -> cst.If | None:
    """The ``if`` on the rank (``if accelerator.is_main_process:``) between ``loop`` and
    ``node``, whose branch ``node`` is in: only some ranks get there."""
    child: cst.CSTNode = node
    for ancestor in script.ancestors(node):
        if ancestor is loop:
            return None
        if (
            isinstance(ancestor, cst.If)
            and child is not ancestor.test
            and _reads_the_rank(script, ancestor.test)
        ):
            return ancestor
        child = ancestor
    return None


def _reads_the_rank(script: ScriptModel, test: cst.BaseExpression) -> bool:
    """``test`` is a rank test (`RankDependence.is_rank_test`: it reads this process's rank,
    `ScriptModel.reads_rank`); a value merely named like one (``reciprocal_rank =
    (1.0 / ranks).mean().item()``, a metric the gather made the same on every rank) is not."""
    return facts_of(script).ranks.is_rank_test(test)


def _where_the_others_wait(
    script: ScriptModel, loop: cst.For | cst.While, left: cst.CSTNode
) -> cst.SimpleStatementLine | None:
    """The first collective the ranks that stay reach once some left at ``left``: the rest of
    the iteration first (a ``wait_for_everyone()`` at the end of the epoch, after the main
    process's evaluation block that exits), else the loop's top in its next iteration. One
    that runs on every pass comes before one in a branch (``if epoch % 5 == 0:
    accelerator.wait_for_everyone()``): on the passes that skip it, the ranks that stay wait
    at the next one, the next epoch's ``backward``."""
    reach = facts_of(script).collective_reach
    meeting = [
        statement
        for statement in statement_lines(loop.body)
        if not script.under_rank_guard(statement) and reach.synchronising_in(statement) is not None
    ]
    start = script.order(left)
    ordered = [s for s in meeting if script.order(s) > start] + meeting
    every_pass = [s for s in ordered if not _in_a_branch_of(script, s, loop)]
    return (every_pass or ordered or [None])[0]


def _first_met_around(
    script: ScriptModel, left: cst.CSTNode, function: cst.CSTNode | None
) -> cst.SimpleStatementLine | None:
    """Where the ranks that stay wait once some exit at ``left``: the innermost loop around it
    first (the rest of its pass, then its next pass from the top: an exit in the batch loop
    leaves the others in the next batch's ``backward``, not at the evaluation after the batch
    loop, which they reach only on its last pass), then each loop around that one."""
    for ancestor in script.ancestors(left):
        if ancestor is function:
            break
        if isinstance(ancestor, (cst.For, cst.While)):
            waiting = _where_the_others_wait(script, ancestor, left)
            if waiting is not None:
                return waiting
    return None


def _in_a_branch_of(script: ScriptModel, statement: cst.CSTNode, loop: cst.CSTNode) -> bool:
    """``statement`` sits in an ``if`` of ``loop``'s body: some passes skip it."""
    for ancestor in script.ancestors(statement):
        if ancestor is loop:
            return False
        if isinstance(ancestor, cst.If):
            return True
    return False


def _outermost_loop(
    script: ScriptModel, node: cst.CSTNode, function: cst.CSTNode | None
) -> cst.For | cst.While | None:
    found = None
    for ancestor in script.ancestors(node):
        if ancestor is function:
            break
        if isinstance(ancestor, (cst.For, cst.While)):
            found = ancestor
    return found


def _collective_below(
    script: ScriptModel, exit_call: cst.Call, function: cst.CSTNode | None
) -> cst.CSTNode | None:
    """Outside any loop: the first statement after the exit's block, in the same function (or
    module), outside every rank test, that is or reaches a collective: where the ranks that did
    not exit wait (``if is_main and exists(out): exit(0)`` before ``prepare`` and training)."""
    reach = facts_of(script).collective_reach
    child: cst.CSTNode = exit_call
    for ancestor in script.ancestors(exit_call):
        if isinstance(ancestor, (cst.IndentedBlock, cst.Module)):
            body = list(ancestor.body)
            later = body[body.index(child) + 1 :] if child in body else []
            for sibling in later:
                for statement in statement_lines(sibling):
                    if script.under_rank_guard(statement):
                        continue
                    if reach.synchronising_in(statement) is not None:
                        return statement
        if ancestor is function or isinstance(ancestor, cst.Module):
            return None
        child = ancestor
    return None
