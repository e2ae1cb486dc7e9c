"""The ladder file: rungs, their keys and checks (TOML -> :class:`Ladder`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ...foundations import files, tomlfile
from ...foundations.config import Settings
from ...foundations.errors import FatalError, LadderSetupError, UsageError
from ...foundations.tomlfile import Key
from ...runtime import modes
from .. import model, tensor_split
from .kinds import SWITCHES, Boundaries, RpcFront, from_switches
from .sides import DEFAULT_SIDES, Side, canonical_run, mode_of, parse_sides

EXPECT_VALUES = ("engaged", "inactive", "either", "idle")
#: ``idle``: the mechanism must say it is enabled; work is reported, not required (batching in -sm tensor's graphs,
#: whose inputs go to the Meta device, stages nothing)
#: the builds a ladder file may name (``backend``): whose latest upstream and patched builds it compares
LADDER_BACKENDS = tuple(modes.BACKENDS)
SPLIT_MODES = ("none", "layer", "row", "tensor")


@dataclass(frozen=True)
class Rung:
    name: str
    shape: model.Shape
    seed: int = 1234
    devices: int = 0  # GPUs (CUDA_VISIBLE_DEVICES first N); 0 = CPU only
    virtual_devices: int | None = None  # GGML_CUDA_DEVICES: virtual cards over the GPUs
    # devices the model is split over when server_args name more than the GPUs give (e.g. -dev CUDA0,Vulkan0 on
    # one GPU): the log must show it on that many
    split_devices: int | None = None
    split_mode: str = "layer"
    # -sm tensor: GGML_CUDA_ALLREDUCE of every mode (a mode that names one must name the same); None: unset
    allreduce: str | None = None
    gpu_layers: int | None = None  # -ngl; default 999 with devices, 0 without
    ubatch: int = 512
    batch: int = 2048
    ctx: int | None = None  # server -c; default fits the longest prompt
    ppl_ctx: int | None = None  # llama-perplexity -c; default = batch if it divides, else ubatch
    modes: list[str] = field(default_factory=lambda: ["upstream", "off"])
    reference: str = "off"
    expect_bridge: str = "engaged"
    expect_batched: str = "engaged"
    expect: dict[str, str] = field(default_factory=dict)  # per mode, overrides expect_* for that mode
    n_predict: int = 8
    n_probs: int = 4
    prompt_words: list[int] | None = None
    threads: int | None = None
    server_args: list[str] = field(default_factory=list)
    perplexity_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 1800.0
    skips: frozenset[str] = frozenset()  # artifacts (ARTIFACTS' names) the rung does not produce
    rpc_servers: list[list[str]] = field(default_factory=list)  # device lists of the rpc-* modes' servers
    rpc_env: list[dict[str, str]] = field(default_factory=list)  # per rpc-server extra environment (same order)
    rpc_front: RpcFront = RpcFront.BARE  # rpc-* modes: where llama-server and llama-perplexity run
    rpc_link: str | None = None  # rpc-* modes: a shaped link RATE/DELAY to each rpc-server (shaper.py)
    boundaries: Boundaries = Boundaries.REQUIRED  # bridge modes on a multi-device rung
    # batched modes: backend -> the host buffer type its pinned pool must come from, or "none" (it must have none),
    # as the mechanism's ``pools:`` line says (e.g. Vulkan's host buffer type belongs to device 0 only)
    expect_pools: dict[str, str] = field(default_factory=dict)

    @property
    def n_devices(self) -> int:
        """Devices the model is meant to be split over (virtual cards count; -sm tensor without GPUs: the rpc-servers'
        devices, which the meta backend splits over)."""
        if self.devices <= 0 and self.split_mode == "tensor" and self.rpc_servers:
            return sum(len(x) for x in self.rpc_servers)
        if self.devices <= 0 or self.split_mode == "none":
            return 0 if self.devices <= 0 else 1
        return self.split_devices or self.virtual_devices or self.devices

    @property
    def multi_device(self) -> bool:
        return self.n_devices > 1

    def prompts_words(self) -> list[int]:
        if self.prompt_words:
            return list(self.prompt_words)
        ub = self.ubatch
        sizes = [1, 12, max(2, ub // 2), ub + 17]
        if ub <= 64:
            sizes.append(3 * ub + 5)
        return sorted(set(sizes))

    def server_ctx(self) -> int:
        if self.ctx:
            return self.ctx
        need = max(self.prompts_words()) + self.n_predict + 64
        need = int(need * 1.1)
        return max(256, (need + 255) // 256 * 256)

    def perplexity_ctx(self) -> int:
        if self.ppl_ctx:
            return self.ppl_ctx
        return self.batch if self.batch >= 16 else max(16, self.ubatch)


def _as_list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, (list, tuple)) else [v]


RUNG_KEYS = {f.name for f in fields(Rung)} - {name for name, _, _ in SWITCHES.values()} | set(SWITCHES)

_INT_MAX = 2**31 - 1  # the C ints llama.cpp parses these into
#: integer keys of a rung and their smallest value; ``None`` allowed for the optional ones
RUNG_INTS: dict[str, tuple[int, bool]] = {
    "seed": (0, False),
    "devices": (0, False),
    "ubatch": (1, False),
    "batch": (1, False),
    "n_predict": (1, False),
    "n_probs": (0, False),
    "virtual_devices": (1, True),
    "split_devices": (1, True),
    "gpu_layers": (0, True),
    "ctx": (1, True),
    "ppl_ctx": (1, True),
    "threads": (1, True),
}
#: the largest n_probs asked of llama-server (it returns that many candidates per token)
MAX_N_PROBS = 1000
RUNG_STRS = ("name", "split_mode", "reference", "expect_bridge", "expect_batched", "allreduce")
#: the rung keys of one plain kind, checked by :func:`ggml_bridge.foundations.tomlfile.check` (the bench's suites are too)
RUNG_SCHEMA: dict[str, Key] = {
    **{k: Key("int", low, MAX_N_PROBS if k == "n_probs" else _INT_MAX) for k, (low, _) in RUNG_INTS.items()},
    "timeout": Key("number", 0),
    **{k: Key("str") for k in RUNG_STRS},
    **{k: Key("bool") for k in SWITCHES},
}
#: the keys that may be given as nothing (TOML has no null: only [defaults] merged in code)
RUNG_OPTIONAL = {k for k, (_, optional) in RUNG_INTS.items() if optional} | {"allreduce"}


def _check_rung_types(merged: dict[str, Any], where: str) -> None:
    """Every value of a rung has its key's type and range: a TOML ``nan``, ``inf``, ``"8"`` or ``1.5`` where an
    integer belongs is a LadderSetupError naming the key, not a crash (or a silent conversion) later."""

    def bad(key: str, expected: str) -> LadderSetupError:
        return LadderSetupError(
            f"{where}: {key} = {merged[key]!r} is not {expected}",
            fix="write a plain TOML value of that kind (no quotes around numbers)",
        )

    simple = {k: v for k, v in merged.items() if k in RUNG_SCHEMA and not (v is None and k in RUNG_OPTIONAL)}
    tomlfile.check(simple, RUNG_SCHEMA, where, LadderSetupError)
    for key in ("modes", "server_args", "perplexity_args"):
        v = merged.get(key, [])
        items = _as_list(v) if key == "modes" else v  # modes may be one name; the argument lists are lists
        if not isinstance(items, list) or not all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in items):
            raise bad(key, "a list of strings")
    for key in ("expect", "env", "expect_pools"):
        v = merged.get(key, {})
        if not isinstance(v, dict) or not all(isinstance(x, (str, int, float, bool)) for x in v.values()):
            raise bad(key, "a table of strings")
    pw = merged.get("prompt_words")
    if pw is not None and not (
        isinstance(pw, list) and all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= _INT_MAX for x in pw)
    ):
        raise bad("prompt_words", "a list of positive integers")
    rs = merged.get("rpc_servers", [])
    if not (
        isinstance(rs, list)
        and all(isinstance(x, (str, list)) for x in rs)
        and all(isinstance(d, str) for x in rs for d in _as_list(x))
    ):
        raise bad("rpc_servers", "a list of device lists")


def parse_rung(d: dict[str, Any], defaults: dict[str, Any], where: str, sides: dict[str, Side] | None = None) -> Rung:
    """One ``[[rung]]`` over ``[defaults]``, every key checked; a LadderSetupError naming the rung otherwise."""
    r = _check_modes(_make_rung(d, defaults, where), where, DEFAULT_SIDES if sides is None else sides)
    _check_sizes(r, where)
    r = replace(
        _check_rpc(r, where),
        server_args=[str(a) for a in r.server_args],
        perplexity_args=[str(a) for a in r.perplexity_args],
        env={str(k): str(v) for k, v in r.env.items()},
        expect_pools={str(k): str(v) for k, v in r.expect_pools.items()},
    )
    if r.expect_pools and not any(mode_of(m).uses_batched for m in r.modes):
        raise LadderSetupError(f"{where} ({r.name}): expect_pools needs a batched mode")
    return r


def _make_rung(d: dict[str, Any], defaults: dict[str, Any], where: str) -> Rung:
    if not isinstance(d, dict) or not isinstance(defaults, dict):
        raise LadderSetupError(f"{where}: a rung (and [defaults]) must be a table")
    merged = {**defaults, **d}
    unknown = set(merged) - RUNG_KEYS
    if unknown:
        raise LadderSetupError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}", fix=f"allowed keys: {', '.join(sorted(RUNG_KEYS))}"
        )
    if "name" not in merged:
        raise LadderSetupError(f"{where}: a rung needs a name")
    if "shape" not in merged:
        raise LadderSetupError(f"{where} ({merged['name']}): a rung needs a shape")
    _check_rung_types(merged, where)
    files.plain_name(merged["name"], f"{where}: the rung name", LadderSetupError)  # a file name in --report
    if not isinstance(merged["shape"], (str, dict)):
        raise LadderSetupError(f"{where} ({merged['name']}): shape must be a preset name or a table")
    try:
        merged["shape"] = model.get_shape(merged["shape"])
    except FatalError as e:
        raise LadderSetupError(f"{where} ({merged['name']}): {e}") from None
    except (TypeError, ValueError, ArithmeticError) as e:  # a shape table with values of the wrong kind
        raise LadderSetupError(f"{where} ({merged['name']}): bad shape", why=f"{type(e).__name__}: {e}") from None
    try:
        return Rung(**from_switches(merged))
    except TypeError as e:
        raise LadderSetupError(f"{where}: {e}") from None


def _check_modes(r: Rung, where: str, known: dict[str, Side]) -> Rung:
    """The runs (``MODE`` or ``SIDE:MODE``) by their current names, the reference among them, the expectations."""
    at = f"{where} ({r.name})"
    try:  # current names (older ones with a deprecation note, see modes.ALIASES)
        runs = [canonical_run(str(m), known, at) for m in _as_list(r.modes)]
        reference = canonical_run(str(r.reference), known, f"{at} reference")
        expect = {canonical_run(str(k), known, f"{at} expect"): str(v) for k, v in dict(r.expect).items()}
    except UsageError as e:
        raise LadderSetupError(e.what, why=e.why, fix=e.fix) from None
    other = [m for m in runs if mode_of(m).variant not in ("patched", "upstream")]
    if other:
        raise LadderSetupError(
            f"{where} ({r.name}): mode(s) {', '.join(other)} need the {mode_of(other[0]).variant} build",
            why="the ladder compares the patched and upstream builds only",
            fix="use modes of those two builds",
        )
    if reference not in runs:
        runs.insert(0, reference)
    if len(runs) < 2:
        raise LadderSetupError(f"{where} ({r.name}): a rung compares at least two modes")
    for k in ("expect_bridge", "expect_batched"):
        if getattr(r, k) not in EXPECT_VALUES:
            raise LadderSetupError(f"{where} ({r.name}): {k} must be one of {', '.join(EXPECT_VALUES)}")
    for k, val in expect.items():
        if k not in runs or val not in EXPECT_VALUES:
            raise LadderSetupError(
                f"{at}: expect.{k} = {val!r}: keys are the rung's modes, values one of {', '.join(EXPECT_VALUES)}"
            )
    return replace(r, modes=runs, reference=reference, expect=expect)


def _check_sizes(r: Rung, where: str) -> None:
    if r.split_mode not in SPLIT_MODES:
        raise LadderSetupError(f"{where} ({r.name}): split_mode must be one of {', '.join(SPLIT_MODES)}")
    if r.ubatch <= 0 or r.batch <= 0 or r.ubatch > r.batch:
        raise LadderSetupError(f"{where} ({r.name}): need 0 < ubatch <= batch (got {r.ubatch}, {r.batch})")
    pc = r.perplexity_ctx()
    if not (r.batch < pc or r.batch % pc == 0):
        raise LadderSetupError(
            f"{where} ({r.name}): llama-perplexity needs batch < ppl_ctx or batch a multiple "
            f"of ppl_ctx (batch {r.batch}, ppl_ctx {pc})"
        )
    if r.server_ctx() < max(r.prompts_words()) + r.n_predict + 16:
        raise LadderSetupError(f"{where} ({r.name}): ctx {r.server_ctx()} is too small for the longest prompt")
    if any(mode_of(m).uses_bridge for m in r.modes) and r.devices <= 0:
        raise LadderSetupError(f"{where} ({r.name}): bridge modes need GPUs (devices >= 1)")
    _check_tensor(r, where)


def _check_tensor(r: Rung, where: str) -> None:
    """-sm tensor: the modes' split and all-reduce agree with the rung's (one all-reduce per rung: the paths round
    differently, so only runs of one path compare byte for byte)."""
    at = f"{where} ({r.name})"
    if r.allreduce is not None and r.allreduce not in modes.ALLREDUCE_VALUES:
        raise LadderSetupError(f"{at}: allreduce must be one of {', '.join(modes.ALLREDUCE_VALUES)}")
    splits = {s for s in (mode_of(m).split for m in r.modes) if s is not None}
    if splits and splits != {r.split_mode}:
        raise LadderSetupError(f"{at}: mode(s) split {', '.join(sorted(splits))}, the rung {r.split_mode}")
    classes = {m: _rounding(r, m) for m in r.modes}
    if len(set(classes.values())) > 1:
        raise LadderSetupError(
            f"{at}: the modes take different all-reduces ({', '.join(f'{m}: {c}' for m, c in classes.items())})",
            why="upstream's internal all-reduce of two devices rounds F32 through BF16: only runs that round alike "
            "compare byte for byte (the butterfly, the bridge's all-reduce and internal at "
            "GGML_CUDA_AR_BF16_THRESHOLD=0 add the same floats)",
            fix="one rung per rounding (the rung's allreduce key, or modes of one)",
        )
    if r.allreduce is not None and r.split_mode != "tensor":
        raise LadderSetupError(f"{at}: allreduce applies to split_mode = \"tensor\" only")


def _check_tensor_shape(r: Rung, where: str, cuda: bool) -> None:
    """A -sm tensor rung's shape splits over its devices (:mod:`ggml_bridge.experiments.tensor_split`), else the rung would only
    show upstream's abort."""
    if r.split_mode != "tensor":
        return
    n = max(r.n_devices, 1)
    found = tensor_split.check(r.shape, n, cuda=cuda)
    if not found.ok:
        raise LadderSetupError(
            f"{where}: -sm tensor cannot split shape {r.shape.name} over {n} devices",
            why="; ".join(found.problems),
            fix="use a tensor-* shape (ggml-bridge model --help)",
        )


