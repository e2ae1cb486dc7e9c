"""Every prefix of the series built and tested on its own (``ggml-bridge build --series-prefixes DIR``).

The upstream tree with patches 1..k applied, for every k, built in one CMake tree (each step recompiles only what
patch k changed) with the patched variant's CMake arguments (:func:`ggml_bridge.distribution.builder.plan.cmake_args`: the
series' switches, the backend's options, the user's CMAKE_ARGS last) and the tests on, and the series' ctest labels
run as soon as a prefix has registered them (``bridge`` needs a CUDA build with two devices or
``GGML_CUDA_DEVICES``; ``batched`` runs on the CPU). No web UI: the prefixes prove the series' code.

``DIR`` keeps ``tree/`` (a git work tree of the upstream tree: reused when it is the same upstream, so that a later
run recompiles only what the patches change), ``build/``, the logs of each step (``configure-K.log``,
``build-K.log``, ``ctest-K-LABEL.log``) and ``prefixes.md``: one row per prefix (patches, build seconds, targets
built, ctest), rewritten after each prefix.
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...foundations import gitrepo, runner
from ...foundations.config import Settings
from ...foundations.errors import BuildError, PatchError, ToolchainError
from ...foundations.runner import log, step
from ...runtime import modes
from ...upstream import patch as patchmod
from ...upstream.fetch.resolve import obtain
from ...upstream.fetch.tree import Tree
from . import plan, steps
from .toolchain import Toolchain

#: The ctest labels the series' test programs register (test-mapped-host-bridge, test-batched-transfers).
CTEST_LABELS = ("bridge", "batched")
REPORT = "prefixes.md"
_HEADER = "| patches | build s | targets built | ctest |\n|---|---|---|---|\n"


@dataclass
class Prefix:
    """Patches 1..k of the series, built (``targets``; None: the build failed) and tested (label -> outcome)."""

    k: int
    patch: str
    seconds: float = 0.0
    targets: list[str] | None = None
    ctest: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.targets is not None and not any(r.startswith("FAILED") for r in self.ctest.values())

    def row(self) -> str:
        built = " ".join(self.targets) if self.targets is not None else f"FAILED (build-{self.k}.log)"
        tested = "; ".join(f"-L {label} {r}" for label, r in self.ctest.items()) or "-"
        return f"| 1..{self.k} ({Path(self.patch).stem}) | {self.seconds:.0f} | {built} | {tested} |"


def build_prefixes(
    settings: Settings, out_dir: Path, *, source_spec: str | None = None, allow_unpinned: bool = False
) -> tuple[Path, list[Prefix]]:
    """Build and test every prefix of the project's series in ``out_dir`` (a folder checked by the caller);
    returns ``prefixes.md`` and the prefixes. A patch that does not apply onto the ones before it is a PatchError;
    a prefix that does not build, or whose tests fail, is a row of the report."""
    target = plan.resolve(settings, [modes.PATCHED], "use another --backend")  # before minutes of fetching
    patched = target.variants[0]
    tree = obtain(settings, source_spec, allow_unpinned)
    series = patchmod.read_series(settings.patches_dir)
    if not series.patches:
        raise PatchError(f"the patch series in {settings.patches_dir} is empty", why="there is no prefix to build")
    wt, build_dir, report = out_dir / "tree", out_dir / "build", out_dir / REPORT
    _upstream_tree(wt, tree)
    args = plan.cmake_args(settings, wt, patched, target.backend, target.tools, tests=True)
    done: list[Prefix] = []
    report.write_text(_HEADER)
    for k, p in enumerate(series.patches, 1):
        gitrepo.run(
            wt,
            *("am", "--3way", "--keep-cr", "--committer-date-is-author-date", str(p.path)),
            env=gitrepo.IDENTITY,
            error=PatchError,
            what=f"patch {p.name} does not apply onto patches 1..{k - 1}",
        )
        with step(f"prefix 1..{k} ({p.name}): configure, build, ctest"):
            prefix = _build_one(settings, target.tools, wt, build_dir, args, Prefix(k, p.name), out_dir)
        done.append(prefix)
        log(f"    {prefix.row()}")
        report.write_text(_HEADER + "".join(d.row() + "\n" for d in done))
    return report, done


def _upstream_tree(wt: Path, tree: Tree) -> None:
    """``wt`` at the upstream commit (``upstream <id>``, made by :func:`ggml_bridge.upstream.patch.init_upstream_repo`): the
    one a previous run left when it is of this tree (its unchanged files keep their times), else made afresh."""
    subject = f"upstream {tree.commit_or_id}"
    if (wt / ".git").exists():
        gitrepo.run(wt, "am", "--abort", check=False)
        roots = gitrepo.run(wt, "rev-list", "--max-parents=0", "HEAD", check=False).stdout.split()
        said = gitrepo.run(wt, "log", "-1", "--format=%s", roots[0], check=False).stdout.strip() if roots else ""
        if said == subject:
            gitrepo.run(wt, "checkout", "-q", "-f", "--detach", roots[0], error=PatchError)
            gitrepo.run(wt, "clean", "-qfdx", error=PatchError)
            return
        log(f"{wt} holds another tree ({said or 'no commit'}); making it again")
    shutil.rmtree(wt, ignore_errors=True)
    patchmod.init_upstream_repo(wt, tree)


def _build_one(
    settings: Settings, tools: Toolchain, wt: Path, build_dir: Path, args: list[str], prefix: Prefix, out_dir: Path
) -> Prefix:
    """Configure (CMake re-runs where a patch changed a CMakeLists), build the targets this prefix defines, run the
    ctest labels it has registered."""
    k, t0 = prefix.k, time.monotonic()
    configure_log, build_log = out_dir / f"configure-{k}.log", out_dir / f"build-{k}.log"
    for f in (configure_log, build_log):
        f.write_text("")
    steps.configure(tools, wt, build_dir, args, configure_log)
    targets = steps.select_targets(tools, build_dir, build_log, settings.build.targets)
    try:
        steps.compile_targets(tools, build_dir, targets, plan.jobs(settings), build_log)
        prefix.targets = targets
    except BuildError as e:
        log(f"    prefix 1..{k} did not build: {e.what}")
    prefix.seconds = time.monotonic() - t0
    ctest = tools.cmake.path.with_name("ctest")
    for label in CTEST_LABELS:
        listed = runner.run(
            [ctest, "--test-dir", build_dir, "-N", "-L", label],
            check=False,
            failure=runner.Failure(ToolchainError, fix="ctest comes with cmake: install cmake's ctest beside it"),
        ).stdout
        if not re.search(r"Total Tests: [1-9]", listed):
            continue
        ctest_log = out_dir / f"ctest-{k}-{label}.log"
        ctest_log.write_text("")
        res = runner.run(
            [ctest, "--test-dir", build_dir, "-L", label, "--output-on-failure"],
            check=False,
            output=runner.Output(log_file=ctest_log),
        )
        outcome = "passed" if res.returncode == 0 else f"FAILED ({ctest_log.name})"
        if re.search(r"Not Run|Skipped|SKIP", ctest_log.read_text(errors="replace")):
            outcome += f" (skipped: see {ctest_log.name})"
        prefix.ctest[label] = outcome
    return prefix
