"""A ``break`` on a value only this rank computed leaves the other ranks waiting in their next
collective; so does a ``continue`` (``if torch.isnan(loss): continue``) or a ``return`` out of
a training step before its backward: the others wait in that backward's all-reduce for this
rank, which went on to its next batch. The decision is made collective with
``set_trigger``/``check_trigger``: every rank stops (skips the batch, returns) when any rank
would, which on one process is what the script did. What the ``if`` did before leaving
(``converged = True``, a print) moves under the collective check, so every rank does it. A
``continue`` or ``return`` with no collective after it skips nothing the others wait in: it
stays; so does a ``break`` out of a loop where the ranks never meet (a per-rank retry, a search
over a local list), which each rank may run a different number of times, and a stop every rank
decides alike (`agreed_values`: a gathered metric, a greedy generation's end token)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal

import libcst as cst
from libcst.metadata import CodePosition

from accelify.analysis.own_stops import decided_on_own_shard
from accelify.analysis.rank_dependence import SETTINGS_ROOTS
from accelify.analysis.syntax import dotted, is_print_alone, walk
from accelify.convert.steps.context import Context
from accelify.edits.collective_rewrites import collective_stop


def run(ctx: Context) -> None:
    for if_node, stop in _per_process_stops(ctx):
        _make_collective(ctx, if_node, stop)
    for loop in ctx.model.index.of_type(cst.While):
        _told_of_a_per_process_condition(ctx, loop)
    for case in ctx.model.index.of_type(cst.MatchCase):
        _told_of_a_per_process_case(ctx, case)
    for if_node, stop in _stops_on_own_shard(ctx):
        _make_collective(ctx, if_node, stop)


def decided_alike(ctx: Context) -> Callable[[cst.If], bool]:
    """Which branches every rank takes alike once converted: those whose test every rank
    decides alike (`AgreedValues.branch_agreed`), and the stops this step makes collective
    (``if step >= limit: break`` on a counter a resume set, ``if loss.item() < 0.01: break``):
    after ``set_trigger``/``check_trigger`` every rank leaves at the same iteration and runs
    the stop's body, so a save after it (or in it) is reached by every rank, and the steps that
    place barriers and gather state (`saving`, `saved_states`) must not say that a rank may
    leave alone there."""
    if ctx.collective_stops is None:
        ctx.collective_stops = {
            id(if_node)
            for if_node, stop in [*_per_process_stops(ctx), *_stops_on_own_shard(ctx)]
            if _branch_around(ctx, if_node, stop) is not False
        }
    made = ctx.collective_stops
    return lambda branch: id(branch) in made or ctx.agreed.branch_agreed(branch)


def _per_process_stops(
    ctx: Context,
) -> Iterator[tuple[cst.If, cst.Break | cst.Continue | cst.Return]]:
    """The stops on a test each rank decides for itself (`RankDependence.per_process_stops`)
    whose leaving the others would wait for. A break leaves the loop whose later collectives
    the others reach (none in a loop that is each rank's own: a retry, a search over a local
    list, where a check_trigger would itself be a collective reached a different number of
    times); a continue or a return matters only where something after it synchronises."""
    reach = ctx.facts.collective_reach
    for if_node, stop in ctx.facts.ranks.per_process_stops():
        if _names_only(ctx, if_node.test) and ctx.agreed.test_agreed(if_node.test, if_node):
            # every rank decides alike (a gathered metric, a greedy token of the prepared model
            # in eval mode): each leaves at the same iteration on its own
            continue
        if isinstance(stop, cst.Break):
            loop = ctx.model.index.enclosing_loop(if_node)
            if loop is not None and reach.where_the_ranks_meet(loop) is not None:
                yield if_node, stop
        elif reach.where_the_others_wait_after(if_node, stop):
            yield if_node, stop


def _stops_on_own_shard(
    ctx: Context,
) -> Iterator[tuple[cst.If, cst.Break | cst.Continue | cst.Return]]:
    """``if self.should_stop: break``: an attribute, spelt as every rank's, that a callback
    sets on a test of this rank's own training loss (ACC420's analysis: `own_stops`)."""
    reach = ctx.facts.collective_reach
    view = ctx.shard_view()
    for if_node, stop in ctx.facts.ranks.stops():
        if not isinstance(stop, cst.Break) or not ctx.facts.ranks.uniform(if_node.test):
            continue
        loop = ctx.model.index.enclosing_loop(if_node)
        if not isinstance(loop, cst.For) or reach.where_the_ranks_meet(loop) is None:
            continue
        decided = decided_on_own_shard(ctx.facts, if_node, loop, view)
        if decided is not None and _in_training(ctx, decided.origin):
            yield if_node, stop


def _told_of_a_per_process_condition(ctx: Context, loop: cst.While) -> None:
    """``while not stop and epoch < 29:`` on a flag this rank set from its own loss: a rank
    that leaves sooner leaves the others waiting in the loop's collectives (a hang). The
    condition is not rewritten (a check_trigger in a loop's test would itself be a collective
    some ranks skip); a review line says how to make the decision every rank's."""
    test = loop.test
    ranks = ctx.facts.ranks
    if ranks.uniform(test) or ranks.is_rank_test(test):
        return
    if _names_only(ctx, test) and ctx.agreed.test_agreed(test, loop):
        return
    if ctx.facts.collective_reach.where_the_ranks_meet(loop) is None:
        return
    if id(loop) in ctx.left_whole and _drawn_batches_only(ctx, loop):
        return  # ``while batch is not None:`` over a loader left whole: the same on every rank
    ctx.review_at(
        loop,
        "this loop's condition reads a value each rank computed for itself: a rank that "
        "leaves sooner leaves the others waiting in the loop's collectives (a hang); left as "
        "it is: decide the stop on every rank alike (accelerator.set_trigger() where the flag "
        "is set, then `if accelerator.check_trigger(): break` in the loop), or reduce the value "
        "first (accelerator.reduce(..., 'mean'))",
    )


