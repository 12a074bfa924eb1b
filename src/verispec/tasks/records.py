"""Reading a dataset file into records: JSONL, a JSON array or JSON-lines ``.json``, any of them ``.gz``.

:func:`iter_records` yields ``(line number, parsed record)`` (1-based; for a JSON array, the element index)
and raises :class:`BadRow` for a record that cannot be parsed, naming the line; bytes that are not UTF-8
are named by line too (:func:`not_utf8`).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class BadRow(Exception):
    """A row that cannot become a Problem (the message is the reason)."""


def open_bytes(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    return open(path, "rb")


def not_utf8(raw: bytes, exc: UnicodeDecodeError) -> BadRow:
    return BadRow(f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at column {exc.start + 1} (save the file as UTF-8)")


def iter_records(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, record)``; a record that does not parse (bad JSON, bytes that are not
    UTF-8) is a ``BadRow`` instance.

    JSON arrays yield ``(element_index_1based, element)``; a file holding one JSON object yields it
    as line 1; anything else is read as JSON lines (blank lines skipped), each line decoded on its own,
    so one line of bad bytes is one bad row.
    """
    lineno = 0
    with open_bytes(path) as f:
        try:
            head = b""
            bom = f.read(3) == b"\xef\xbb\xbf"     # a UTF-8 byte-order mark (Windows editors) is not data
            f.seek(3 if bom else 0)
            while True:
                ch = f.read(1)
                if not ch or not ch.isspace():
                    head = ch
                    break
            f.seek(3 if bom else 0)
            if head == b"[":
                yield from json_array(f.read())
                return
            for lineno, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    yield lineno, not_utf8(raw, e)
                    continue
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as e:
                    # A pretty-printed single JSON object is not JSON lines: try the whole file.
                    if lineno == 1 and line.strip() == "{":
                        f.seek(3 if bom else 0)
                        try:
                            yield 1, json.loads(f.read().decode("utf-8"))
                            return
                        except (json.JSONDecodeError, UnicodeDecodeError):
                            pass
                    yield lineno, BadRow(f"invalid JSON: {e.msg} (column {e.colno})")
        except (OSError, EOFError) as e:      # e.g. a damaged .gz
            yield lineno + 1, BadRow(f"cannot read the rest of the file: {e}")


def json_array(data: bytes) -> Iterator[tuple[int, Any]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1)
        yield line, BadRow(f"not UTF-8 text: byte 0x{data[e.start]:02x} at line {line}, column {col + 1} "
                            "(save the file as UTF-8)")
        return
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        yield e.lineno, BadRow(f"invalid JSON array: {e.msg} (line {e.lineno}, column {e.colno})")
        return
    yield from enumerate(rows, 1)
