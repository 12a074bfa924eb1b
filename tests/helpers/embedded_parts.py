"""Fake chunk packages of the embedded model pair (to test assembly, checksums and damage)."""

from __future__ import annotations

import hashlib


def fake_embedded_parts(tmp_path, monkeypatch, blobs: list[bytes]) -> str:
    """Chunk files holding ``blobs`` in place of the embedded model's packages; returns their sha256."""
    from verispec.models import embedded as emb

    parts = []
    for k, blob in enumerate(blobs, 1):
        p = tmp_path / "parts" / f"part{k:02d}.bin"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(blob)
        parts.append(p)
    monkeypatch.setattr(emb, "part_paths", lambda role: list(parts))
    return hashlib.sha256(b"".join(blobs)).hexdigest()
