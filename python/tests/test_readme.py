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


def test_the_docs_say_where_the_test_script_installs_the_package():
    """After scripts/test.sh, `import sparsekv` works in the environment the script installs into:
    the README and docs/install.md name that environment and how to use it."""
    root = README.parent
    script = (root / "scripts" / "python-test.sh").read_text()
    venv = re.search(r'^venv="\$root/(.+)"$', script, re.M).group(1)
    section = README.read_text()
    section = section[section.index("## Use from Python"):]
    section = section[:section.index("\n## ", 3)]
    install = (root / "docs" / "install.md").read_text()
    for text in (section, install):
        assert venv in text
        assert f". {venv}/bin/activate" in text
    assert f"{venv}/bin/python -c 'import sparsekv; print(sparsekv.__version__)'" in install
