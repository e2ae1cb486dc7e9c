"""What the doctor finds without measuring: the builds of this cache (or a given bin folder, or the installed
ggml-bridge-server wheel), the devices each build's llama-server lists (``--list-devices``: CUDA, Vulkan, RPC), the
CPU and the CPU backend the builds load, the model given, and the RPC endpoints given (the handshake, the protocol
version, the devices behind them).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from ...distribution.builder import installed, locate
from ...foundations import runner
from ...foundations.config import Settings
from ...foundations.errors import ModelError, NotBuiltError, RpcError, ServeError, UsageError
from ...runtime import modes, rpc

#: ``  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (7949 MiB, 7949 MiB free)`` (common_print_available_devices);
#: an RPC device is named ``RPC0[host:port]``
DEVICE_LINE = re.compile(
    r"^\s+(?P<name>[^\s:\[]+(?:\[[^\]]*\])?): (?P<desc>.*) \((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)\s*$"
)
#: ggml's loader, for a build whose backends are modules (GGML_BACKEND_DL): which CPU variant it picked
LOADED = re.compile(r"load_backend: loaded (?P<reg>\S+) backend from (?P<path>\S+)")
#: seconds ``--list-devices`` may take (it initializes every backend and contacts every RPC endpoint); past them the
#: listing is that build's (or endpoint's) problem in the report
LIST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Build:
    """A llama-server the doctor can ask: where it comes from, its backend, its CMake options (from its manifest)."""

    label: str
    backend: str  # cpu | cuda | vulkan | cuda-vulkan | unknown
    server: Path
    cmake: tuple[str, ...] = ()

    @property
    def bin_dir(self) -> Path:
        return self.server.parent

    @property
    def cuda(self) -> bool:
        return self.backend in modes.BACKENDS and modes.BACKENDS[self.backend].cuda

    def program(self, name: str) -> Path | None:
        p = self.bin_dir / name
        return p if p.is_file() else None


@dataclass(frozen=True)
class ListedDevice:
    name: str  # CUDA0, Vulkan1, RPC0[host:port]
    description: str
    total_mib: int
    free_mib: int

    @property
    def kind(self) -> str:
        return re.sub(r"\d+(\[.*\])?$", "", self.name)

    @property
    def ordinal(self) -> int | None:
        """The backend's device number (``CUDA1`` -> 1), None without one."""
        m = re.search(r"(\d+)(\[.*\])?$", self.name)
        return int(m[1]) if m else None


@dataclass
class Listing:
    """One build's ``llama-server --list-devices``."""

    build: Build
    devices: list[ListedDevice] = field(default_factory=list)
    loaded: dict[str, str] = field(default_factory=dict)  # registry -> module path (GGML_BACKEND_DL builds)
    problem: str | None = None


@dataclass(frozen=True)
class Cpu:
    model: str
    cores: int
    features: tuple[str, ...]  # the SIMD features ggml's CPU variants are chosen by
    backend: str  # the CPU backend the builds use, in words


@dataclass(frozen=True)
class Model:
    path: Path
    bytes: int
    architecture: str
    hidden: int
    layers: int | None


@dataclass
class RpcEndpoint:
    endpoint: str
    version: str | None = None
    handshake_ms: float | None = None
    devices: list[ListedDevice] = field(default_factory=list)
    problem: str | None = None  # one line: what, why, what to do

    @property
    def ok(self) -> bool:
        return self.problem is None


