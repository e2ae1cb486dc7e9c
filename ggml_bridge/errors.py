"""The FatalError family: one class per way the toolkit can fail, each with its own exit code.

Only :func:`ggml_bridge.cli.main` turns these into an exit status; every other module raises.
A message says what went wrong, why, and what to do about it.
"""

from __future__ import annotations


class FatalError(Exception):
    """Base of every error the CLI reports as a one-line message and a distinct exit code."""

    exit_code = 1
    #: Short label printed before the message.
    kind = "error"

    def __init__(self, what: str, *, why: str | None = None, fix: str | None = None) -> None:
        self.what = what
        self.why = why
        self.fix = fix
        super().__init__(self.render())

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


class ComparisonFailed(FatalError):
    """A ladder rung produced outputs that differ between modes (exit 1: the result, not a setup error)."""

    exit_code = 1
    kind = "mismatch"


class FetchError(FatalError):
    """No source could produce the pinned upstream tree."""

    exit_code = 10
    kind = "fetch error"


class ChecksumError(FetchError):
    """A download or archive did not match its pinned checksum."""

    exit_code = 11
    kind = "checksum mismatch"


class SourceError(FetchError):
    """A user-given source is not a usable llama.cpp tree (wrong commit, dirty, not llama.cpp, corrupt)."""

    exit_code = 12
    kind = "bad source"


class UnknownRefError(FetchError):
    """The upstream ref, commit or registry version asked for does not exist (the registry/remote said so)."""

    exit_code = 14
    kind = "unknown ref"


class CacheError(FatalError):
    """The cache directory cannot be created or written."""

    exit_code = 13
    kind = "cache error"


class PatchError(FatalError):
    """A patch of the series does not apply, or the series itself is malformed."""

    exit_code = 20
    kind = "patch error"


class WorkTreeModified(PatchError):
    """The patched work tree in the cache holds the user's edits (changed, added or committed files)."""

    exit_code = 21
    kind = "work tree modified"


class ToolchainError(FatalError):
    """A compiler, cmake, ninja or CUDA toolkit is missing or unusable."""

    exit_code = 30
    kind = "toolchain error"


class BuildError(FatalError):
    """CMake configure or the compile failed."""

    exit_code = 31
    kind = "build error"


class NotBuiltError(BuildError):
    """A stage asked for a binary that no build has produced yet."""

    exit_code = 32
    kind = "not built"


class ServeError(FatalError):
    """llama-server failed to start, died, or did not prove that a requested mechanism engaged."""

    exit_code = 40
    kind = "serve error"


class RpcError(ServeError):
    """An RPC endpoint is unreachable, not an rpc-server, of another protocol version, or an rpc-server died."""

    exit_code = 41
    kind = "rpc error"


class LadderSetupError(FatalError):
    """A ladder could not be set up (bad ladder file, missing binary, model generation failed)."""

    exit_code = 2
    kind = "ladder setup error"


class RebaseConflict(FatalError):
    """Rebasing the series onto another upstream hit conflicts; a report was written."""

    exit_code = 50
    kind = "rebase conflict"


class BenchError(FatalError):
    """A benchmark could not run."""

    exit_code = 60
    kind = "bench error"
