"""Files the ranks share, as the analysis sees them: which loads read what the main process
saved, which paths are another file on every process, which statements download data; and the
plan edit that runs statements inside a ``with`` block."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import ScriptModel, analyze
from accelify.edits.apply import ApplyPlan
from accelify.edits.plan import Plan, statement

HEAD = "import os, tempfile, time, urllib.request\nimport torch\nfrom torchvision import datasets\n"


def script(body: str) -> ScriptModel:
    return analyze(cst.parse_module(HEAD + textwrap.dedent(body)))


def code(model: ScriptModel, node: cst.CSTNode) -> str:
    return model.module.code_for_node(node).strip()


def read_back(body: str) -> list[tuple[str, str]]:
    model = script(body)
    return [
        (code(model, shared.write), code(model, shared.read))
        for shared in facts_of(model).shared_files.read_back
    ]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            "torch.save(m.state_dict(), 'best.pt')\nm.load_state_dict(torch.load('best.pt'))\n",
            [("torch.save(m.state_dict(), 'best.pt')", "torch.load('best.pt')")],
            id="same-literal",
        ),
        pytest.param(
            "path = os.path.join(out, 'best.pt')\ntorch.save(m, os.path.join(out, 'best.pt'))\n"
            "m = torch.load(path)\n",
            [("torch.save(m, os.path.join(out, 'best.pt'))", "torch.load(path)")],
            id="name-assigned-once",
        ),
        pytest.param(
            "def load(m, p):\n    m.load_state_dict(torch.load(p))\n"
            "def main(m):\n    torch.save(m.state_dict(), 'w.pt')\n    load(m, 'w.pt')\n",
            [("torch.save(m.state_dict(), 'w.pt')", "torch.load(p)")],
            id="helper-parameter",
        ),
        pytest.param(
            "def save(m, path):\n    torch.save(m.state_dict(), path)\n"
            "def load(m, path):\n    m.load_state_dict(torch.load(path))\n",
            [],
            id="two-helpers-parameters-of-one-name",
        ),
        pytest.param(
            "def main(m):\n    m.load_state_dict(torch.load('w.pt'))\n"
            "    torch.save(m.state_dict(), 'w.pt')\n",
            [],
            id="resumed-before-the-save",
        ),
        pytest.param(
            "def main(m):\n    for epoch in range(3):\n"
            "        m.load_state_dict(torch.load('w.pt'))\n"
            "        torch.save(m.state_dict(), 'w.pt')\n",
            [("torch.save(m.state_dict(), 'w.pt')", "torch.load('w.pt')")],
            id="read-in-the-next-iteration",
        ),
        pytest.param(
            "torch.save(m.state_dict(), 'a.pt')\nm.load_state_dict(torch.load('b.pt'))\n",
            [],
            id="another-file",
        ),
        pytest.param(
            "with open('log.json', 'w') as f:\n    f.write('{}')\nlog = open('log.json').read()\n",
            [("open('log.json', 'w')", "open('log.json')")],
            id="opened-for-writing",
        ),
        pytest.param(
            "def make():\n    for path, n in (('a.txt', 3), ('b.txt', 2)):\n"
            "        with open(path, 'w') as f:\n            f.write('x' * n)\n"
            "def read(p):\n    return open(p).read()\n"
            "make()\nb = read('b.txt')\n",
            [("open(path, 'w')", "open(p)")],
            id="written-in-a-loop-over-listed-tuples",
        ),
        pytest.param(
            "FILES = {'train': 'a.txt', 'val': 'b.txt'}\n"
            "for name, path in FILES.items():\n    torch.save(name, path)\n"
            "val = torch.load('b.txt')\n",
            [("torch.save(name, path)", "torch.load('b.txt')")],
            id="written-in-a-loop-over-a-dicts-items",
        ),
        pytest.param(
            "for path in ['a.txt', 'b.txt']:\n    torch.save(1, path)\nc = torch.load('c.txt')\n",
            [],
            id="written-in-a-loop-over-other-files",
        ),
        pytest.param(
            "def make(paths):\n    for path in paths:\n        torch.save(1, path)\n"
            "make(['a.txt'])\nc = torch.load('a.txt')\n",
            [("torch.save(1, path)", "torch.load('a.txt')")],
            id="written-in-a-loop-over-what-the-caller-hands",
        ),
    ],
)
def test_a_load_is_paired_with_the_save_of_its_file(body: str, expected: list[tuple[str, str]]):
    assert read_back(body) == expected


_STOPPER = """
class EarlyStopping:
    def __init__(self, patience=3, path="checkpoint.pt"):
        self.path = path

    def __call__(self, model):
        torch.save(model.state_dict(), self.path)


