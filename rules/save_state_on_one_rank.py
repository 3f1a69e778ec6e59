from collections.abc import Iterator

from accelify.analysis.collectives import backends_in_view, runtime_of
from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import Example, Finding, Rule

_HF = "from accelerate import Accelerator\naccelerator = Accelerator()\n"


class SaveStateOnOneRank(Rule):
    """``accelerator.save_state`` under a main-process guard in a DDP script. Under HF
    Accelerate's DDP it is not a collective, so nothing hangs; but each rank saves its own RNG
    state (``random_states_<rank>.pkl``) in ``save_state``, so a checkpoint written by the main
    process alone resumes the other ranks with fresh random streams (different shuffling,
    dropout and augmentation than the uninterrupted run). Under FSDP and DeepSpeed the same
    guard hangs (ACC202); on accelify's runtime too.

    Which engine runs is chosen at launch (``accelerate launch --config_file ...``, or the
    user's default config under ``~/.cache/huggingface/accelerate``): a config the script never
    names is no file a per-file lint can see, so where the script names no engine ACC202
    cannot claim a hang and this rule does not claim there is none: its advice (the call on
    every rank) is right on every engine, and says so."""

    code = "ACC206"
    name = "save-state-on-one-rank"
    message = (
        "Call save_state on every rank: it saves each rank's RNG state, so from the main process "
        "alone the other ranks resume with fresh random state; and where the run is launched "
        "with DeepSpeed or FSDP (a launch config, which this file does not name, chooses), "
        "save_state is a collective and this guard hangs the run"
    )
    why = "Each rank's random state is saved by that rank's own save_state call."
    opt_in = (
        "the documented idiom of Accelerate's and diffusers' examples: weights, optimizer and "
        "the main process's RNG state are saved; only the other ranks' random streams differ "
        "after a resume (where save_state is a collective, the same guard is a hang: ACC202, "
        "in the default set)"
    )
    bad = (
        Example(
            _HF + "if accelerator.is_main_process:\n    accelerator.save_state('ckpt')\n", 4, 5
        ),
        # a trainer's checkpoint method under PartialState's decorator: the main process only
        Example(
            _HF
            + "from accelerate.state import PartialState\nstate = PartialState()\n\n\n"
            + "class Model:\n    @state.on_main_process\n    def save_state(self, path):\n"
            + "        accelerator.save_state(path)\n",
            10,
            9,
        ),
    )
    good = (
        _HF + "accelerator.save_state('ckpt')\n",
        # launched with a DeepSpeed config: a hang there, ACC202's (in the default set)
        '"""Run: accelerate launch --config_file ds_zero3.yaml train.py"""\n'
        + _HF
        + "if accelerator.is_main_process:\n    accelerator.save_state('ckpt')\n",
        _HF + "if accelerator.is_main_process:\n    accelerator.save_model(model, 'out')\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        if runtime_of(script) != "hf":
            return  # on accelify's runtime save_state is a collective everywhere: ACC202
        in_view = backends_in_view(script)
        facts = facts_of(script)
        for use in facts.collective_uses:
            if use.through_helper or not (dotted(use.call.func) or "").endswith(".save_state"):
                continue
            if use.skipped_on & in_view:
                continue  # a hang on a backend the script names: ACC202
            if not facts.ranks.backend_guards.agreed_on(use.call):
                # a plain rank guard; one that lets every rank in on some backend
                # (``or distributed_type == DEEPSPEED``) is a deliberate choice
                yield self.finding(script, use.call)
