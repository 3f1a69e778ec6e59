from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.rank_local_loops import RankLocalLoop, rank_local_loops
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_name

#: A REINFORCE-style trainer: one episode per pass of the epoch loop; ``{loop}`` plays it.
_EPISODES = (
    HEADER
    + "import torch\n"
    + "policy, optimizer = accelerator.prepare(policy, optimizer)\n"
    + "env = make_env(seed=accelerator.process_index)\n"
    + "for episode in range(100):\n"
    + "    obs = env.reset()\n"
    + "{loop}"
)
_PLAYED = (
    "    done = False\n"
    + "    while not done:\n"
    + "        logits = policy(torch.as_tensor(obs))\n"
    + "        action = torch.distributions.Categorical(logits=logits).sample()\n"
    + "        obs, reward, done, info = env.step(action.item())\n"
    + "        loss = -reward * logits.log_softmax(-1)[action]\n"
    + "        accelerator.backward(loss)\n"
    + "        optimizer.step()\n"
    + "        optimizer.zero_grad()\n"
)

#: An early-stopping object (it sets its flag once the value it is handed stops improving)
#: driving the epochs: ``{handed}`` is what each epoch hands it.
_STOPPER_LOOP = (
    HEADER
    + "import torch\n\n\n"
    + "class EarlyStopping:\n"
    + "    def __init__(self, patience=3):\n"
    + "        self.patience, self.best, self.counter = patience, 1e9, 0\n"
    + "        self.early_stop = False\n\n"
    + "    def __call__(self, val_loss):\n"
    + "        if val_loss < self.best:\n"
    + "            self.best, self.counter = val_loss, 0\n"
    + "        else:\n"
    + "            self.counter += 1\n"
    + "            if self.counter >= self.patience:\n"
    + "                self.early_stop = True\n\n\n"
    + "model, optimizer, loader, val_loader = accelerator.prepare(\n"
    + "    model, optimizer, loader, val_loader\n)\n"
    + "stopper = EarlyStopping(patience=5)\n"
    + "while not stopper.early_stop:\n"
    + "    for x, y in loader:\n"
    + "        accelerator.backward(loss_fn(model(x), y))\n"
    + "        optimizer.step()\n"
    + "        optimizer.zero_grad()\n"
    + "    val_loss = 0.0\n"
    + "    with torch.no_grad():\n"
    + "        for x, y in val_loader:\n"
    + "            val_loss += loss_fn(model(x), y).item()\n"
    + "    stopper({handed})\n"
)