def _drawn_batches_only(ctx: Context, loop: cst.While) -> bool:
    """Every name the loop's test reads is only ever bound to ``next(...)`` in its function: a
    batch drawn from the iterator of the loader the loop evaluates."""
    read = {n.value for n in walk(loop.test) if isinstance(n, cst.Name)} - {"None"}
    scope = ctx.facts.placement.enclosing_function(loop) or ctx.model.module
    for name in read:
        values = [
            node.value
            for node in walk(scope)
            if isinstance(node, cst.Assign) and any(dotted(t.target) == name for t in node.targets)
        ]
        if not values or not all(
            isinstance(v, cst.Call) and dotted(v.func) == "next" for v in values
        ):
            return False
    return bool(read)


def _told_of_a_per_process_case(ctx: Context, case: cst.MatchCase) -> None:
    """``match (n := self.bad_epochs): case _ if n >= self.patience: break`` on a counter this
    rank keeps: the same per-process stop as an ``if``, which the pass rewrites only in an
    ``if``; here a review line says so (a check_trigger inside one case would be reached by
    some ranks only: a hang)."""
    body = case.body.body if isinstance(case.body, cst.IndentedBlock) else []
    last = body[-1] if body else None
    if not (
        isinstance(last, cst.SimpleStatementLine)
        and any(isinstance(s, cst.Break) for s in last.body)
    ):
        return
    match = ctx.model.parent(case)
    loop = ctx.model.index.enclosing_loop(case)
    if not isinstance(match, cst.Match) or loop is None:
        return
    ranks = ctx.facts.ranks
    tests = [match.subject, *([case.guard] if case.guard is not None else [])]
    if all(ranks.uniform(t) for t in tests):
        return
    if ctx.facts.collective_reach.where_the_ranks_meet(loop) is None:
        return
    ctx.review_at(
        case,
        "this break is decided on a value each rank computed for itself (a match case): a rank "
        "that leaves the loop sooner leaves the others waiting in its collectives (a hang); "
        "left as it is: write it as `if ...: accelerator.set_trigger()` and then `if "
        "accelerator.check_trigger(): break`, or reduce the value first "
        "(accelerator.reduce(..., 'mean'))",
    )


def _names_only(ctx: Context, test: cst.BaseExpression) -> bool:
    """``next_tok == EOS``: a test of plain names and constants, and of the instance's
    settings (``bad >= self.patience``: `_constructor_setting`). A call (``stopper(f1)``),
    another attribute (``self.stop``) or a subscript (``state["done"]``) may read state an
    object keeps per rank, which `agreed_values` takes as agreed: such a stop is still made
    collective, which costs nothing when it is."""
    return not any(
        isinstance(node, (cst.Call, cst.Subscript))
        or (
            isinstance(node, cst.Attribute)
            and not _constructor_setting(ctx, node)
            and not _run_setting(ctx, node)
            and not _agreed_state(ctx, node)
        )
        for node in walk(test)
    )


