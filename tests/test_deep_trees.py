"""Valid Python nested deeper than the interpreter's default recursion limit (generated code,
a sum of hundreds of terms) is linted and converted like any other file; a failure of ours on
one file is one error line for it, never a traceback, and the other files are still checked."""

from __future__ import annotations

import ast

from conftest import run_accelify

TERMS = 2000


def deep_script(accelerate: bool) -> str:
    names = [f"x{i}" for i in range(TERMS)]
    header = (
        "from accelerate import Accelerator\n\naccelerator = Accelerator()\n" if accelerate else ""
    )
    prepared = "model, optimizer = accelerator.prepare(model, optimizer)\n" if accelerate else ""
    return (
        f"import torch\n{header}"
        "model = torch.nn.Linear(2, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        f"{prepared}"
        + "".join(f"{name} = 1\n" for name in names)
        + f"total = {' + '.join(names)}\n"
        "loss = model(torch.ones(4, 2)).sum() * total\n"
        "loss.backward()\n"
        "optimizer.step()\n"
        'torch.save(model.state_dict(), "model.pt")\n'
        "print(total)\n"
    )


def test_the_sum_is_deeper_than_the_default_recursion_limit():
    tree = ast.parse(deep_script(False))
    depth, node = 0, tree.body[-6].value  # total = x0 + ... (left-nested BinOps)
    while isinstance(node, ast.BinOp):
        depth, node = depth + 1, node.left
    assert depth == TERMS - 1 > 1000


def test_a_deep_accelerator_script_is_linted(tmp_path):
    script = tmp_path / "deep.py"
    script.write_text(deep_script(True))
    result = run_accelify("lint", "--no-cache", script, cwd=tmp_path)
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert result.returncode == 1
    codes = {line.split()[1] for line in result.stdout.splitlines() if ": ACC" in line}
    assert {"ACC301", "ACC201"} <= codes


def test_a_deep_training_script_is_converted(tmp_path):
    script = tmp_path / "deep.py"
    script.write_text(deep_script(False))
    result = run_accelify("convert", script, "-o", tmp_path / "out.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    converted = (tmp_path / "out.py").read_text()
    assert "accelerator.backward(loss)" in converted
    assert f"total = {' + '.join(f'x{i}' for i in range(TERMS))}\n" in converted


def test_a_bug_of_ours_in_lint_is_one_error_line_and_the_other_files_are_checked(
    tmp_path, monkeypatch
):
    from accelify.lint import cli
    from accelify.lint.selection import Selection

    broken = tmp_path / "broken.py"
    broken.write_text("import torch\n")

    def fail(data, path, *_args, **_kwargs):
        raise ValueError("a rule went wrong")

    monkeypatch.setattr(cli, "lint_source", fail)
    result = cli._lint_one(broken, Selection(), fix=False)
    assert result.findings == []
    assert result.error == (
        "internal error, not checked (ValueError: a rule went wrong); please report this file"
    )


def test_lint_exits_2_naming_the_file_it_could_not_check(tmp_path, monkeypatch, capsys):
    from accelify.lint import cli

    broken, fine = tmp_path / "broken.py", tmp_path / "fine.py"
    broken.write_text("import torch\n")
    fine.write_text("import torch\n")
    checked = []
    real = cli.lint_source

    def fail_on_broken(data, path, *args, **kwargs):
        checked.append(path)
        if path.endswith("broken.py"):
            raise ValueError("a rule went wrong")
        return real(data, path, *args, **kwargs)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "lint_source", fail_on_broken)
    code = cli.run_lint(
        [broken, fine],
        fix=False,
        diff=False,
        select=[],
        ignore=[],
        output_format="text",
        exit_zero=False,
        show_statistics=False,
        jobs=1,
        cache=False,
    )
    assert code == 2
    assert sorted(checked) == [str(broken), str(fine)]
    assert f"accelify: error: {broken}: internal error, not checked" in capsys.readouterr().err
