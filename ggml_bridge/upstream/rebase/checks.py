"""Build checks of a rebased series before it is swapped in: a CPU build of the staged project and an nvcc
compile check of the changed CUDA sources.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ...foundations import runner
from ...foundations.config import Settings
from ...foundations.errors import BuildError, PatchError, ToolchainError
from ...foundations.runner import step
from ...runtime import modes
from .report import Options, RebaseReport


def build_checks(staged: Settings, wt: Path, report: RebaseReport, opts: Options, source_spec: str | None) -> None:
    if not opts.build:
        report.build["cpu"] = "skipped: --no-build"
    else:
        from ...distribution.builder import single

        cpu = dataclasses.replace(staged, build=dataclasses.replace(staged.build, backend="cpu"))
        try:
            with step("build the rebased series (CPU)"):
                res = single.ensure(cpu, modes.PATCHED, source_spec=source_spec, allow_unpinned=True)
            report.build["cpu"] = f"built: {res.bin_dir}"
        except (BuildError, ToolchainError, PatchError) as e:
            report.build["cpu"] = f"failed: {e.kind}: {e.what}"
    if not opts.cuda_check:
        report.build["cuda"] = "skipped: --no-build / --no-cuda-check"
    else:
        report.build["cuda"] = cuda_check(wt, report, opts.cuda_include)


def _detect_cuda() -> Any:
    from ...distribution.builder import toolchain

    return toolchain.detect_cuda()


def cuda_check(wt: Path, report: RebaseReport, extra_includes: list[Path]) -> str:
    """``nvcc -c`` each changed .cu file of ggml/src/ggml-cuda with the tree's include dirs; a result line."""
    changed = sorted(
        {
            f
            for r in report.results
            if r.applied
            for f in r.files
            if f.startswith("ggml/src/ggml-cuda/") and f.endswith(".cu") and (wt / f).is_file()
        }
    )
    if not changed:
        return "skipped: the series changes no .cu file of ggml/src/ggml-cuda"
    cuda = _detect_cuda()
    if cuda is None:
        return "skipped: nvcc not found (PATH, $CUDACXX, $CUDA_HOME, /usr/local/cuda)"
    includes = [p for p in extra_includes if p.is_dir()]
    has_cublas = cuda.cublas_header is not None or any((p / "cublas_v2.h").is_file() for p in includes)
    if not has_cublas:
        return (
            f"skipped: nvcc {cuda.version} at {cuda.nvcc} but no cublas_v2.h in {cuda.root} "
            "(ggml-cuda includes cuBLAS; pass --cuda-include DIR with the cuBLAS headers)"
        )
    if cuda.cublas_header is not None:
        includes.append(Path(cuda.cublas_header).parent)
    from ...distribution.builder.plan import variant_options

    defines = [f"-D{k}" for k, v in variant_options(modes.VARIANTS[modes.PATCHED]).items() if v == "ON"]
    inc = [f"-I{wt / d}" for d in ("ggml/include", "ggml/src", "ggml/src/ggml-cuda", "include")]
    inc += [f"-I{p}" for p in includes]
    out_dir = Path(tempfile.mkdtemp(prefix="nvcc-", dir=wt.parent))
    failed = []
    try:
        for f in changed:
            res = runner.run(
                [
                    cuda.nvcc,
                    "-c",
                    "-std=c++17",
                    "-O0",
                    "--extended-lambda",
                    "-Xcompiler",
                    "-fPIC",
                    "-DGGML_USE_CUDA",
                    "-DGGML_SCHED_MAX_COPIES=4",
                    *defines,
                    *inc,
                    str(wt / f),
                    "-o",
                    str(out_dir / (Path(f).stem + ".o")),
                ],
                check=False,
                cwd=wt,
            )
            if res.returncode != 0:
                first = next((line for line in (res.stdout + res.stderr).splitlines() if "error" in line), "")
                failed.append(f"{f}: {first.strip()[:300]}")
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    if failed:
        return "failed: nvcc -c " + "; ".join(failed)
    return f"compiled with nvcc {cuda.version}: {', '.join(changed)}"