def _rounding(r: Rung, run: str) -> str:
    """How a run's all-reduce rounds: ``bf16`` (upstream's internal path on two devices at its default threshold),
    else ``f32`` (the butterfly's additions, which the bridge's all-reduce and internal at threshold 0 reproduce)."""
    threshold = mode_of(run).ar_bf16_threshold or r.env.get(modes.AR_BF16_THRESHOLD)
    internal = effective_allreduce(r, run) in (None, "internal", "nccl") and r.n_devices == 2
    return "bf16" if internal and threshold != "0" else "f32"


def effective_allreduce(r: Rung, run: str) -> str | None:
    """The GGML_CUDA_ALLREDUCE value a run of the rung takes, as its processes get it: the rung's ``env`` (set last),
    else its mode's, else the rung's ``allreduce`` (None: unset)."""
    return r.env.get(modes.ALLREDUCE) or mode_of(run).allreduce or r.allreduce


def _check_rpc(r: Rung, where: str) -> Rung:
    """The rpc-servers' device lists and environments, the front, the shaped link: as strings, checked."""
    servers = [[str(d) for d in _as_list(x)] for x in _as_list(r.rpc_servers)]
    if any(mode_of(m).rpc for m in r.modes) and not servers:
        raise LadderSetupError(
            f"{where} ({r.name}): rpc-* modes need rpc_servers (one device list per server)",
            fix='e.g. rpc_servers = [["CPU"], ["CPU"]]',
        )
    rpc_like = f"{where} ({r.name})"
    envs = _as_list(r.rpc_env) if r.rpc_env else []
    if envs and (len(envs) != len(servers) or not all(isinstance(e, dict) for e in envs)):
        raise LadderSetupError(
            f"{rpc_like}: rpc_env needs one table per rpc-server ({len(servers)})",
            fix='e.g. rpc_env = [{ GGML_CUDA_DEVICES = "2" }]',
        )
    rpc_env = [{str(k): str(v) for k, v in e.items()} for e in envs]
    front_gpu = r.rpc_front is RpcFront.GPU
    if (rpc_env or front_gpu or r.rpc_link) and not any(mode_of(m).rpc for m in r.modes):
        raise LadderSetupError(f"{rpc_like}: rpc_env, rpc_front_gpu and rpc_link need rpc-* modes")
    if front_gpu and r.devices <= 0:
        raise LadderSetupError(f"{rpc_like}: rpc_front_gpu needs devices >= 1")
    link = r.rpc_link
    if link is not None:
        from ...runtime.shaper import parse_link

        try:
            link = str(parse_link(str(link)))
        except UsageError as e:
            raise LadderSetupError(f"{rpc_like}: rpc_link: {e.what}", fix=e.fix) from None
    return replace(r, rpc_servers=servers, rpc_env=rpc_env, rpc_link=link)


