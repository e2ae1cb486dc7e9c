"""The GitHub workflows pass actionlint and zizmor --offline (`make lint-workflows`), and those checks do fail on a
workflow broken the ways the rebase workflows were: the runner context in a job's env, an action on a removed
runtime and not pinned to a commit, a checkout persisting credentials, an expression expanded in shell code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
BIN = Path(sys.executable).parent

BROKEN = """name: broken
on: push
permissions:
  contents: read
jobs:
  job:
    runs-on: ubuntu-latest
    env:
      OUT: ${{ runner.temp }}/out
    steps:
      - uses: actions/checkout@v4
      - run: echo "${{ github.event.head_commit.message }}"
"""


def tool(name: str) -> str:
    path = shutil.which(name, path=f"{BIN}:{os.environ.get('PATH', '')}")
    if path is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return path


def test_the_workflows_pass_actionlint_and_zizmor() -> None:
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert {f.name for f in files} >= {"test.yml", "release.yml", "rebase-radar.yml", "rebase-upstream.yml"}
    lint = subprocess.run([tool("actionlint"), *map(str, files)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    audit = subprocess.run([tool("zizmor"), "--offline", str(WORKFLOWS)], capture_output=True, text=True)
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_a_broken_workflow_fails_both_checks(tmp_path: Path) -> None:
    wf = tmp_path / ".github" / "workflows"
    wf.mkdir(parents=True)
    (wf / "broken.yml").write_text(BROKEN)
    lint = subprocess.run([tool("actionlint"), str(wf / "broken.yml")], capture_output=True, text=True)
    assert lint.returncode != 0
    assert 'context "runner" is not allowed here' in lint.stdout and 'runtime "node20"' in lint.stdout, lint.stdout
    audit = subprocess.run([tool("zizmor"), "--offline", str(wf)], capture_output=True, text=True)
    assert audit.returncode != 0
    for finding in ("unpinned-uses", "artipacked", "template-injection"):
        assert finding in audit.stdout, audit.stdout