def _agreed_state(ctx: Context, attribute: cst.Attribute) -> bool:
    """``self.stop``, ``self.epoch``: instance state every write of which is agreed
    (`AgreedValues.state_agreed`: a flag a trigger method sets from a gathered validation loss,
    an epoch counter), so every rank reads it alike."""
    return (
        isinstance(attribute.value, cst.Name)
        and attribute.value.value == "self"
        and not _set_by_name(ctx, attribute.attr.value)
        and ctx.agreed.state_agreed(attribute.attr.value)
    )


def _run_setting(ctx: Context, attribute: cst.Attribute) -> bool:
    """``args.patience``: a field of the run's settings (`SETTINGS_ROOTS`: the command line
    every rank parses alike) that nothing in the file stores into, so no rank holds its own."""
    name = dotted(attribute)
    if name is None or name.count(".") != 1 or name.split(".")[0] not in SETTINGS_ROOTS:
        return False
    return not ctx.model.index.assignments_to(name) and not _set_by_name(ctx, attribute.attr.value)


def _constructor_setting(ctx: Context, attribute: cst.Attribute) -> bool:
    """``self.patience``: every write of an attribute of that name in the file is
    ``self.patience = <value>`` in an ``__init__``, of a value every rank holds alike there
    (a constant, a parameter every construction hands one: `agreed_values`)."""
    if not (isinstance(attribute.value, cst.Name) and attribute.value.value == "self"):
        return False
    name = attribute.attr.value
    if _set_by_name(ctx, name):
        return False
    writes = ctx.agreed.attribute_writes().get(name, [])
    if not writes:
        return False
    for write in writes:
        function = ctx.facts.placement.enclosing_function(write)
        if not isinstance(write, cst.Assign) or len(write.targets) != 1:
            return False
        if not isinstance(write.targets[0].target, cst.Attribute):  # ``self.a, self.b = ...``
            return False
        if function is None or function.name.value != "__init__":
            return False
        if not ctx.agreed.test_agreed(write.value, write):
            return False
    return True


def _set_by_name(ctx: Context, name: str) -> bool:
    """``setattr(self, "bad", ...)`` or a ``setattr`` whose name the file computes: a write the
    assignments do not show, so the attribute is not a constructor's setting."""
    for node in walk(ctx.model.module):
        if not (isinstance(node, cst.Call) and dotted(node.func) == "setattr"):
            continue
        if len(node.args) < 2:
            return True
        key = node.args[1].value
        if not isinstance(key, cst.SimpleString) or key.evaluated_value == name:
            return True
    return False


def _in_training(ctx: Context, origin: cst.CSTNode) -> bool:
    """``origin`` folds a training loop's batches (``total += loss.item()``): what an
    evaluation loop folds, the evaluation step gathers (or says it cannot), and a stop on it
    is then every rank's."""
    trains = {id(loop.node) for loop in ctx.model.loops if loop.trains}
    loop = origin if isinstance(origin, cst.For) else ctx.model.index.enclosing_loop(origin)
    return loop is not None and id(loop) in trains


_DONE = {
    cst.Break: "per-process stop made collective",
    cst.Continue: "per-process skip (continue) made collective",
    cst.Return: "per-process return made collective",
}


def _make_collective(
    ctx: Context, if_node: cst.If, stop: cst.Break | cst.Continue | cst.Return
) -> None:
    check_after = _branch_around(ctx, if_node, stop)
    if check_after is False:
        ctx.review_at(
            if_node,
            "this stop is decided on a value each rank computed for itself, inside a branch "
            "the ranks may take differently, with more code after it in that branch: left as "
            "it is (a check_trigger() there would be reached by some ranks only: a hang); "
            "reduce the value first (accelerator.reduce(..., 'mean')) so every rank decides "
            "alike",
        )
        return
    told = _told_where_the_flag_is_set(ctx, if_node, stop) if check_after is None else []
    flag = _flag_read_after_the_loop(ctx, if_node, stop) if check_after is None else None
    ctx.plan.add(
        *collective_stop(if_node, ctx.acc, check_after, told, flag),
        line=ctx.line(if_node),
        text=f"{_DONE[type(stop)]}: set_trigger() / check_trigger()"
        + "".join(
            f"; the print of line {ctx.line(line)} moved under the check (said when any rank stops)"
            for line in told
        )
        + (
            f"; {flag} set under the check, so what reads it after the loop reads every "
            "rank's decision"
            if flag
            else ""
        ),
    )
    ctx.need(if_node)


