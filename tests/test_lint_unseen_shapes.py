"""Shapes found by reading real Accelerate trainers nobody here had seen (issue 19): where a
finding says the other ranks wait, and what it leaves alone."""

from __future__ import annotations

from test_lint_rules import lint

from accelify.rules.exit_on_some_ranks import EXIT_BEFORE_THE_BARRIER, EXIT_IN_THE_BATCH_LOOP


def test_an_exit_names_the_barrier_the_others_reach_next_not_the_next_epochs_backward():
    [finding] = [f for f in lint(EXIT_BEFORE_THE_BARRIER, "ACC210").findings]
    assert (finding.line, finding.code) == (9, "ACC210")
    assert "collective at line 11" in finding.message, finding.message


def test_an_exit_in_the_batch_loop_names_the_next_batchs_backward_not_the_evaluation():
    """trial17: rank 1 exits in the batch loop; the others wait in the next batch's backward
    (the loop's back-edge), not at the gather after the batch loop."""
    [finding] = [f for f in lint(EXIT_IN_THE_BATCH_LOOP, "ACC210").findings]
    assert (finding.line, finding.code) == (8, "ACC210")
    assert "collective at line 6 " in finding.message, finding.message


#: A trainer base class (lintreal44, read_file id 29176862081) that sizes its scheduler from the
#: loader before its constructor prepares it, keeping the size on the instance, and builds the
#: scheduler in a method.
TRAINER_SIZING_ITS_SCHEDULER_ON_THE_INSTANCE = (
    "import math\n"
    "from accelerate import Accelerator\n"
    "from transformers import get_scheduler\n"
    "\n"
    "\n"
    "class BaseTrainTool:\n"
    "    def __init__(self, config, model, optimizer, loader):\n"
    "        self.config = config\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model, self.optimizer, self.train_dataloader = model, optimizer, loader\n"
    "        self.steps_per_epoch = math.ceil(len(self.train_dataloader) / 2)\n"
    '        self.config["max_train_steps"] = self.config["epochs"] * self.steps_per_epoch\n'
    "        self.lr_scheduler = self.init_lr_scheduler()\n"
    "        self.model, self.optimizer, self.train_dataloader = self.accelerator.prepare(\n"
    "            self.model, self.optimizer, self.train_dataloader)\n"
    "\n"
    "    def init_lr_scheduler(self):\n"
    "        lr_scheduler = get_scheduler(\n"
    '            "linear", self.optimizer, 0, self.config["max_train_steps"])\n'
    "        return lr_scheduler\n"
    "\n"
    "    def train_epoch(self):\n"
    "        for batch in self.train_dataloader:\n"
    "            self.accelerator.backward(self.model(**batch).loss)\n"
    "            self.optimizer.step()\n"
    "            self.lr_scheduler.step()\n"
    "            self.optimizer.zero_grad()\n"
)


def test_a_scheduler_sized_on_the_instance_before_prepare_names_the_len_that_sized_it():
    """The size reaches the scheduler through ``self.config["max_train_steps"]`` and the method
    that builds it; the finding names the ``len()`` of the unprepared loader, not a bare
    'unprepared'."""
    [finding] = lint(TRAINER_SIZING_ITS_SCHEDULER_ON_THE_INSTANCE, "ACC401").findings
    assert (finding.line, finding.code) == (26, "ACC401")
    assert "sized from len(self.train_dataloader) at line 11" in finding.message, finding.message


#: conformer-VC's trainer (lintreal44): the validation runs on the main process only, and is
#: handed the SummaryWriter made there (None on the other ranks), which it writes to.
VALIDATION_HANDED_THE_MAIN_PROCESS_WRITER = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "\n"
    "\n"
    "class Trainer:\n"
    "    def run(self, model, optimizer, loader, valid_loader):\n"
    "        accelerator = Accelerator()\n"
    "        if accelerator.is_main_process:\n"
    "            writer = SummaryWriter('logs')\n"
    "        else:\n"
    "            writer = None\n"
    "        model, optimizer, loader, valid_loader = accelerator.prepare(\n"
    "            model, optimizer, loader, valid_loader)\n"
    "        for epoch in range(3):\n"
    "            for x, y in loader:\n"
    "                accelerator.backward(model(x, y))\n"
    "                optimizer.step()\n"
    "            if accelerator.is_main_process:\n"
    "                self.valid_step(epoch, model, valid_loader, writer)\n"
    "\n"
    "    def valid_step(self, epoch, model, loader, writer):\n"
    "        losses = []\n"
    "        with torch.no_grad():\n"
    "            for x, y in loader:\n"
    "                losses.append(model(x, y).item())\n"
    "        writer.add_scalar('valid/loss', sum(losses) / len(losses), epoch)\n"
)


def test_an_evaluation_run_on_main_only_is_told_to_keep_the_writer_it_is_handed_there():
    """Called on every rank as ACC403 advises, the validation would crash on the other ranks'
    None writer: the advice says to keep its use under the main-process test."""
    [finding] = lint(VALIDATION_HANDED_THE_MAIN_PROCESS_WRITER, "ACC403").findings
    assert (finding.line, finding.code) == (25, "ACC403")
    assert "Run this evaluation on every rank" in finding.message, finding.message
    assert (
        "`writer` is set only on the ranks that pass the test at line 8 (line 9), so keep the "
        "evaluation's uses of it (line 26) under `if accelerator.is_main_process:`"
    ) in finding.message, finding.message


def test_an_evaluation_run_on_main_only_handed_every_ranks_values_gets_no_writer_note():
    code = VALIDATION_HANDED_THE_MAIN_PROCESS_WRITER.replace(
        "        if accelerator.is_main_process:\n            writer = SummaryWriter('logs')\n"
        "        else:\n            writer = None\n",
        "        writer = SummaryWriter('logs')\n",
    )
    [finding] = lint(code, "ACC403").findings
    assert "Run this evaluation on every rank" in finding.message, finding.message
    assert "writer" not in finding.message, finding.message


#: Loaders a factory returns as a tuple, kept whole and read by index (convfix41): prepare hands
#: a tuple back as it is, so the advice prepares its loaders, and a prepared tuple is no finding.
LOADER_TUPLE_READ_BY_INDEX = (
    "import torch\n"
    "from torch.utils.data import DataLoader\n"
    "from accelify import Accelerator\n"
    "\n"
    "\n"
    "def build_data():\n"
    "    train_loader = DataLoader(range(8))\n"
    "    val_loader = DataLoader(range(4))\n"
    "    return train_loader, val_loader\n"
    "\n"
    "\n"
    "def main():\n"
    "    accelerator = Accelerator()\n"
    "    data = build_data()\n"
    "    model = torch.nn.Linear(1, 1)\n"
    "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "    model, opt = accelerator.prepare(model, opt)\n"
    "    for x in data[0]:\n"
    "        loss = model(x.float().view(1, 1)).sum()\n"
    "        accelerator.backward(loss)\n"
    "        opt.step()\n"
)


def test_a_tuple_of_loaders_left_unprepared_is_told_to_prepare_its_loaders_not_the_tuple():
    [finding] = lint(LOADER_TUPLE_READ_BY_INDEX, "ACC401").findings
    assert finding.line == 18, finding
    assert "`data = accelerator.prepare(*data)`" in finding.message, finding.message
    prepared = LOADER_TUPLE_READ_BY_INDEX.replace(
        "    data = build_data()\n",
        "    data = build_data()\n    data = accelerator.prepare(*data)\n",
    )
    assert not lint(prepared, "ACC401").findings
