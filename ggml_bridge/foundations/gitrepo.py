"""The one door to git: every git process of the package is started by :mod:`ggml_bridge.foundations.runner`.

Two ways through it, one runner behind both:

* :func:`run` (``git -C WHERE ARGS...``): the commands whose output we parse or that change a tree (``am``,
  ``format-patch``, ``fetch``, ``status``...), with the runner's error wording (``error=`` names the FatalError).
* :func:`open_repo` / :func:`init`: GitPython's object model (a repository, its HEAD, its config file) where it
  helps. The repositories opened here run every command GitPython builds (``repo.git.am(...)``,
  ``Repo.init``) through :func:`ggml_bridge.foundations.runner.run` (its ``Git.execute`` is replaced), so they are logged
  (``+ git ...``), stopped with every other child on a stop signal (:mod:`ggml_bridge.foundations.signals`) and fail as
  :class:`GitFailed`. What GitPython would run as a long-lived process (``as_process``: its ``git cat-file
  --batch`` object readers, ``is_dirty(untracked_files=True)``) is refused, a programming error, never a silent
  escape: HEAD is read with ``git rev-parse`` (:func:`head`), dirtiness with ``git status`` (:func:`is_dirty`).

Every git runs with ``LC_ALL=C`` (its messages are parsed) and with the executable GitPython uses
(``$GIT_PYTHON_GIT_EXECUTABLE``, else ``git``). ``import git`` is written here only (tests/unit/test_imports.py);
it is imported lazily, since importing GitPython costs a tenth of a second that commands without git do not pay.
The one process this does not cover is GitPython's own ``git version`` check when it is first imported.
"""

from __future__ import annotations

import inspect
import os
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from . import runner
from .errors import FatalError

if TYPE_CHECKING:
    from git import Repo