def _told_where_the_flag_is_set(
    ctx: Context, if_node: cst.If, stop: cst.CSTNode
) -> list[cst.BaseStatement]:
    """``if early_stop: break`` on a flag set, in the statement just before it, by this rank's
    own test (``if counter >= patience: print("early stopping"); early_stop = True``): the
    prints beside that ``early_stop = True`` say the stop happens, and left there only the main
    process's decision would say it. They move to the collective check, run once when any rank
    decided, at the same point of the output on one process: nothing else in that statement
    prints, and they read nothing it binds (the text is the one the original printed). The
    flag is set nowhere else in the loop. Empty when any of that does not hold."""
    test = if_node.test
    loop = ctx.model.index.enclosing_loop(if_node)
    block = ctx.model.parent(if_node)
    if not isinstance(stop, cst.Break) or not isinstance(test, cst.Name) or loop is None:
        return []
    if not isinstance(block, cst.IndentedBlock) or block.body[0] is if_node:
        return []
    before = block.body[list(block.body).index(if_node) - 1]
    flag = test.value
    sets = [
        node
        for node in walk(loop)
        if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign))
        and flag in _bound_names(node)
    ]
    if len(sets) != 1 or not ctx.model.inside(sets[0], before):
        return []
    assign = sets[0]
    if not (
        isinstance(assign, cst.Assign)
        and isinstance(assign.value, cst.Name)
        and assign.value.value == "True"
    ):
        return []
    line = ctx.model.parent(assign)
    holder = ctx.model.parent(line) if line is not None else None
    if not isinstance(holder, cst.IndentedBlock):
        return []
    told = [s for s in holder.body if is_print_alone(s)]
    prints = [n for n in walk(before) if isinstance(n, cst.Call) and _calls_print(n)]
    if not told or len(prints) != len(told):
        return []
    bound = set().union(*(_bound_names(n) for n in walk(before)))
    read = {n.value for s in told for n in walk(s) if isinstance(n, cst.Name)}
    if read & bound:
        return []
    return told


def _flag_read_after_the_loop(ctx: Context, if_node: cst.If, stop: cst.CSTNode) -> str | None:
    """``if stop: break`` on a flag this rank's own test sets (``stop = True``, only ever True
    in the loop, and only before the ``if``), read again after the loop (``if stop:
    print("stopped early")``): left as it is, a rank that leaves because another decided keeps
    its own False and reports a run to the end. Setting it under the collective check makes it
    every rank's decision; on one process the check holds exactly when the flag does."""
    test = if_node.test
    loop = ctx.model.index.enclosing_loop(if_node)
    if not isinstance(stop, cst.Break) or loop is None:
        return None
    if isinstance(test, cst.Subscript):
        return _entry_flag_read_after_the_loop(ctx, if_node, loop, test)
    if not isinstance(test, cst.Name):
        return None
    flag = test.value
    sets = [
        node
        for node in walk(loop)
        if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.NamedExpr, cst.For))
        and flag in _bound_names(node) | _other_bound_names(node)
    ]
    start = _at(ctx.model.position(if_node).start)
    if not sets or any(
        not (
            isinstance(node, cst.Assign)
            and isinstance(node.value, cst.Name)
            and node.value.value == "True"
        )
        or _at(ctx.model.position(node).end) >= start
        for node in sets
    ):
        return None
    scope = ctx.model.index.enclosing_function(loop) or ctx.model.module
    end = _at(ctx.model.position(loop).end)
    read_after = any(
        isinstance(node, cst.Name)
        and node.value == flag
        and _at(ctx.model.position(node).start) >= end
        for node in walk(scope)
    )
    return flag if read_after else None