def _manifest(server: Path) -> dict[str, object]:
    try:
        data = json.loads((server.resolve().parent.parent / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _backend_from_files(bin_dir: Path) -> str:
    names = [p.name for d in (bin_dir, bin_dir.parent / "lib") if d.is_dir() for p in d.iterdir()]
    cuda = any(n.startswith("libggml-cuda") for n in names)
    vulkan = any(n.startswith("libggml-vulkan") for n in names)
    return "cuda-vulkan" if cuda and vulkan else "cuda" if cuda else "vulkan" if vulkan else "cpu"


def describe_build(label: str, server: Path) -> Build:
    m = _manifest(server)
    backend = str(m.get("backend") or _backend_from_files(server.parent))
    cmake = m.get("cmake_args")
    return Build(label, backend, server, tuple(str(a) for a in cmake) if isinstance(cmake, list) else ())


def find_builds(settings: Settings, bin_dir: Path | None) -> tuple[list[Build], list[str]]:
    """The llama-servers to ask, serving preference first: ``bin_dir``'s alone when given, else the latest patched
    build of each backend (cuda-vulkan, cuda, vulkan, cpu), then the installed ggml-bridge-server wheel. Returns
    (builds, notes on what could not be used)."""
    if bin_dir is not None:
        server = locate.locate(settings, modes.PATCHED, "llama-server", bin_dir)
        return [describe_build(f"--bin-dir {bin_dir}", server)], []
    found: list[Build] = []
    notes: list[str] = []
    for backend in ("cuda-vulkan", "cuda", "vulkan", "cpu"):
        try:
            server = locate.find_binary(settings, "llama-server", modes.PATCHED, backend)
        except NotBuiltError:
            continue
        found.append(describe_build(f"patched/{backend} build", server))
    try:
        wheel = installed.installed_server(settings)
    except (NotBuiltError, ServeError) as e:
        notes.append(f"the installed ggml-bridge-server wheel is not usable: {e}")
        wheel = None
    if wheel is not None:
        found.append(describe_build("installed ggml-bridge-server wheel", wheel))
    return found, notes


def list_devices(b: Build, extra: Sequence[str] = (), env: Mapping[str, str] | None = None) -> Listing:
    """``llama-server [extra] --list-devices`` of build ``b``: the devices it would use (CPU excluded, as llama.cpp
    lists them) and, for a build of backend modules, which modules ggml loaded."""
    out = Listing(b)
    try:
        res = runner.run(
            [b.server, *extra, "--list-devices"],
            env=env,
            check=False,
            timeout=LIST_TIMEOUT_S,
            failure=runner.Failure(ServeError),
        )
    except ServeError as e:  # it did not return (an RPC endpoint that stalls after the handshake) or cannot run
        out.problem = f"`{b.server.name} {' '.join([*extra, '--list-devices'])}`: {e}"
        return out
    text = res.stdout + "\n" + res.stderr
    for line in text.splitlines():
        if m := DEVICE_LINE.match(line):
            out.devices.append(ListedDevice(m["name"], m["desc"], int(m["total"]), int(m["free"])))
        elif m := LOADED.search(line):
            out.loaded[m["reg"]] = m["path"]
    if res.returncode != 0:
        last = [ln.strip() for ln in text.splitlines() if ln.strip()][-2:]
        out.problem = f"`{b.server.name} --list-devices` exited with {res.returncode}: " + " | ".join(last)
    return out


_SIMD = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile")


def cpu_info(builds: Sequence[Build], listings: Sequence[Listing], cpuinfo: Path = Path("/proc/cpuinfo")) -> Cpu:
    """The CPU (model, cores, the SIMD features that choose ggml's CPU variants) and the CPU backend the builds use:
    the variant module a portable build loaded (the real choice of ggml's loader), else how the build was compiled."""
    model, flags = "unknown CPU", set[str]()
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    backend = "no build found: the CPU backend is not known"
    for listing in listings:
        if "CPU" in listing.loaded:
            mod = Path(listing.loaded["CPU"]).name
            variant = mod.removeprefix("libggml-cpu-").removesuffix(".so") if mod.startswith("libggml-cpu-") else mod
            backend = f"portable: ggml loads the {variant} variant ({listing.build.label})"
            break
    else:
        if builds:
            b = builds[0]
            native = "-DGGML_NATIVE=ON" in b.cmake
            backend = (
                f"compiled for this CPU (-DGGML_NATIVE=ON, {b.label}); the portable ggml-bridge-server wheel would "
                "load the best of its CPU variants at start"
                if native
                else f"{b.label}: built without GGML_NATIVE (baseline x86-64 unless CMAKE_ARGS chose more)"
            )
    return Cpu(model, os.cpu_count() or 1, tuple(f for f in _SIMD if f in flags), backend)


def read_model(path: Path) -> Model:
    """Size, architecture, hidden size and layer count of a GGUF model (--model)."""
    if not path.is_file():
        raise UsageError(f"--model {path}: no such file", fix="pass the GGUF file you will serve")
    import gguf

    try:
        r = gguf.GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - any parse failure is the same user error
        raise ModelError(f"--model {path} is not a readable GGUF file", why=str(e)[:200]) from None

    def get(key: str) -> object:
        f = r.fields.get(key)
        return None if f is None else f.contents()

    arch = str(get("general.architecture") or "")
    hidden = get(f"{arch}.embedding_length")
    if not arch or not isinstance(hidden, int):
        raise ModelError(f"--model {path} names no architecture or embedding length", fix="pass a llama.cpp model")
    layers = get(f"{arch}.block_count")
    return Model(path, path.stat().st_size, arch, hidden, layers if isinstance(layers, int) else None)


def check_rpc(endpoints: Sequence[str], server: Path | None) -> list[RpcEndpoint]:
    """Each endpoint (``host:port``, already validated): the handshake and its protocol against this build's, then
    the devices llama-server sees behind it. A failure is that endpoint's one-line problem, never an exception."""
    expected = rpc.expected_version(server) if server is not None else None
    out: list[RpcEndpoint] = []
    for spec in endpoints:
        ep = rpc.parse_endpoints(spec)[0]
        rep = RpcEndpoint(str(ep))
        t0 = time.monotonic()
        try:
            version = rpc.check_endpoints([ep], expected)[ep]
            rep.handshake_ms = (time.monotonic() - t0) * 1e3
            rep.version = ".".join(map(str, version))
        except RpcError as e:
            rep.problem = str(e)
        if rep.ok and server is not None:
            listing = list_devices(describe_build("rpc", server), ["--rpc", str(ep)])
            rep.devices = [d for d in listing.devices if d.kind == "RPC"]
            if listing.problem:
                rep.problem = f"RPC endpoint {ep}: llama-server could not list its devices. {listing.problem}"
        out.append(rep)
    return out