#: git's messages are parsed (conflicts, failed hunks, "dubious ownership"): always in English.
LOCALE = {"LC_ALL": "C"}
#: Identity and date of every commit we make, so the same inputs give the same commit ids.
IDENTITY = {
    "GIT_AUTHOR_NAME": "ggml-bridge",
    "GIT_AUTHOR_EMAIL": "ggml-bridge@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "ggml-bridge",
    "GIT_COMMITTER_EMAIL": "ggml-bridge@localhost",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
#: git without the user's or the system's configuration (output that lands in the series must not depend on them).
PLAIN = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


class GitFailed(Exception):
    """A git command GitPython ran through the runner exited non-zero (GitPython's ``GitCommandError``, here)."""

    def __init__(self, result: runner.Result) -> None:
        self.result = result
        self.status = result.returncode
        self.stdout = result.stdout
        self.stderr = result.stderr
        super().__init__(f"{' '.join(result.args[:3])}... exited with {result.returncode}: {self.said}")

    @property
    def said(self) -> str:
        """git's own first error line (``fatal: detected dubious ownership in repository at ...``)."""
        lines = [line.strip() for line in f"{self.stderr}\n{self.stdout}".splitlines() if line.strip()]
        fatal = [line for line in lines if line.startswith(("fatal:", "error:"))]
        return (fatal or lines or ["git failed"])[0]


class NotARepository(Exception):
    """``path`` is no git repository (no ``.git``, a damaged one, or no such folder)."""


def executable() -> str:
    """The git GitPython runs: ``$GIT_PYTHON_GIT_EXECUTABLE``, else ``git`` from PATH."""
    return os.environ.get("GIT_PYTHON_GIT_EXECUTABLE") or "git"


def reason(stderr: str, *, limit: int = 300) -> str:
    """What git said, in one line: its ``fatal:`` / ``error:`` lines (git ends a failed fetch with "Please make sure
    you have the correct access rights\nand the repository exists.", so the last line alone says nothing), else
    every line joined."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.startswith(("fatal:", "error:"))] or lines
    return " ".join(said)[:limit]


def run(
    where: Path | str,
    *args: str | os.PathLike[str],
    check: bool = True,
    env: Mapping[str, str] | None = None,
    error: type[FatalError] = FatalError,
    what: str | None = None,
    fix: str | None = None,
) -> runner.Result:
    """``git -C where args...`` through the runner (``env``: variables added, logged)."""
    return runner.run(
        [executable(), "-C", str(where), *args],
        env={**LOCALE, **(env or {})},
        check=check,
        failure=runner.Failure(error, what, fix),
    )


def open_repo(path: Path | str, *, search_parent: bool = False) -> Repo:
    """GitPython's repository at ``path`` whose commands go through the runner; :class:`NotARepository` if none."""
    import git

    try:
        return _repo_class()(path, search_parent_directories=search_parent)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as e:
        raise NotARepository(f"{type(e).__name__}: {e}") from None


@contextmanager
def opened(path: Path | str, *, search_parent: bool = False) -> Iterator[Repo]:
    """:func:`open_repo`, closed on leaving."""
    repo = open_repo(path, search_parent=search_parent)
    try:
        yield repo
    finally:
        repo.close()


def init(path: Path | str, **options: Any) -> Repo:
    """``git init`` (through the runner; ``initial_branch="main"`` becomes ``--initial-branch=main``) of ``path``."""
    return _repo_class().init(path, **options)


def head(repo: Repo) -> str | None:
    """The commit HEAD names (``git rev-parse``), None when it names none (an unborn branch, a damaged ref);
    :class:`GitFailed` when git cannot read the repository at all (``fatal: detected dubious ownership ...``)."""
    status, out, err = repo.git.rev_parse(
        "--verify", "-q", "HEAD^{commit}", with_extended_output=True, with_exceptions=False
    )
    if status == 0:
        return str(out).strip()
    if "fatal:" in err:
        raise GitFailed(runner.Result(["git", "rev-parse", "HEAD"], status, str(out), err))
    return None


def is_dirty(repo: Repo) -> bool:
    """Changed, staged or untracked (not ignored) files: ``git status --porcelain --untracked-files=all``."""
    return bool(repo.git.status("--porcelain", "--untracked-files=all").strip())


@dataclass(frozen=True)
class _Execute:
    """One call of GitPython's ``Git.execute``, by the names of its parameters (GitPython's defaults where the call
    gives none): what the runner honours, and whether it asks for what the runner cannot do (``piped``: a long-lived
    process, a stream in or out, a shell)."""

    command: Any
    with_extended_output: bool
    with_exceptions: bool
    stdout_as_string: bool
    strip_newline_in_stdout: bool
    kill_after_timeout: float | None
    env: Mapping[str, str] | None
    piped: bool

    @classmethod
    def of(cls, bound: inspect.BoundArguments) -> _Execute:
        bound.apply_defaults()
        a = bound.arguments
        return cls(
            command=a["command"],
            with_extended_output=a["with_extended_output"],
            with_exceptions=a["with_exceptions"],
            stdout_as_string=a["stdout_as_string"],
            strip_newline_in_stdout=a["strip_newline_in_stdout"],
            kill_after_timeout=a["kill_after_timeout"],
            env=a["env"],
            piped=bool(a["as_process"] or a["istream"] is not None or a["output_stream"] is not None or a["shell"]),
        )


@lru_cache(maxsize=1)
def _repo_class() -> type[Repo]:
    """GitPython's Repo whose ``git`` runs every command through the runner."""
    import git

    execute_parameters = inspect.signature(git.Git.execute)

    class RunnerGit(git.Git):
        def execute(self, *args: Any, **kwargs: Any) -> Any:
            call = _Execute.of(execute_parameters.bind(self, *args, **kwargs))
            if call.piped:
                raise RuntimeError(
                    f"GitPython asked for a long-lived or piped git process ({call.command!r}): run it with gitrepo.run"
                )
            argv = [executable(), *(str(a) for a in list(call.command)[1:])]
            added = {**LOCALE, **{k: v for k, v in self.environment().items() if v is not None}, **(call.env or {})}
            cwd = str(self.working_dir) if self.working_dir else None
            res = runner.run(argv, cwd=cwd, env=added, check=False, timeout=call.kill_after_timeout)
            if call.with_exceptions and res.returncode != 0:
                raise GitFailed(res)
            out = res.stdout[:-1] if call.strip_newline_in_stdout and res.stdout.endswith("\n") else res.stdout
            stdout: str | bytes = out if call.stdout_as_string else out.encode()
            if call.with_extended_output:
                return res.returncode, stdout, res.stderr.rstrip("\n")
            return stdout

    class RunnerRepo(git.Repo):
        GitCommandWrapperType = RunnerGit

    return RunnerRepo
