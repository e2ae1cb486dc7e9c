"""Helpers shared by test modules (no test module imports another): the fake llama.cpp programs of
tests/fixtures/ written as executables, and where the real builds are when the slow tests can use them."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from fixtures import fakellama

if TYPE_CHECKING:
    from ggml_bridge.foundations import config

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
FAKE_SERVER = FIXTURES / "fake_llama_server.py"
FAKE_BENCH = FIXTURES / "fake_llama_bench.py"
FAKE_MICRO = FIXTURES / "fake_mapped_host_bridge_bench.py"
FAKE_INPROC = FIXTURES / "fake_batched_bench.py"
FAKE_RPC = FIXTURES / "fakerpc.py"
FAKE_SMI = FIXTURES / "fake_nvidia_smi.py"


def write_exe(path: Path, text: str) -> Path:
    """``text`` as a Python program run by this interpreter (a ``#!PYTHON`` first line is replaced)."""
    if text.startswith("#!PYTHON\n"):
        text = text.split("\n", 1)[1]
    path.write_text(f"#!{sys.executable}\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)
    return path


def write_fake_bin(d: Path, *, unpatched: bool = False, prefix: str = "") -> Path:
    """The fake llama-server and llama-perplexity in ``d``; ``unpatched`` makes them print no patch lines (an
    upstream build); ``prefix`` is code they run first."""
    d.mkdir(parents=True, exist_ok=True)
    prefix += "import os\nos.environ['FAKE_UNPATCHED'] = '1'\n" if unpatched else ""
    for name in ("llama-server", "llama-perplexity"):
        write_exe(d / name, prefix + FAKE_SERVER.read_text())
    return d


def write_fake_variants(root: Path, *, prefix: str = "", rpc_server: str | None = None) -> Path:
    """``root``/{upstream,nopeer,nopeer-virtual,patched}/llama-bench (as bench's --variants-dir) with the fake llama-server and
    llama-perplexity (upstream's print no patch lines), the fake microbenchmark and in-process bench in patched/;
    ``prefix`` is code run first by every llama-bench, ``rpc_server`` the name of a fake rpc-server to add to every
    variant."""
    for v in ("upstream", "nopeer", "nopeer-virtual", "patched"):
        write_fake_bin(root / v, unpatched=v != "patched")
        write_exe(root / v / "llama-bench", prefix + FAKE_BENCH.read_text())
        if rpc_server:
            write_exe(
                root / v / rpc_server,
                ("import os\nos.environ['FAKE_RPC_UPSTREAM'] = '1'\n" if v != "patched" else "") + FAKE_RPC.read_text(),
            )
    write_exe(root / "patched" / "test-mapped-host-bridge", FAKE_MICRO.read_text())
    write_exe(root / "patched" / "test-batched-transfers", FAKE_INPROC.read_text())
    return root


def bench_args(**kw: object):
    """``ggml-bridge bench``'s defaults with ``kw`` set."""
    import dataclasses

    from ggml_bridge import cli

    opts = cli.parse_command(cli.COMMANDS["bench"], [])
    if dataclasses.is_dataclass(opts):
        return dataclasses.replace(opts, **kw)
    for k, v in kw.items():
        setattr(opts, k, v)
    return opts


@dataclass(frozen=True)
class BenchEnv:
    """bench on fake variants (their programs append their command lines to ``order``; see the fixtures), a model
    file, and settings whose cache is under ``tmp``."""

    variants: Path
    model: Path
    tmp: Path
    settings: config.Settings

    @property
    def order(self) -> Path:
        return self.tmp / "order.txt"

    def args(self, report: str | Path | None = "r", **kw: object) -> Any:
        """``ggml-bridge bench``'s options on the fake variants and model, reporting into ``tmp/report`` (a path
        as it is; None: bench's default), ``kw`` set (``variants_dir=None``, ``model=None``: without them)."""
        where = None if report is None else self.tmp / report
        return bench_args(**{"variants_dir": self.variants, "model": self.model, "report": where, **kw})

    def run(self, args: Any) -> Any:
        """Run the bench with ``args`` (it must exit 0) and read the bench.json it wrote."""
        from ggml_bridge.experiments.bench import orchestrate

        assert orchestrate.bench(args, self.settings) == 0
        return self.read(args.report)

    def read(self, report: str | Path = "r") -> Any:
        """The bench.json in ``tmp/report`` (a path as it is)."""
        return json.loads((self.tmp / report / "bench.json").read_text())


def ladder_options(argv: list[str]):  # -> ggml_bridge.experiments.ladder.orchestrate.LadderOptions
    """``ggml-bridge ladder ARGV`` as the typed options the ladder runs with."""
    from ggml_bridge import cli

    return cli.parse_command(cli.COMMANDS["ladder"], argv)


def fake_model(d: Path) -> Path:
    p = d / "m.gguf"
    p.write_bytes(b"GGUF fake model")
    return p


def real_bin_dir() -> Path | None:
    """A real patched CPU build (GGML_BRIDGE_TEST_BIN_DIR or the cache's latest), None without one."""
    d = os.environ.get("GGML_BRIDGE_TEST_BIN_DIR")
    if d and (Path(d) / "llama-server").is_file():
        return Path(d)
    try:
        from ggml_bridge.distribution.builder import locate
        from ggml_bridge.foundations import config

        return locate.find_binary(config.load({}), "llama-server", variant="patched", backend="cpu").parent
    except Exception:  # noqa: BLE001 - no build available: the slow tests skip
        return None


def real_vocab() -> Path | None:
    from ggml_bridge.experiments import model

    return model.find_vocab(
        os.environ.get("GGML_BRIDGE_TEST_UPSTREAM"), *(list(real_bin_dir().parents)[:4] if real_bin_dir() else [])
    )


def write_ladder(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


def busy_port() -> tuple[socket.socket, int]:
    """A listening socket on 127.0.0.1 and its port (close it when done)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, s.getsockname()[1]


# --------------------------------------------------------------------------------------------- rebase and radar

#: The Last-Update date the rebase tests write.
REBASE_DATE = "2031-01-02"
DEMO = "".join(f"int line{i} = {i};\n" for i in range(1, 31))


@dataclass
class RebaseUpstream:
    """The synthetic upstream of the rebase and radar tests (:func:`make_rebase_upstream`)."""

    repo: Path
    base: str
    patches: Path
    commits: dict[str, str]


def _set_line(path: Path, n: int, text: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    lines[n - 1] = text + "\n"
    path.write_text("".join(lines))


def make_rebase_upstream(root: Path) -> RebaseUpstream:
    """In ``root``: an upstream with tag b1 (the pin), a two-patch series in our format, and one tag per outcome:
    b2 clean, b3 offsets, b4 fuzz, b5 0001 already upstream, b6 0001 conflicts."""
    repo = root / "llama.cpp"
    fakellama.write_tree(repo)
    (repo / "src" / "demo.c").write_text(DEMO)
    (repo / "ggml" / "src" / "ggml-cuda").mkdir(parents=True)
    (repo / "ggml" / "src" / "ggml-cuda" / "ggml-cuda.cu").write_text("// cuda backend\nint cuda_backend = 1;\n")
    g = fakellama.git
    g(repo, "init", "-q", "-b", "master")
    g(repo, "add", "-A")
    g(repo, "commit", "-q", "-m", "upstream b1")
    g(repo, "tag", "b1")
    base = g(repo, "rev-parse", "HEAD")

    work = root / "work"
    g(root, "clone", "-q", str(repo), str(work))
    _set_line(work / "src" / "demo.c", 10, "int line10 = 100;")
    msg1 = (
        "demo: line ten is one hundred\n\nBody text.\n\nOrigin: ggml-bridge, patches/0001-src-demo-ten.patch\n"
        "Forwarded: no\nLast-Update: 2026-11-30\n"
    )
    g(work, "commit", "-q", "-a", "-m", msg1)
    (work / "ggml" / "src" / "ggml-cuda" / "bridge.cu").write_text("int bridge = 1;\n")
    with open(work / "ggml" / "src" / "ggml-cuda" / "ggml-cuda.cu", "a") as fh:
        fh.write("int uses_bridge = 1;\n")
    g(work, "add", "-A")
    msg2 = (
        "ggml-cuda: bridge source\n\nOrigin: ggml-bridge, patches/0002-ggml-cuda-bridge.patch\nForwarded: no\n"
        "Last-Update: 2026-11-30\n"
    )
    g(work, "commit", "-q", "-m", msg2)
    out = root / "fp"
    g(work, "format-patch", "-q", "--zero-commit", "--no-signature", "--no-numbered", "-o", str(out), "b1..HEAD")
    patches = root / "patches"
    patches.mkdir()
    for f, name in zip(
        sorted(out.glob("*.patch")), ("0001-src-demo-ten.patch", "0002-ggml-cuda-bridge.patch"), strict=False
    ):
        shutil.move(f, patches / name)
    (patches / "series").write_text("# our series\n0001-src-demo-ten.patch\n0002-ggml-cuda-bridge.patch\n")

    commits = {"b1": base}

    def target(tag: str, edit: Callable[[Path], None]) -> None:
        g(repo, "checkout", "-q", "-b", f"t-{tag}", "b1")
        edit(repo)
        g(repo, "commit", "-q", "-a", "-m", f"upstream {tag}")
        g(repo, "tag", tag)
        commits[tag] = g(repo, "rev-parse", "HEAD")

    target("b2", lambda r: (r / "include" / "llama.h").write_text("#pragma once\nint llama_version(void);\nint x;\n"))
    target("b3", lambda r: (r / "src" / "demo.c").write_text("// new\n// header\n// lines\n// five\n// here\n" + DEMO))
    target("b4", lambda r: _set_line(r / "src" / "demo.c", 7, "int line7 = 77;"))
    target("b5", lambda r: _set_line(r / "src" / "demo.c", 10, "int line10 = 100;"))
    target("b6", lambda r: _set_line(r / "src" / "demo.c", 10, "int line10 = -10;"))
    g(repo, "checkout", "-q", "master")
    return RebaseUpstream(repo, base, patches, commits)


def rebase_pin_text(up: RebaseUpstream) -> str:
    expect = ", ".join(f'"{f}"' for f in fakellama.EXPECT_FILES)
    return f"""[upstream]
url = "{up.repo.as_uri()}"
tag = "b1"
commit = "{up.base}"
expect_files = [{expect}]

[[source]]
kind = "git"
url = "{up.repo.as_uri()}"
"""


def project_snapshot(proj: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(proj)): p.read_bytes()
        for p in sorted(proj.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(proj).parts and "build" not in p.relative_to(proj).parts
    }


def rebase_statuses(rep: Any) -> list[str]:
    return [r.status for r in rep.results]


def expected_outcomes(new_tree: Path, old_tree: Path, patches: list[Path], scratch: Path) -> list[str]:
    """Each patch's outcome, computed independently with plain git apply in a scratch repo of the new tree (old
    blobs added with hash-object, the way a reviewer would do it by hand)."""
    repo = scratch / "repo"
    shutil.copytree(new_tree, repo, symlinks=True)
    g = fakellama.git
    g(repo, "init", "-q")
    g(repo, "add", "-A", "--force")
    g(repo, "commit", "-q", "-m", "new")
    # preimages: apply the series onto a copy of the old tree's touched files
    old = scratch / "old"
    touched = sorted({m for p in patches for m in re.findall(r"^diff --git a/(\S+) ", p.read_text(), re.M)})
    for rel in touched:
        if (old_tree / rel).is_file():
            (old / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(old_tree / rel, old / rel)
    g(old, "init", "-q")
    g(old, "add", "-A")
    g(old, "commit", "-q", "-m", "old")
    for p in patches:
        g(old, "apply", "--index", str(p))
        g(old, "commit", "-q", "-m", p.name)
    g(repo, "fetch", "-q", str(old), "HEAD:refs/old")
    out = []
    for p in patches:
        ok = subprocess.run(["git", "apply", "--check", "-v", str(p)], cwd=repo, capture_output=True, text=True)
        if ok.returncode == 0:
            out.append("offsets" if "(offset" in ok.stderr else "clean")
            g(repo, "apply", "--index", str(p))
        elif subprocess.run(["git", "apply", "--check", "--reverse", str(p)], cwd=repo).returncode == 0:
            out.append("upstream")
            continue
        else:
            fuzz = subprocess.run(
                ["patch", "--dry-run", "--batch", "--forward", "-p1", "-i", str(p)], cwd=repo, capture_output=True
            )
            three = subprocess.run(["git", "apply", "--3way", str(p)], cwd=repo, capture_output=True, text=True)
            if three.returncode != 0:
                out.append("conflict")
                g(repo, "reset", "-q", "--hard")
                continue
            out.append("fuzz" if fuzz.returncode == 0 else "merged")
        g(repo, "commit", "-q", "-m", p.name, "--allow-empty")
    return out


def make_vocab(path: Path) -> Path:
    """A small llama-spm-like vocabulary GGUF (no tensors): specials, bytes-free, the ladder's words."""
    import gguf

    from ggml_bridge.experiments.ladder import inputs

    tokens = (
        ["<unk>", "<s>", "</s>"]
        + ["\u2581" + w for w in inputs.WORDS]
        + list("abcdefghijklmnopqrstuvwxyz.")
        + ["\u2581"]
    )
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 3 + [-float(i) for i in range(len(tokens) - 3)])
    w.add_token_types([2, 3, 3] + [1] * (len(tokens) - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


VK_CORE_NEW = (
    "#define VK_HEADER_VERSION 309\n"
    "#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, 4, VK_HEADER_VERSION)\n"
    "typedef struct VkLayerSettingEXT { int x; } VkLayerSettingEXT;\n"
)
VK_CORE_OLD = "#define VK_HEADER_VERSION 239\n#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, 3, VK_HEADER_VERSION)\n"


def fake_vulkan_root(
    root: Path,
    *,
    headers: str | None = VK_CORE_NEW,
    loader: str | None = "lib/x86_64-linux-gnu/libvulkan.so.1",
    glslc: bool = True,
    spirv: bool = True,
) -> Path:
    """A fake Vulkan installation under ``root`` (a /usr or an SDK): the pieces asked for, nothing else."""
    root.mkdir(parents=True, exist_ok=True)
    if headers is not None:
        (root / "include" / "vulkan").mkdir(parents=True)
        (root / "include" / "vulkan" / "vulkan.hpp").write_text("// fake\n")
        (root / "include" / "vulkan" / "vulkan_core.h").write_text(headers)
    if loader is not None:
        (root / loader).parent.mkdir(parents=True, exist_ok=True)
        (root / loader).write_bytes(b"\x7fELF")
    if glslc:
        (root / "bin").mkdir(exist_ok=True)
        (root / "bin" / "glslc").write_text("#!/bin/sh\n")
        (root / "bin" / "glslc").chmod(0o755)
    if spirv:
        d = root / "share" / "cmake" / "SPIRV-Headers"
        d.mkdir(parents=True)
        (d / "SPIRV-HeadersConfig.cmake").write_text("# fake\n")
    return root


# --------------------------------------------------------------------------------------------- full disks, other users

#: The user the shared-cache tests run ggml-bridge as (a uid with no passwd entry: nothing is added to the machine).
OTHER_UID = 4242


def small_disk_or_skip(where: Path, size: str = "1m", *, read_only: bool = False) -> Path:
    """A tmpfs of ``size`` mounted at ``where`` (created), for the disk-full tests; ``pytest.skip`` where mounting is
    not permitted (not root, or a container without CAP_SYS_ADMIN). Unmount with :func:`unmount`."""
    import pytest

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    where.mkdir(parents=True, exist_ok=True)
    opts = f"size={size},mode=1777" + (",ro" if read_only else "")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"mount is not permitted here: {res.stderr.strip()}")
    return where


def unmount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(folder: Path, leave: int = 0) -> Path:
    """Fill the file system of ``folder`` until at most ``leave`` bytes are free (a file ``filler`` in it)."""
    filler = folder / "filler"
    with open(filler, "wb") as fh:
        chunk = b"\0" * 65536
        try:
            while True:
                fh.write(chunk)
                fh.flush()
        except OSError:
            pass
    if leave:
        size = filler.stat().st_size
        os.truncate(filler, max(0, size - leave))
    return filler


def shared_folder(tmp_path: Path) -> Path:
    """A folder another user can reach (pytest's own tmp folder is private to its user), removed by the caller."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="ggml-bridge-shared-", dir="/tmp"))
    d.chmod(0o777)
    return d


def other_user_or_skip() -> list[str]:
    """The argv prefix that runs a command as :data:`OTHER_UID` (setpriv, else runuser has no uid form); skips where
    root cannot switch users, or that user cannot run this Python and import ggml-bridge."""
    import pytest

    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("running as another user needs root and setpriv")
    prefix = [setpriv, f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", "--"]
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", "import ggml_bridge, git, requests"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        cwd="/",
    )
    if probe.returncode != 0:
        pytest.skip(f"user {OTHER_UID} cannot run this Python with ggml-bridge: {probe.stderr.strip()[-200:]}")
    return prefix


def run_as_other_user(
    prefix: list[str], argv: list[str], env: dict[str, str], home: Path
) -> subprocess.CompletedProcess[str]:
    """``ggml-bridge ARGV`` as the other user (``prefix`` from :func:`other_user_or_skip`), its HOME ``home``."""
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, OTHER_UID, OTHER_UID)
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_BRIDGE_", "FAKE_"))}
    full.update(env, HOME=str(home), PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [*prefix, sys.executable, "-m", "ggml_bridge", *argv],
        capture_output=True,
        text=True,
        env=full,
        cwd=str(home),
        timeout=300,
    )


def doctor_findings(
    res: Any,
    *,
    devices: list[str] | None = None,
    model: Any = None,
    env: dict[str, str] | None = None,
) -> Any:  # -> ggml_bridge.experiments.doctor.facts.Findings
    """The doctor's findings on a rig without an NVIDIA driver, one patched CUDA build listing the devices of the
    probe result ``res`` (``devices``: fake ones of these names instead), ``model`` and ``env`` as given."""
    from ggml_bridge.experiments.doctor import inventory, nvml
    from ggml_bridge.experiments.doctor.facts import Findings, Options

    build = inventory.Build("patched/cuda build", "cuda", Path("/b/bin/llama-server"))
    listed = [
        inventory.ListedDevice(d.name, d.description, d.total_mib, d.free_mib)
        for d in (res.devices.values() if res else [])
    ]
    if devices is not None:
        listed = [inventory.ListedDevice(n, "Fake", 8192, 8000) for n in devices]
    return Findings(
        when="2026-12-06 00:00 UTC",
        host="rig",
        options=Options(),
        env=env or {},
        nvml=nvml.NvmlReport("no-driver", "no NVIDIA driver"),
        cpu=inventory.Cpu("CPU", 2, (), "native"),
        builds=[build],
        listings=[inventory.Listing(build, listed)],
        probe=res,
        probe_source="fixture",
        model=model,
    )
