"""Which model shapes ``-sm tensor`` can split over N devices, and how: upstream b11434's rules, read from its code.

llama.cpp splits each weight of a llama model along the meta backend's axes (``src/llama-model.cpp``,
``llama_meta_device_get_split_state``): Q/K/V by whole KV-head groups, the attention output by the same heads,
the FFN's gate/up/down by blocks of ``lcm(block size, 128)`` columns, ``output.weight`` by vocabulary rows (any
count). Each device's share is ``total * (j + 1) / N`` rounded *down* to the granule, the last device takes the
rest: nothing needs to divide evenly, but a count that does not divide gives uneven shares, and fewer KV heads than
devices leaves a device without attention.

``-sm tensor`` needs flash attention (``llama-context.cpp``: "SPLIT_MODE_TENSOR requires flash_attn"; ``-fa auto``
turns it on). The meta device supports an op only where every device does (``ggml-backend-meta.cpp``,
``ggml_backend_meta_device_supports_op``), and CUDA's flash attention has kernels only for head sizes 40, 64, 72,
80, 96, 112, 128 and 256 (with equal K and V sizes; ``ggml-cuda/fattn.cu``, ``ggml_cuda_get_best_fattn_kernel``).
With another head size (the ladder's ``small`` shape has 32) the attention leaves the meta device, its output comes
back mirrored, and the meta backend aborts at the attention output's matrix multiplication::

    GGML_ABORT("unsupported mul_mat split states: node=%s src0=%s axis=%d src1=%s axis=%d", ...)
    -> unsupported mul_mat split states: node=attn_out-0 ... axis=10   (10: GGML_BACKEND_SPLIT_AXIS_MIRRORED)

(``handle_mul_mat`` has a case for a weight split on axis 0 only with an activation split on axis 0 too, the
partial sums the all-reduce then adds.) The CPU backend's flash attention takes any head size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .model import Shape

#: head sizes CUDA's flash attention has kernels for (K and V of the same size), b11434 ggml-cuda/fattn.cu
CUDA_FA_HEAD_SIZES = (40, 64, 72, 80, 96, 112, 128, 256)
#: the FFN's granule for f16/f32 weights: lcm(block size 1, 128)
FFN_GRANULE = 128
#: the device counts the ladder's and bench's tensor rungs use
TENSOR_DEVICE_COUNTS = (2, 3, 4, 6)
#: GGUF architectures b11434 refuses -sm tensor for (src/llama-arch.cpp ``llm_arch_supports_sm_tensor``: "LLAMA_SPLIT_
#: MODE_TENSOR not implemented for architecture ..."); every other one is split by the rules above
UNSUPPORTED_ARCHITECTURES = frozenset(
    "grok mpt plamo2 minicpm3 gemma3n mamba mamba2 jamba falcon-h1 olmo2 olmoe deepseek2 deepseek32 hy_v4 dots3note "
    "glm-dsa bitnet t5 nemotron_h nemotron_h_moe granitehybrid minimax-01 minimax-m2 minimax-m3 mistral4 kimi-linear "
    "bailingmoe3 kimi-k3 glm5-next qwen3tts".split()
)


def shares(total: int, granule: int, n: int) -> tuple[int, ...]:
    """Each device's share of ``total`` elements split in units of ``granule`` as upstream does (even split weights:
    ``total * (j + 1) / n`` rounded down to the granule, the last device the rest)."""
    out, low = [], 0
    for j in range(n - 1):
        high = total * (j + 1) // n
        high -= high % granule
        out.append(high - low)
        low = high
    out.append(total - low)
    return tuple(out)


def q_granule(shape: Shape, n: int) -> int:
    """``granularity_q`` of llama-model.cpp for f16/f32 weights (block size 1): a KV group's Q columns, in blocks
    doubled up to 128 while the devices stay fed."""
    n_gqa = shape.n_head // shape.n_head_kv
    n_embd_q = n_gqa * shape.head_dim
    block = 1
    while block < 128 and block * n < n_embd_q:
        block *= 2
    return math.lcm(n_embd_q, block)


@dataclass(frozen=True)
class SplitCheck:
    """How ``-sm tensor`` splits a shape over ``devices``: per-device shares, what stops it, what makes it uneven."""

    devices: int
    kv_heads: tuple[int, ...]
    ffn: tuple[int, ...]
    vocab: tuple[int, ...]
    problems: tuple[str, ...]
    """Reasons it does not run (an abort) or leaves a device idle."""
    notes: tuple[str, ...]
    """Uneven shares (it runs; the largest share sets the pace)."""

    @property
    def ok(self) -> bool:
        return not self.problems


def check(shape: Shape, devices: int, cuda: bool = True, n_vocab: int = 32000) -> SplitCheck:
    """The split of ``shape`` over ``devices`` (CUDA devices where ``cuda``, else e.g. CPU rpc-servers)."""
    n_gqa = shape.n_head // shape.n_head_kv
    kv_granule = q_granule(shape, devices) // n_gqa
    kv = tuple(s // shape.head_dim for s in shares(shape.n_embd_kv, kv_granule, devices))
    ffn = shares(shape.n_ff, FFN_GRANULE, devices)
    vocab = shares(n_vocab, 1, devices)
    problems, notes = [], []
    if cuda and shape.head_dim not in CUDA_FA_HEAD_SIZES:
        problems.append(
            f"head size {shape.head_dim}: CUDA's flash attention (which -sm tensor needs) has no kernel for it "
            f"(ggml-cuda/fattn.cu: {', '.join(map(str, CUDA_FA_HEAD_SIZES))}); the meta backend aborts with "
            "'unsupported mul_mat split states: node=attn_out-0 ... axis=10'"
        )
    if min(kv) == 0:
        problems.append(f"{shape.n_head_kv} KV heads over {devices} devices: a device gets none ({_list(kv)})")
    if min(ffn) == 0:
        problems.append(f"n_ff {shape.n_ff} over {devices} devices in blocks of {FFN_GRANULE}: a device gets none")
    if min(kv) and len(set(kv)) > 1:
        notes.append(f"KV heads per device {_list(kv)} (n_head_kv {shape.n_head_kv} does not divide by {devices})")
    if min(ffn) and len(set(ffn)) > 1:
        notes.append(f"FFN columns per device {_list(ffn)} (n_ff / {FFN_GRANULE} does not divide by {devices})")
    if len(set(vocab)) > 1:
        notes.append(f"vocabulary rows per device {_list(vocab)}")
    return SplitCheck(devices, kv, ffn, vocab, tuple(problems), tuple(notes))


def _list(xs: tuple[int, ...]) -> str:
    return "/".join(map(str, xs))
