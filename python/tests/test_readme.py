"""The README's Python example runs as written (on the CPU backend)."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_python_example_runs(capsys):
    pytest.importorskip("torch")
    text = README.read_text()
    section = text[text.index("## Use from Python"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, str(README), "exec"), {})
    assert re.fullmatch(r"hit rate \d\.\d\d\n", capsys.readouterr().out)
