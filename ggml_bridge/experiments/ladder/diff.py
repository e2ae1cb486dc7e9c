"""Byte diff of two files: the first differing byte (each artifact describes it in its own terms)."""

from __future__ import annotations

from pathlib import Path

from ...foundations import cache


def sha256_file(path: Path) -> str:
    return cache.file_sha256(path)


def first_difference(a: Path, b: Path, block: int = 1 << 20) -> tuple[int | None, int]:
    """(offset of the first differing byte or None, bytes compared). Files of different length differ at
    the end of the shorter one."""
    off = 0
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x = fa.read(block)
            y = fb.read(block)
            if x == y:
                off += len(x)
                if not x:
                    return None, off
                continue
            n = min(len(x), len(y))
            for i in range(n):
                if x[i] != y[i]:
                    return off + i, off + i
            return off + n, off + n