class Trainer:
    def __init__(self, cfg):
        self.best_path = os.path.join(cfg["ckpt_dir"], "best.pt")
        self.stopper = {stopper}
        self.best_path = os.path.join(cfg["ckpt_dir"], "best.pt")

    def fit(self, model):
        for epoch in range(3):
            self.stopper(model)
{inside}

CFG = {{"ckpt_dir": "checkpoints"}}


def main(model):
    trainer = Trainer(CFG)
    trainer.fit(model)
    model.load_state_dict(torch.load({read}))
"""


def _stopper(stopper: str, read: str, inside: str = "") -> list[tuple[str, str, bool]]:
    model = script(_STOPPER.format(stopper=stopper, read=read, inside=inside))
    return [
        (code(model, shared.write), code(model, shared.read), shared.unsure)
        for shared in facts_of(model).shared_files.read_back
    ]


_SAVE = "torch.save(model.state_dict(), self.path)"


@pytest.mark.parametrize(
    ("stopper", "read", "expected"),
    [
        pytest.param(  # the instance's attribute is the one its class set (twice, alike)
            "EarlyStopping(path=self.best_path)",
            "trainer.best_path",
            [(_SAVE, "torch.load(trainer.best_path)", False)],
            id="through-the-instance",
        ),
        pytest.param(  # a module dict's constant entry spells the literal the script reads
            "EarlyStopping(path=self.best_path)",
            "'checkpoints/best.pt'",
            [(_SAVE, "torch.load('checkpoints/best.pt')", False)],
            id="dict-entry-is-the-literal",
        ),
        pytest.param(  # the default the constructor falls back on
            "EarlyStopping(patience=2)",
            "'checkpoint.pt'",
            [(_SAVE, "torch.load('checkpoint.pt')", False)],
            id="constructor-default",
        ),
        pytest.param(  # another file the file spells: no pair
            "EarlyStopping(patience=2)",
            "'pretrained.pt'",
            [],
            id="another-spelled-file",
        ),
        pytest.param(  # handed its path unpacked: the read after the loop may be of it
            "EarlyStopping(**cfg['stopping'])",
            "'pretrained.pt'",
            [(_SAVE, "torch.load('pretrained.pt')", True)],
            id="unpacked-path-unsure",
        ),
    ],
)
def test_a_path_is_followed_through_a_helper_objects_constructor(stopper, read, expected):
    assert _stopper(stopper, read) == expected


def test_a_read_inside_the_loop_that_saves_to_an_unknown_path_is_not_paired():
    """Only a read once the saving loop is done may be of the file just saved: one in the
    same loop (before or after the save) is left as the script has it."""
    inside = "            model.load_state_dict(torch.load('teacher.pt'))"
    assert _stopper("EarlyStopping(**cfg['stopping'])", "'x.pt'", inside=inside) == [
        (_SAVE, "torch.load('x.pt')", True)
    ]


@pytest.mark.parametrize(
    ("body", "source", "clock"),
    [
        pytest.param(
            "with tempfile.TemporaryDirectory() as tmp:\n"
            "    p = os.path.join(tmp, 'w.pt')\n    torch.save(m, p)\n    torch.load(p)\n",
            "tempfile.TemporaryDirectory()",
            False,
            id="temporary-directory",
        ),
        pytest.param(
            "p = f'w-{os.getpid()}.pt'\ntorch.save(m, p)\ntorch.load(p)\n",
            "os.getpid()",
            False,
            id="pid",
        ),
        pytest.param(
            "stamp = int(time.time())\np = f'w-{stamp}.pt'\ntorch.save(m, p)\ntorch.load(p)\n",
            "time.time()",
            True,
            id="timestamp",
        ),
        pytest.param("torch.save(m, 'w.pt')\ntorch.load('w.pt')\n", None, None, id="one-path"),
    ],
)
def test_a_path_made_per_process_is_told_apart(body, source, clock):
    model = script(body)
    (shared,) = facts_of(model).shared_files.read_back
    found = shared.per_process
    assert (code(model, found.source) if found else None) == source
    assert (found.clock if found else None) == clock


def downloads(body: str) -> list[tuple[str, bool, bool]]:
    model = script(body)
    return [
        (code(model, d.statement).splitlines()[0], d.divergent is not None, d.with_shared_work)
        for d in facts_of(model).shared_files.downloads
    ]


def test_a_download_widens_to_the_check_around_it():
    body = (
        "if not os.path.exists('data'):\n"
        "    os.makedirs('data')\n"
        "    urllib.request.urlretrieve(URL, 'data/x.zip')\n"
        "train = datasets.MNIST('data', download=True)\n"
        "test = datasets.MNIST('data', download=False)\n"
    )
    assert downloads(body) == [
        ("if not os.path.exists('data'):", False, False),
        ("train = datasets.MNIST('data', download=True)", False, False),
    ]


def test_a_helper_that_downloads_is_a_download_at_its_call_sites():
    body = (
        "def fetch(root):\n    urllib.request.urlretrieve(URL, root)\n    return root\n"
        "def main(model):\n    folder = fetch('data')\n    model(folder).backward()\n"
    )
    assert downloads(body) == [("folder = fetch('data')", False, False)]


def test_a_helper_that_also_trains_is_not_a_download_helper():
    body = (
        "def fit(model):\n    data = datasets.MNIST('d', download=True)\n"
        "    model(data).backward()\n"
        "def main(model):\n    fit(model)\n"
    )
    assert downloads(body) == [("data = datasets.MNIST('d', download=True)", False, False)]


def test_a_download_in_a_branch_the_ranks_may_disagree_on_is_marked():
    body = (
        "def main(model, loss):\n"
        "    if loss.item() < 0.1:\n"
        "        extra = datasets.MNIST('d', download=True)\n"
        "        model(extra).backward()\n"
    )
    assert downloads(body) == [("extra = datasets.MNIST('d', download=True)", True, False)]


def test_a_download_under_a_rank_guard_is_the_script_s_own_arrangement():
    body = "if rank == 0:\n    datasets.MNIST('d', download=True)\n"
    assert downloads(body) == []


def test_consecutive_statements_in_one_context_share_one_with_block():
    module = cst.parse_module("a = 1\nb = 2\nc = 3\nd = 4\n")
    plan = Plan()
    first, second, _, fourth = module.body
    for node in (first, second, fourth):
        plan.wrap_in(node, "acc.main_process_first()", 1, "wrapped")
    assert module.visit(ApplyPlan(plan)).code == (
        "with acc.main_process_first():\n    a = 1\n    b = 2\nc = 3\n"
        "with acc.main_process_first():\n    d = 4\n"
    )


def test_a_guarded_statement_is_not_also_wrapped():
    module = cst.parse_module("a = 1\n")
    plan = Plan()
    plan.guard(module.body[0], "acc.is_main_process", 1, "guarded")
    plan.wrap_in(module.body[0], "acc.main_process_first()", 1, "wrapped")
    assert module.visit(ApplyPlan(plan)).code == "if acc.is_main_process:\n    a = 1\n"
    assert [note.text for note in plan.reviews] == [
        "left as is: already run under `if acc.is_main_process:`"
    ]


def test_the_same_statement_is_not_inserted_twice_at_one_place():
    module = cst.parse_module("a = 1\n")
    plan = Plan()
    plan.insert_before(module.body[0], statement("acc.wait_for_everyone()"))
    plan.insert_before(module.body[0], statement("acc.wait_for_everyone()"))
    assert module.visit(ApplyPlan(plan)).code == "acc.wait_for_everyone()\na = 1\n"


def test_a_method_called_in_a_branch_the_ranks_may_disagree_on_runs_under_it():
    body = (
        "class Trainer:\n"
        "    def load_best(self):\n        self.model.load_state_dict(torch.load('b.pt'))\n"
        "    def fit(self, total):\n"
        "        if total < self.best:\n            self.load_best()\n"
        "        self.load_best()\n"
    )
    model = script(body)
    files = facts_of(model).shared_files
    read = next(c for c in model.calls if code(model, c) == "torch.load('b.pt')")
    branch = files.divergent_around(read)
    assert branch is not None and code(model, branch.test) == "total < self.best"


def cache_builds(body: str) -> list[tuple[str, str, bool]]:
    model = script(body)
    return [
        (code(model, cache.read), code(model, cache.write), cache.with_shared_work)
        for cache in facts_of(model).shared_files.cache_builds
    ]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            "if os.path.exists('v.pt'):\n    v = torch.load('v.pt')\n"
            "else:\n    v = torch.ones(3)\n    torch.save(v, 'v.pt')\n",
            [("torch.load('v.pt')", "torch.save(v, 'v.pt')", False)],
            id="read-if-there-else-built",
        ),
        pytest.param(
            "if not os.path.isfile('v.pt'):\n    v = torch.ones(3)\n    torch.save(v, 'v.pt')\n"
            "else:\n    v = torch.load('v.pt')\n",
            [("torch.load('v.pt')", "torch.save(v, 'v.pt')", False)],
            id="negated-test",
        ),
        pytest.param(
            "if os.path.exists('v.pt'):\n    v = torch.load('w.pt')\n"
            "else:\n    v = torch.ones(3)\n    torch.save(v, 'v.pt')\n",
            [],
            id="another-file-read",
        ),
        pytest.param(
            "if os.path.exists('v.pt'):\n    v = torch.load('v.pt')\n",
            [],
            id="nothing-built",
        ),
    ],
)
def test_a_file_read_if_there_and_else_built_is_a_cache_build(body, expected):
    assert cache_builds(body) == expected


def test_a_build_that_trains_does_shared_work():
    body = (
        "if os.path.exists('m.pt'):\n    m.load_state_dict(torch.load('m.pt'))\n"
        "else:\n    loss = m(x).sum()\n    loss.backward()\n"
        "    torch.save(m.state_dict(), 'm.pt')\n"
    )
    assert [shared for _, _, shared in cache_builds(body)] == [True]


def test_a_cache_written_with_torch_save_is_saved_behind_a_barrier():
    model = script(
        "if os.path.exists('v.pt'):\n    v = torch.load('v.pt')\n"
        "else:\n    v = torch.ones(3)\n    torch.save(v, 'v.pt')\n"
    )
    builds = facts_of(model).shared_files.cache_builds
    assert [b.saved_behind_a_barrier for b in builds] == [True]


_TESTER = """
class Tester:
    def test(self):
        path = os.path.join(self.out, "preds.pt")
        torch.save(self.rows, path)
        return path