class LoopCountPerRank(Rule):
    """A ``while`` loop whose test reads a value each rank computes from its own data (an
    environment's ``done`` from ``env.step``, ``len(buffer)`` of this rank's rollouts), with a
    backward or another collective in its body (directly or through a function of the file):
    each rank makes its own number of passes, and under DDP each ``accelerator.backward`` is a
    gradient all-reduce. The rank whose episode ends first leaves the loop; the others wait in
    their next all-reduce for it (a hang) or meet its next collective instead (gradients of
    different steps averaged). Decide the loop's end on every rank together (reduce the flag
    each pass), or collect this rank's episode first with no backward and train on it for a
    number of steps every rank agrees on. Counters, settings, flags made from them or from a
    reduced value, and a prepared DataLoader's batches (the same count on every rank) are no
    such test."""

    code = "ACC215"
    name = "loop-count-per-rank"
    message = (
        "End this loop on every rank together: its test reads a value this rank computes from "
        "its own data, so the ranks make different numbers of passes, each with a collective "
        "(hang)"
    )
    why = "Ranks that loop a different number of times meet different collectives."
    bad = (
        Example(_EPISODES.format(loop=_PLAYED), 9, 5),
        # a buffer this rank fills, trained on while it is short
        Example(
            HEADER
            + "import torch\n"
            + "policy, optimizer = accelerator.prepare(policy, optimizer)\n"
            + "buffer = []\n"
            + "while len(buffer) < 512:\n"
            + "    obs, reward, done, info = env.step(policy(obs).argmax().item())\n"
            + "    if reward > 0:\n"
            + "        buffer.append((obs, reward))\n"
            + "    accelerator.backward(policy(torch.as_tensor(obs)).sum())\n",
            6,
            1,
        ),
        # tokens counted by numel(): a padded batch's token count is each rank's own
        Example(
            HEADER
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "tokens_seen = 0\n"
            + "while tokens_seen < args.max_tokens:\n"
            + "    for batch in loader:\n"
            + "        accelerator.backward(model(**batch).loss)\n"
            + "        optimizer.step()\n"
            + "        tokens_seen += batch['input_ids'].numel()\n",
            5,
            1,
        ),
        # an early-stopping object's flag, set from this rank's validation loss over its shard
        Example(_STOPPER_LOOP.format(handed="val_loss / len(val_loader)"), 24, 1),
    )
    good = (
        # ... handed the loss averaged over the ranks: every rank's stopper stops at one epoch
        _STOPPER_LOOP.format(
            handed="accelerator.reduce(\n"
            "        torch.tensor(val_loss / len(val_loader), device=accelerator.device), 'mean'\n"
            "    ).item()"
        ),
        # one rollout appended on every pass, played with no skip: len() is a counter
        HEADER
        + "import torch\n"
        + "policy, optimizer = accelerator.prepare(policy, optimizer)\n"
        + "rollouts = []\n"
        + "obs = env.reset()\n"
        + "while len(rollouts) < 128:\n"
        + "    with torch.no_grad():\n"
        + "        action = policy(torch.as_tensor(obs)).argmax().item()\n"
        + "    obs, reward, done, info = env.step(action)\n"
        + "    rollouts.append((obs, action, reward))\n"
        + "    mean_reward = accelerator.gather(torch.tensor([reward])).mean()\n",
        # samples counted by a prepared loader's batch size: every rank's batches are as large
        HEADER
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "samples = 0\n"
        + "while samples < 10000:\n"
        + "    for x, y in loader:\n"
        + "        accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "        optimizer.step()\n"
        + "        samples += x.size(0)\n",
        # the same, the batches drawn by hand from the prepared loader
        HEADER
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "it = iter(loader)\n"
        + "step = 0\n"
        + "while step < 1000:\n"
        + "    try:\n"
        + "        batch = next(it)\n"
        + "    except StopIteration:\n"
        + "        it = iter(loader)\n"
        + "        batch = next(it)\n"
        + "    x, y = batch\n"
        + "    accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "    optimizer.step()\n"
        + "    step += len(x)\n",
        # the episode is played with no backward; training runs a count every rank agrees on
        _EPISODES.format(
            loop="    done, transitions = False, []\n"
            + "    while not done:\n"
            + "        with torch.no_grad():\n"
            + "            action = policy(torch.as_tensor(obs)).argmax().item()\n"
            + "        obs, reward, done, info = env.step(action)\n"
            + "        transitions.append((obs, action, reward))\n"
            + "    for step in range(8):\n"
            + "        accelerator.backward(loss_of(policy, transitions))\n"
            + "        optimizer.step()\n"
        ),
        # the end decided on every rank together: the flag reduced each pass
        _EPISODES.format(
            loop=_PLAYED.replace(
                "        optimizer.zero_grad()\n",
                "        optimizer.zero_grad()\n"
                "        done = accelerator.reduce(torch.tensor(float(done)), 'min').item()\n",
            )
            .replace("        obs, reward, done, info", "        obs, reward, ended, info")
            .replace("float(done)", "float(ended)")
        ),
        # the batches of a prepared loader drawn by hand: every rank gets as many
        HEADER
        + "policy, optimizer, loader = accelerator.prepare(policy, optimizer, loader)\n"
        + "batches = iter(loader)\n"
        + "batch = next(batches, None)\n"
        + "while batch is not None:\n"
        + "    accelerator.backward(policy(batch).sum())\n"
        + "    batch = next(batches, None)\n",
        # a counter stepped as ``steps = steps + 1``, resumed from a checkpoint every rank loads
        HEADER
        + "import torch\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "batches = cycle(loader)\n"
        + "steps = 0\n"
        + "if args.resume:\n"
        + "    steps = torch.load(args.resume, map_location='cpu')['steps']\n"
        + "while steps < args.max_steps:\n"
        + "    accelerator.backward(model(next(batches)).sum())\n"
        + "    optimizer.step()\n"
        + "    steps = steps + 1\n",
        # a counter and a flag set from it: every rank runs the same passes
        HEADER
        + "policy, optimizer, loader = accelerator.prepare(policy, optimizer, loader)\n"
        + "step, done = 0, False\n"
        + "while not done:\n"
        + "    for batch in loader:\n"
        + "        accelerator.backward(policy(batch).sum())\n"
        + "        step += 1\n"
        + "        done = step >= args.max_steps\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for found in rank_local_loops(facts_of(script)):
            called = dotted(found.collective.func) or "a collective"
            if found.handed is not None:
                yield self.finding(script, found.loop, message=_object_message(script, found))
                continue
            yield self.finding(
                script,
                found.loop,
                message=(
                    f"End this loop on every rank together: its test reads {found.name}, which "
                    f"this rank computes from its own data (line {script.line(found.binding)}), "
                    f"so the ranks make different numbers of passes, and each pass reaches "
                    f"{called}() (line {script.line(found.collective)}), a collective: the rank "
                    "that leaves first leaves the others waiting in it (hang); reduce the flag "
                    "over the ranks each pass and loop while any rank goes on, or collect this "
                    "rank's data first with no collective and train on it for a number of steps "
                    "every rank agrees on"
                ),
            )


def _object_message(script: ScriptModel, found: RankLocalLoop) -> str:
    """An early-stopping object's flag: the fix is to hand the object a value every rank
    holds alike, so each rank's copy of it sets the flag at the same pass."""
    assert found.handed is not None
    called = dotted(found.collective.func) or "a collective"
    handed = script.module.code_for_node(found.handed)
    call = found.binding
    receiver = script.module.code_for_node(call.func) if isinstance(call, cst.Call) else "it"
    accelerator = accelerator_name(script, found.loop)
    return (
        f"End this loop on every rank together: its test reads {found.name}, set from "
        f"{handed}, which this rank computes from its own shard and hands over at line "
        f"{script.line(found.binding)}, so each rank stops at its own pass, and each pass "
        f"reaches {called}() (line {script.line(found.collective)}), a collective: the rank "
        f"that leaves first leaves the others waiting in it (hang); hand {receiver} the value "
        "averaged "
        f"over the ranks ({accelerator}.reduce(torch.tensor({handed}, "
        f"device={accelerator}.device), 'mean').item()), so every rank's copy decides alike"
    )