@dataclass(frozen=True)
class Ladder:
    name: str
    path: Path
    backend: str
    rungs: list[Rung]
    description: str = ""
    text_seed: int = 7
    sides: dict[str, Side] = field(default_factory=lambda: dict(DEFAULT_SIDES))


def load_ladder(path: Path) -> Ladder:
    data = tomlfile.read(path, "ladder file", LadderSetupError)
    known = {"name", "description", "backend", "defaults", "rung", "text_seed", "sides"}
    unknown = set(data) - known
    if unknown:
        raise LadderSetupError(f"{path}: unknown top-level key(s) {', '.join(sorted(unknown))}")
    defaults = data.get("defaults", {})
    rungs_raw = data.get("rung", [])
    if not rungs_raw:
        raise LadderSetupError(f"{path}: no [[rung]] entries")
    if not isinstance(rungs_raw, list) or not isinstance(defaults, dict):
        raise LadderSetupError(f"{path}: rungs are [[rung]] tables and [defaults] is a table")
    for key, kind in (("name", str), ("description", str), ("backend", str), ("text_seed", int)):
        v = data.get(key)
        if v is not None and (not isinstance(v, kind) or isinstance(v, bool)):
            raise LadderSetupError(f"{path}: {key} = {v!r} is not a{'n integer' if kind is int else ' string'}")
    sides = parse_sides(data.get("sides"), str(path))
    rungs = [parse_rung(r, defaults, f"{path} rung {i + 1}", sides) for i, r in enumerate(rungs_raw)]
    names = [r.name for r in rungs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise LadderSetupError(f"{path}: duplicate rung name(s) {', '.join(sorted(dup))}")
    if "name" in data:  # it names the report folder in the cache
        files.plain_name(data["name"], f"{path}: the ladder name", LadderSetupError)
    backend = data.get("backend", "cpu")
    if backend not in LADDER_BACKENDS:
        raise LadderSetupError(f"{path}: backend must be one of {', '.join(LADDER_BACKENDS)}")
    for r in rungs:
        _check_tensor_shape(r, f"{path} ({r.name})", cuda=modes.BACKENDS[backend].cuda and r.devices > 0)
    return Ladder(
        name=data.get("name", Path(path).stem),
        path=Path(path),
        backend=backend,
        rungs=rungs,
        description=data.get("description", ""),
        text_seed=int(data.get("text_seed", 7)),
        sides=sides,
    )


def default_ladder(settings: Settings) -> Path:
    backend = getattr(getattr(settings, "build", None), "backend", "cpu")
    name = f"{backend}.toml" if backend in modes.BACKENDS else "cpu.toml"
    here = Path(__file__).resolve().parents[2]  # ggml_bridge
    for root in (getattr(settings, "project_dir", None), here.parent, here / "_data"):
        if root is not None and (Path(root) / "ladders" / name).is_file():
            return Path(root) / "ladders" / name
    raise LadderSetupError(f"no ladders/{name} found", fix="pass --ladder FILE")
