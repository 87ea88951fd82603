"""The examples in examples/python and the runnable blocks of
docs/sdk-python.md run as their readers would run them: each one a
separate interpreter with only SPACE_API_URL and SPACE_API_KEY set."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from typing import Any, List

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
SDK = ROOT / "sdk" / "python"
EXAMPLES = sorted((ROOT / "examples" / "python").glob("*.py"))
DOC = ROOT / "docs" / "sdk-python.md"
# A block fenced as ```python run is a complete program.
RUNNABLE = re.compile(r"^```python run\n(.*?)^```$", re.S | re.M)


def doc_blocks() -> List[Any]:
    text = DOC.read_text()
    out = []
    for m in RUNNABLE.finditer(text):
        where = "%s:%d" % (DOC.name, text.count("\n", 0, m.start()) + 1)
        out.append(pytest.param(where, m.group(1), id=where))
    return out


def run_program(args: List[str], cwd: pathlib.Path) -> None:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SPACE_API_URL", "SPACE_API_KEY")}
    env["PYTHONPATH"] = str(SDK)  # as after `pip install ./sdk/python`
    p = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, "exit %d\nstdout:\n%s\nstderr:\n%s" % (p.returncode, p.stdout, p.stderr[-4000:])


def test_there_are_examples_and_runnable_docs() -> None:
    assert len(EXAMPLES) == 5, EXAMPLES
    assert len(doc_blocks()) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example(path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    run_program([str(path)], tmp_path)


@pytest.mark.parametrize("where,code", doc_blocks())
def test_doc_block(where: str, code: str, tmp_path: pathlib.Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(code)
    run_program([str(script)], tmp_path)