def _entry_flag_read_after_the_loop(
    ctx: Context, if_node: cst.If, loop: cst.For | cst.While, test: cst.Subscript
) -> str | None:
    """``if state["stop"]: break`` on a flag kept in a dict entry under a constant key, read
    again after the loop: as `_flag_read_after_the_loop` for a name. In the loop the entry is
    only set to True before the ``if``, and the container itself is neither rebound nor
    changed through a method (``state.update(...)``), which could set the entry unseen."""
    container = test.value
    if not isinstance(container, cst.Name) or len(test.slice) != 1:
        return None
    index = test.slice[0].slice
    if not (isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString)):
        return None
    flag = ctx.code(test)
    start = _at(ctx.model.position(if_node).start)
    sets = 0
    for node in walk(loop):
        if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.NamedExpr, cst.For)):
            targets = (
                [t.target for t in node.targets]
                if isinstance(node, cst.Assign)
                else [getattr(node, "target", None)]
            )
            rebinds = container.value in _other_bound_names(node) or any(
                isinstance(n, cst.Name) and n.value == container.value
                for t in targets
                if isinstance(t, (cst.Name, cst.Tuple, cst.List))
                for n in walk(t)
            )
            if rebinds:
                return None
            touched = [
                t
                for t in targets
                if isinstance(t, cst.Subscript)
                and isinstance(t.value, cst.Name)
                and t.value.value == container.value
            ]
            if not touched:
                continue
            if not (
                isinstance(node, cst.Assign)
                and all(ctx.code(t) == flag for t in touched)
                and isinstance(node.value, cst.Name)
                and node.value.value == "True"
                and _at(ctx.model.position(node).end) < start
            ):
                return None
            sets += 1
        elif (
            isinstance(node, cst.Attribute)
            and isinstance(node.value, cst.Name)
            and node.value.value == container.value
        ):
            return None
    if not sets:
        return None
    scope = ctx.model.index.enclosing_function(loop) or ctx.model.module
    end = _at(ctx.model.position(loop).end)
    read_after = any(
        isinstance(node, cst.Subscript)
        and ctx.code(node) == flag
        and _at(ctx.model.position(node).start) >= end
        for node in walk(scope)
    )
    return flag if read_after else None


def _at(position: CodePosition) -> tuple[int, int]:
    return position.line, position.column


def _other_bound_names(node: cst.CSTNode) -> set[str]:
    """The plain names a walrus or a loop's target binds."""
    target = node.target if isinstance(node, (cst.NamedExpr, cst.For)) else None
    return {n.value for n in walk(target) if isinstance(n, cst.Name)} if target else set()


def _bound_names(node: cst.CSTNode) -> set[str]:
    """The plain names an assignment (``=``, ``+=``, annotated) binds."""
    if isinstance(node, cst.Assign):
        targets = [t.target for t in node.targets]
    elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
        targets = [node.target]
    else:
        return set()
    return {n.value for t in targets for n in walk(t) if isinstance(n, cst.Name)}


def _calls_print(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Name) and call.func.value == "print"


def _branch_around(
    ctx: Context, if_node: cst.If, stop: cst.CSTNode
) -> cst.BaseStatement | Literal[False] | None:
    """Where the collective check goes when it cannot follow ``if_node``: ``if loss < best:
    ... else: bad += 1; if bad >= patience: break`` on this rank's loss sends the ranks into
    different branches, and a check inside one is reached by some ranks only. The check then
    follows the whole branch (the first ``if`` of its chain), which is the same program on one
    process only when nothing in the branch runs after the stop (False otherwise: left alone).
    None: no such branch, the check follows ``if_node``. A ``return`` leaves its function: the
    branch is looked for up to it."""
    model = ctx.model
    if isinstance(stop, cst.Return):
        within: cst.CSTNode | None = model.index.enclosing_function(if_node)
    else:
        within = model.index.enclosing_loop(if_node)
    branch = ctx.facts.ranks.divergent_branch(if_node, within=within)
    if branch is None or within is None:
        return None
    node: cst.CSTNode = if_node
    while node is not branch:
        parent = model.parent(node)
        if isinstance(parent, (cst.IndentedBlock, cst.Module)) and parent.body[-1] is not node:
            return False  # code after the stop in the branch: moving the check would skip it
        node = parent
    while isinstance(model.parent(branch), cst.If):  # an ``elif``: its chain's first ``if``
        branch = model.parent(branch)
    return branch
