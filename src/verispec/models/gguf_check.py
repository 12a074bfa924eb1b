"""Read a GGUF file's header and check that the file is whole, before llama.cpp sees it.

llama.cpp says only "Failed to load model from file" for a file that is not GGUF, is empty, was cut
short by an interrupted download or copy, or holds a model it does not know. :func:`check_gguf`
parses the header (magic, version, metadata, tensor table; stdlib only, no tensor data is read)
and compares the size the tensor table needs with the file's size, so that the error says which of
these it is and what to do. :func:`gguf_info` returns what it read: architecture, training context
length, tensor count, the size the file must have.

Layout (GGUF v2/v3, little-endian): ``b"GGUF"``, ``uint32`` version, ``uint64`` tensor count,
``uint64`` metadata count, the metadata (``string`` key, ``uint32`` type, value), the tensor infos
(``string`` name, ``uint32`` n_dims, ``uint64`` dims, ``uint32`` ggml type, ``uint64`` offset),
padding to ``general.alignment`` (default 32), then the tensor data.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GGUF"
#: ggml type id -> (elements per block, bytes per block); ids from ggml.h
GGML_BLOCKS: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    34: (256, 54), 35: (256, 66), 39: (32, 17),
}
# metadata value types: fixed sizes (struct formats); 8 = string, 9 = array
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """A file that llama.cpp could not load as a model, with the reason and what to do."""


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    version: int
    n_tensors: int
    architecture: str | None
    context_length: int | None      # the model's training context (``<arch>.context_length``)
    file_size: int
    needed_size: int | None         # bytes the tensor table needs (None: a tensor of an unknown type)


class _Truncated(Exception):
    pass


class _Reader:
    def __init__(self, buf) -> None:
        self.buf, self.at, self.n = buf, 0, len(buf)

    def take(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        if self.at + size > self.n:
            raise _Truncated
        value = struct.unpack_from("<" + fmt, self.buf, self.at)
        self.at += size
        return value[0] if len(value) == 1 else value

    def string(self) -> bytes:
        length = self.take("Q")
        if self.at + length > self.n:
            raise _Truncated
        out = bytes(self.buf[self.at:self.at + length])
        self.at += length
        return out

    def skip_strings(self, count: int) -> None:
        buf, at, n = self.buf, self.at, self.n
        for _ in range(count):
            if at + 8 > n:
                raise _Truncated
            at += 8 + struct.unpack_from("<Q", buf, at)[0]
        if at > n:
            raise _Truncated
        self.at = at

    def value(self, kind: int):
        if kind in _SCALAR:
            return self.take(_SCALAR[kind])
        if kind == _STRING:
            return self.string().decode("utf-8", "replace")
        if kind == _ARRAY:
            inner, count = self.take("I"), self.take("Q")
            if inner in _SCALAR:
                size = struct.calcsize("<" + _SCALAR[inner]) * count
                if self.at + size > self.n:
                    raise _Truncated
                self.at += size
            elif inner == _STRING:
                self.skip_strings(count)
            else:
                for _ in range(count):
                    self.value(inner)
            return None
        raise ValueError(f"unknown metadata value type {kind}")


def _size_text(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def gguf_info(path: str | os.PathLike) -> GGUFInfo:
    """Parse the header of the GGUF file ``path``; :class:`GGUFError` says why it is not a usable one."""
    path = Path(path)
    redo = "re-download or re-copy the file (a .gguf model from its publisher), or pass another --target / --draft"
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read the model file ({exc.strerror})") from None
    if size == 0:
        raise GGUFError(f"{path} is empty (0 bytes), not a GGUF model; {redo}")
    with open(path, "rb") as fh:
        head = fh.read(4)
        if head != MAGIC:
            raise GGUFError(f"{path} is not a GGUF model file: it starts with {head!r}, a GGUF file with "
                            f"{MAGIC!r}; {redo}")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(path, buf, size, redo)


def _parse(path: Path, buf, size: int, redo: str) -> GGUFInfo:
    r = _Reader(buf)
    r.at = 4
    try:
        version = r.take("I")
        if version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {version} is not one this llama.cpp reads (2 or 3); the file may "
                            f"be damaged or too new: {redo}")
        n_tensors, n_kv = r.take("Q"), r.take("Q")
        if n_tensors > 1 << 24 or n_kv > 1 << 24:
            raise GGUFError(f"{path}: the header claims {n_tensors} tensors and {n_kv} metadata entries; the file is "
                            f"damaged: {redo}")
        meta: dict[str, object] = {}
        for _ in range(n_kv):
            key = r.string().decode("utf-8", "replace")
            kind = r.take("I")
            try:
                meta[key] = r.value(kind)
            except ValueError:
                raise GGUFError(f"{path}: metadata entry {key!r} has an unknown type {kind}; the file is damaged or "
                                f"newer than this reader: {redo}") from None
        arch = meta.get("general.architecture")
        arch = arch if isinstance(arch, str) else None
        ctx = meta.get(f"{arch}.context_length") if arch else None
        align = meta.get("general.alignment")
        align = align if isinstance(align, int) and align > 0 else 32
        end, known = 0, True
        for _ in range(n_tensors):
            r.string()
            n_dims = r.take("I")
            if n_dims > 8:
                raise GGUFError(f"{path}: a tensor has {n_dims} dimensions; the file is damaged: {redo}")
            dims = [r.take("Q") for _ in range(n_dims)]
            kind, offset = r.take("I"), r.take("Q")
            block = GGML_BLOCKS.get(kind)
            n_el = 1
            for d in dims:
                n_el *= d
            if block is None:
                known = False
                end = max(end, offset)
            else:
                end = max(end, offset + n_el // block[0] * block[1])
        data_start = -(-r.at // align) * align
    except _Truncated:
        raise GGUFError(f"{path} is cut short: its {_size_text(size)} end inside the GGUF header (an interrupted "
                        f"download or copy); {redo}") from None
    needed = data_start + end
    if size < needed:
        raise GGUFError(f"{path} is cut short: its tensors need {needed} bytes ({_size_text(needed)}), the file has "
                        f"{size} ({100 * size / needed:.1f}%) -- an interrupted download or copy; {redo}")
    return GGUFInfo(path, version, n_tensors, arch, ctx if isinstance(ctx, int) else None, size,
                    needed if known else None)


def check_gguf(path: str | os.PathLike) -> GGUFInfo:
    """:func:`gguf_info`, for callers that only want the check."""
    return gguf_info(path)