def main():
    t = Tester()
    rows = torch.load(t.test())
    {guarded}
"""


def test_a_read_of_the_path_its_own_statement_gets_back_waits_where_it_is_returned():
    """``torch.load(t.test())``: the read's statement runs the write, so the wait goes before
    ``test()``'s ``return``; not where some call of ``test()`` runs on one rank only (a barrier
    there would wait for ranks that never get to it)."""
    model = script(_TESTER.format(guarded="pass"))
    (shared,) = facts_of(model).shared_files.read_back
    assert shared.returned_at is not None and code(model, shared.returned_at) == "return path"
    guarded = script(_TESTER.format(guarded="if int(os.environ['RANK']) == 0: t.test()"))
    assert facts_of(guarded).shared_files.read_back == []


def test_an_entry_of_a_dict_written_out_is_the_path_it_holds():
    saved_by_entry = """
    out = "runs"
    paths = {"ckpt": os.path.join(out, "best.pt"), "log": "log.txt"}
    torch.save(m.state_dict(), paths["ckpt"])
    m.load_state_dict(torch.load(os.path.join(out, "best.pt")))
    """
    assert read_back(saved_by_entry) == [
        ('torch.save(m.state_dict(), paths["ckpt"])', 'torch.load(os.path.join(out, "best.pt"))')
    ]
    assert read_back(saved_by_entry.replace('paths["ckpt"]', 'paths["log"]')) == []
