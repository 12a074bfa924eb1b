"""Compact records of verified positions: exact ``p``/``q`` on a kept token set plus one "rest" bucket.

Record format
=============
For every recorded position (one drafted position of one verification step) the recorder keeps a
set ``K`` of vocabulary ids and stores, for each ``v ∈ K``, the exact processed probabilities
``p(v)``, ``q(v)`` (float32, as the sampling pipeline produced them). Everything else is summarised.

Choice of ``K`` (``tol``, ``max_keep``):

* if ``|supp p ∪ supp q| <= max_keep`` (always the case with top-k / top-p sampling) ``K`` is the
  whole union of the supports: the record is **lossless** (``p_rest = q_rest = 0``);
* otherwise ``K`` = (smallest top set of ``p`` whose complement has mass ``<= tol``)
  ∪ (the same for ``q``), each capped at ``max_keep`` tokens, so normally ``p_rest, q_rest <= tol``
  (more only when a cap is hit — reported by :meth:`PositionRecorder.summary`);
* the drafted token is always added to ``K`` when it is known (``draft_token`` field).

``K`` is stored in increasing vocabulary order so that ``argmax`` ties resolve exactly as on the full
row. Per position, with ``R = V ∖ K`` (computed in float64 on the full rows at record time):

=================== ===============================================================================
``p_rest, q_rest``  ``p(R)``, ``q(R)``
``p_rest_max``      ``max_{v∈R} p(v)`` (``q_rest_max`` likewise)
``qp_rest_max``     ``max_{v∈R, p(v)>0} q(v)/p(v)`` (0 when ``R`` holds no ``p`` mass)
``qp_rest_min``     ``min_{v∈R, p(v)>0} q(v)/p(v)`` (``inf`` when ``R`` holds no ``p`` mass)
``q_rest_on_p0``    ``q(R ∩ {p = 0})``
``target_entropy``  ``H(p)`` in nats on the full row (``draft_entropy``: ``H(q)``)
=================== ===============================================================================

``p_rest``/``q_rest`` are the raw sums (so that decompression renormalises exactly as a full row is
renormalised); the other statistics are taken on the renormalised full rows ``p/Σp``, ``q/Σq``
(float32 rows sum to one only within ~1e-6). These statistics are what :mod:`verispec.diagnose.measures`
needs to *bound* the error of every measure computed on the coarsened pair (see that module). Meta
per position: ``dataset``, ``problem_id`` (strings), ``step`` (verification step index within the
generation), ``position`` (0..G−1 in the block), ``accepted`` (1/0, −1 unknown), ``draft_token``
(−1 unknown).

Decompression (:meth:`PositionRecorder.dense`) yields ``[n, W+1]`` float64 rows: the kept
probabilities (padded with zeros to the widest row ``W``) and the rest mass in the last column
("rest" bucket), renormalised to sum to one. This is a *coarsening* of the true distributions;
zero padding is harmless because every rule gives zero induced and reference mass to tokens with
``p = q = 0``.

Memory and disk: ``12 bytes`` per kept token (int32 id + two float32) + ``91 bytes`` of per-position
statistics, meta and offset. Measured on synthetic 152k-vocabulary rows (``tests/test_diagnose.py``
generator): temperature 0.7 + top-k 20 + top-p 0.8 — 2.9 kept tokens on average, 126 B/position in
memory, 34 B/position in the compressed file, every record lossless; temperature 0.7 alone — ~4000
kept tokens (many rows hit the 4096 cap), 48 kB/position in memory, 36 kB on disk.
:meth:`PositionRecorder.bytes_per_position` reports the in-memory size; :meth:`save` writes one
compressed ``.npz`` file and :meth:`load` restores bit-identical arrays. Recording costs ~8 ms per
row on the fast (whole-support) path and ~40 ms on the top-mass path (one CPU thread).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

FORMAT = "verispec.diagnose.records"
FORMAT_VERSION = 1

#: per-position float statistics (name -> numpy dtype)
_STAT_FIELDS = {
    "p_rest": np.float64,
    "q_rest": np.float64,
    "p_rest_max": np.float64,
    "q_rest_max": np.float64,
    "qp_rest_max": np.float64,
    "qp_rest_min": np.float64,
    "q_rest_on_p0": np.float64,
    "target_entropy": np.float32,
    "draft_entropy": np.float32,
}
#: per-position integer meta (name -> numpy dtype, default)
_INT_META = {
    "step": (np.int32, -1),
    "position": (np.int16, -1),
    "accepted": (np.int8, -1),
    "draft_token": (np.int32, -1),
}
_STR_META = ("dataset", "problem_id")


def _entropy64(x: torch.Tensor) -> torch.Tensor:
    logx = torch.where(x > 0, x.log(), torch.zeros_like(x))
    return -(x * logx).sum(-1)


def _top_mass(x: torch.Tensor, total: float, tol: float, cap: int) -> torch.Tensor:
    """Ids of the smallest top set of ``x`` whose complement has mass ``<= tol`` (at most ``cap``)."""
    nnz = int((x > 0).sum())
    limit = min(cap, nnz)
    k = min(64, limit)
    while True:
        vals, idx = torch.topk(x, k, sorted=True)
        rest = total - vals.double().cumsum(0)
        ok = (rest <= tol).nonzero()
        if ok.numel():
            return idx[: int(ok[0, 0]) + 1]
        if k >= limit:
            return idx
        k = min(limit, k * 8)


class PositionRecorder:
    """Accumulates compact records of ``(p, q)`` rows; also the corpus the measures read.

    ``tol``: target bound on ``p_rest`` and ``q_rest`` when the supports are too large to keep;
    ``max_keep``: cap on the tokens kept per distribution (and the size up to which the whole union
    of supports is kept exactly).
    """

    def __init__(self, *, tol: float = 1e-4, max_keep: int = 4096) -> None:
        if not (0 <= tol < 1):
            raise ValueError(f"tol must be in [0, 1), got {tol!r}")
        if max_keep < 1:
            raise ValueError(f"max_keep must be >= 1, got {max_keep!r}")
        self.tol = float(tol)
        self.max_keep = int(max_keep)
        self.vocab_size: int | None = None
        self._chunks: list[dict[str, np.ndarray]] = []
        self._strings: dict[str, list[str]] = {k: [] for k in _STR_META}
        self._codes: dict[str, dict[str, int]] = {k: {} for k in _STR_META}
        self._cache: dict[str, np.ndarray] | None = None

    # ------------------------------------------------------------------ recording
    def add(self, p: torch.Tensor, q: torch.Tensor, meta: Mapping[str, Any] | None = None, **fields: Any) -> None:
        """Record ``N`` positions. ``p, q: [N, V]`` processed probabilities (rows sum to one).

        Meta (``meta`` dict and/or keyword fields; scalars apply to every row, sequences give one value
        per row): ``dataset``, ``problem_id`` (str), ``step`` (int), ``position`` (default ``0..N−1``),
        ``accepted`` (bool / int, −1 unknown), ``draft_token`` (int, −1 unknown; always kept in ``K``).
        """
        info = dict(meta or {})
        info.update(fields)
        unknown = set(info) - set(_INT_META) - set(_STR_META)
        if unknown:
            raise ValueError(f"unknown meta field(s) {sorted(unknown)}; "
                             f"valid: {sorted(set(_INT_META) | set(_STR_META))}")
        if not isinstance(p, torch.Tensor) or not isinstance(q, torch.Tensor):
            raise TypeError("p and q must be torch tensors")
        if p.dim() == 1:
            p, q = p[None], q[None]
        if p.dim() != 2 or p.shape != q.shape:
            raise ValueError("p and q must both be [N, V] with the same shape, "
                             f"got {tuple(p.shape)} and {tuple(q.shape)}")
        n, vocab = p.shape
        if self.vocab_size is not None and vocab != self.vocab_size:
            raise ValueError(f"vocabulary size changed: recorder holds V={self.vocab_size}, got V={vocab}")
        p = p.detach().to("cpu", torch.float32)
        q = q.detach().to("cpu", torch.float32)
        for name, t in (("p", p), ("q", q)):
            if not torch.isfinite(t).all() or (t < 0).any():
                raise ValueError(f"{name} must hold finite non-negative probabilities")
            sums = t.double().sum(-1)
            if ((sums - 1).abs() > 1e-3).any():
                raise ValueError(f"{name} rows must sum to 1 (found {float(sums[(sums - 1).abs() > 1e-3][0]):.6g}); "
                                 "pass processed probabilities, not logits")

        def per_row(name: str, default: Any) -> list:
            v = info.get(name, default)
            if isinstance(v, torch.Tensor):
                v = v.tolist()
            if isinstance(v, (list, tuple, np.ndarray)):
                v = list(v)
                if len(v) != n:
                    raise ValueError(f"meta field {name!r} has {len(v)} values for {n} rows")
                return v
            return [v] * n

        ints = {}
        for name, (dtype, default) in _INT_META.items():
            vals = per_row(name, list(range(n)) if name == "position" else default)
            ints[name] = np.array([int(x) for x in vals], dtype=dtype)
        strs = {}
        for name in _STR_META:
            vals = per_row(name, "")
            strs[name] = np.array([self._code(name, str(x)) for x in vals], dtype=np.int32)

        ids_list, pk_list, qk_list = [], [], []
        stats = {k: np.empty(n, dtype=dt) for k, dt in _STAT_FIELDS.items()}
        for i in range(n):
            ids, st = self._compress_row(p[i], q[i], int(ints["draft_token"][i]))
            ids_list.append(ids)
            pk_list.append(p[i, ids].numpy())
            qk_list.append(q[i, ids].numpy())
            for k, v in st.items():
                stats[k][i] = v
        counts = np.array([len(x) for x in ids_list], dtype=np.int64)
        chunk = {
            "counts": counts,
            "token_ids": np.concatenate([x.numpy().astype(np.int32) for x in ids_list]) if n else np.zeros(0, np.int32),
            "p_kept": np.concatenate(pk_list).astype(np.float32) if n else np.zeros(0, np.float32),
            "q_kept": np.concatenate(qk_list).astype(np.float32) if n else np.zeros(0, np.float32),
            **stats,
            **ints,
            **strs,
        }
        self._chunks.append(chunk)
        self._cache = None
        self.vocab_size = int(vocab)

    def _code(self, name: str, value: str) -> int:
        table = self._codes[name]
        if value not in table:
            table[value] = len(self._strings[name])
            self._strings[name].append(value)
        return table[value]

    def _compress_row(self, p: torch.Tensor, q: torch.Tensor,
                      draft_token: int) -> tuple[torch.Tensor, dict[str, float]]:
        support_ids = ((p > 0) | (q > 0)).nonzero()[:, 0]
        if support_ids.numel() <= self.max_keep:
            # the whole union of supports is kept: nothing outside it has mass (fast path, top-k/top-p)
            ids = support_ids
            if 0 <= draft_token < p.shape[0] and not bool((ids == draft_token).any()):
                ids = torch.sort(torch.cat([ids, torch.tensor([draft_token])])).values
            pk, qk = p[ids].double(), q[ids].double()
            pk, qk = pk / pk.sum(), qk / qk.sum()
            return ids, {"p_rest": 0.0, "q_rest": 0.0, "p_rest_max": 0.0, "q_rest_max": 0.0,
                         "q_rest_on_p0": 0.0, "target_entropy": float(_entropy64(pk)),
                         "draft_entropy": float(_entropy64(qk)), "qp_rest_max": 0.0, "qp_rest_min": math.inf}
        pd, qd = p.double(), q.double()
        keep = torch.zeros(p.shape[0], dtype=torch.bool)
        keep[_top_mass(p, float(pd.sum()), self.tol, self.max_keep)] = True
        keep[_top_mass(q, float(qd.sum()), self.tol, self.max_keep)] = True
        if 0 <= draft_token < p.shape[0]:
            keep[draft_token] = True
        ids = keep.nonzero()[:, 0]                                   # increasing vocabulary order
        rest = ~keep
        st = {"p_rest": float(pd[rest].sum()), "q_rest": float(qd[rest].sum())}
        # the other statistics refer to the renormalised rows, which is what every measure uses
        pd, qd = pd / pd.sum(), qd / qd.sum()
        pr, qr = pd[rest], qd[rest]
        st.update({
            "p_rest_max": float(pr.max()) if pr.numel() else 0.0,
            "q_rest_max": float(qr.max()) if qr.numel() else 0.0,
            "q_rest_on_p0": float(qr[pr == 0].sum()),
            "target_entropy": float(_entropy64(pd)),
            "draft_entropy": float(_entropy64(qd)),
        })
        pos = pr > 0
        if pos.any():
            ratio = qr[pos] / pr[pos]
            st["qp_rest_max"] = float(ratio.max())
            st["qp_rest_min"] = float(ratio.min())
        else:
            st["qp_rest_max"] = 0.0
            st["qp_rest_min"] = math.inf
        return ids, st

    # ------------------------------------------------------------------ access
    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """All per-position and per-token arrays (concatenated; ``offsets`` has ``N+1`` entries)."""
        if self._cache is None:
            names = ["counts", "token_ids", "p_kept", "q_kept", *_STAT_FIELDS, *_INT_META, *_STR_META]
            dtypes = {"counts": np.int64, "token_ids": np.int32, "p_kept": np.float32, "q_kept": np.float32,
                      **_STAT_FIELDS, **{k: v[0] for k, v in _INT_META.items()}, **{k: np.int32 for k in _STR_META}}
            if self._chunks:
                merged = {k: np.concatenate([c[k] for c in self._chunks]) for k in names}
                self._chunks = [merged]
            else:
                merged = {k: np.zeros(0, dtype=dtypes[k]) for k in names}
            merged = dict(merged)
            merged["offsets"] = np.concatenate([[0], np.cumsum(merged["counts"])]).astype(np.int64)
            self._cache = merged
        return self._cache

    def __len__(self) -> int:
        return int(sum(len(c["counts"]) for c in self._chunks))

    def strings(self, name: str) -> list[str]:
        """Per-position values of a string meta field (``dataset`` or ``problem_id``)."""
        table = self._strings[name]
        return [table[i] for i in self.arrays[name]]

    def meta(self) -> dict[str, np.ndarray]:
        """Per-position meta and statistics as numpy arrays (strings decoded)."""
        a = self.arrays
        out = {k: a[k] for k in (*_INT_META, *_STAT_FIELDS)}
        out["n_kept"] = a["counts"]
        for k in _STR_META:
            out[k] = np.array(self.strings(k), dtype=str)
        return out

    def dense(self, index: Sequence[int] | np.ndarray | None = None, *, dtype: torch.dtype = torch.float64):
        """Decompress positions ``index`` (default all) to ``(p̄ [n, W+1], q̄ [n, W+1], ids [n, W])``.

        Row ``i`` holds the kept probabilities of position ``index[i]`` in increasing token-id order,
        zero padding up to ``W`` (the widest selected row), and the rest mass in the last column;
        rows are renormalised to sum to one. ``ids`` gives the vocabulary id of each kept column
        (−1 on padding).
        """
        a = self.arrays
        idx = np.arange(len(a["counts"])) if index is None else np.asarray(index, dtype=np.int64)
        counts = a["counts"][idx]
        width = int(counts.max()) if len(idx) else 0
        n = len(idx)
        pbar = np.zeros((n, width + 1), dtype=np.float64)
        qbar = np.zeros((n, width + 1), dtype=np.float64)
        ids = np.full((n, width), -1, dtype=np.int64)
        if n:
            starts = a["offsets"][idx]
            rows = np.repeat(np.arange(n), counts)
            cols = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            src = np.repeat(starts, counts) + cols
            pbar[rows, cols] = a["p_kept"][src]
            qbar[rows, cols] = a["q_kept"][src]
            ids[rows, cols] = a["token_ids"][src]
            pbar[:, -1] = a["p_rest"][idx]
            qbar[:, -1] = a["q_rest"][idx]
            pbar /= pbar.sum(-1, keepdims=True)
            qbar /= qbar.sum(-1, keepdims=True)
        return torch.from_numpy(pbar).to(dtype), torch.from_numpy(qbar).to(dtype), torch.from_numpy(ids)

    def full_row(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Position ``i`` scattered back to ``[V]`` (rest mass dropped: exact only where rest is 0)."""
        a = self.arrays
        lo, hi = a["offsets"][i], a["offsets"][i + 1]
        p = torch.zeros(self.vocab_size or 0, dtype=torch.float32)
        q = torch.zeros_like(p)
        ids = torch.from_numpy(a["token_ids"][lo:hi].astype(np.int64))
        p[ids] = torch.from_numpy(a["p_kept"][lo:hi])
        q[ids] = torch.from_numpy(a["q_kept"][lo:hi])
        return p, q

    # ------------------------------------------------------------------ size and summary
    def nbytes(self) -> int:
        return int(sum(v.nbytes for k, v in self.arrays.items() if k != "counts"))

    def bytes_per_position(self) -> float:
        n = len(self)
        return self.nbytes() / n if n else 0.0

    def summary(self) -> dict[str, Any]:
        """Size and compression statistics of the corpus."""
        a = self.arrays
        n = len(a["counts"])
        if not n:
            return {"n_positions": 0}
        rest = a["p_rest"] + a["q_rest"]
        return {
            "n_positions": n,
            "vocab_size": self.vocab_size,
            "tol": self.tol,
            "max_keep": self.max_keep,
            "mean_kept_tokens": float(a["counts"].mean()),
            "max_kept_tokens": int(a["counts"].max()),
            "lossless_fraction": float((rest == 0).mean()),
            "max_p_rest": float(a["p_rest"].max()),
            "max_q_rest": float(a["q_rest"].max()),
            "mean_rest": float(rest.mean()),
            "n_over_tol": int(((a["p_rest"] > self.tol) | (a["q_rest"] > self.tol)).sum()),
            "bytes_per_position": self.bytes_per_position(),
            "datasets": sorted(set(self._strings["dataset"])),
        }

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike) -> None:
        """Write one compressed ``.npz`` file (``np.load(..., allow_pickle=False)`` can read it)."""
        a = self.arrays
        header = {"format": FORMAT, "version": FORMAT_VERSION, "tol": self.tol, "max_keep": self.max_keep,
                  "vocab_size": self.vocab_size}
        payload = {k: v for k, v in a.items() if k != "offsets"}
        for k in _STR_META:
            payload[f"{k}_table"] = np.array(self._strings[k], dtype=str)
        payload["header"] = np.array(json.dumps(header))
        with open(path, "wb") as fh:
            np.savez_compressed(fh, **payload)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PositionRecorder":
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(str(z["header"]))
            if header.get("format") != FORMAT:
                raise ValueError(f"{path}: not a verispec position-record file")
            if header.get("version") != FORMAT_VERSION:
                raise ValueError(f"{path}: record format version {header.get('version')} is not supported "
                                 f"(expected {FORMAT_VERSION})")
            rec = cls(tol=header["tol"], max_keep=header["max_keep"])
            rec.vocab_size = header["vocab_size"]
            chunk = {k: z[k] for k in z.files if k != "header" and not k.endswith("_table")}
            for k in _STR_META:
                rec._strings[k] = [str(s) for s in z[f"{k}_table"]]
                rec._codes[k] = {s: i for i, s in enumerate(rec._strings[k])}
        if len(chunk["counts"]):
            rec._chunks = [chunk]
        return rec

    def extend(self, other: "PositionRecorder") -> None:
        """Append the positions of another recorder (same vocabulary)."""
        if other.vocab_size is not None and self.vocab_size is not None and other.vocab_size != self.vocab_size:
            raise ValueError("cannot merge records with different vocabulary sizes")
        if not len(other):
            return
        self.vocab_size = self.vocab_size or other.vocab_size
        chunk = {k: v.copy() for k, v in other.arrays.items() if k != "offsets"}
        for k in _STR_META:
            chunk[k] = np.array([self._code(k, s) for s in other.strings(k)], dtype=np.int32)
        self._chunks.append(chunk)
        self._cache = None
