"""The map of verification rules: every registered rule with its place in the taxonomy (``verispec rules``).

Each registry entry is built once from its example spec (its defaults where it has no required
parameter) to read what the rule says of itself: ``taxonomy``, ``family``, whether it is lossless,
whether its law factors per position, and the sampling fields of its true baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

from verispec.rules.base import TAXONOMY


@dataclass(frozen=True)
class Entry:
    """One registry entry as the map shows it."""

    name: str
    syntax: str          # ``name:param=default,...``
    summary: str
    example: str         # a spec that builds it
    taxonomy: str
    family: str
    lossless: str        # "lossless" (every setting) or "lossy" (some settings may be lossless, e.g. ℓ = 1)
    per_token: bool
    baseline: str        # "p" or the truncation of its true baseline, e.g. "target with min_p=0.3"


#: Examples for the map where the registry's error-message example is not a buildable spec.
_MAP_EXAMPLES = {"truncation": "truncation:top_k=5,min_p=0.1", "sglang": "sglang:single=0.9,acc=0.8"}


def _example(name: str) -> str:
    from verispec.rules import _EXAMPLES

    return _MAP_EXAMPLES.get(name) or _EXAMPLES.get(name, name).split(" or ")[0]


def entries() -> list[Entry]:
    """Every registered rule, in taxonomy order (lossless, truncation set, collaborative, deferral, other)
    and registry order within a family."""
    from verispec.rules import REGISTRY, get

    out: list[Entry] = []
    for name, entry in REGISTRY.items():
        example = _example(name)
        params = ",".join(p.name + ("" if p.default is None else f"={p.default}") for p in entry.params)
        if "<" in example:       # built from a predicate registered at run time: the class says what it is
            from verispec.rules.judge import JudgeRule

            rule, lossless, truncation = JudgeRule, "lossy", {}
        else:
            rule = get(example)
            lossless = "lossless" if type(rule).is_lossless is True else "lossy"
            truncation = rule.baseline_truncation()
        baseline = ("target with " + ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                              for k, v in truncation.items())) if truncation else "p"
        out.append(Entry(name, name + (":" + params if params else ""), entry.summary, example,
                         rule.taxonomy, rule.family, lossless, bool(rule.per_token), baseline))
    order = {t: i for i, t in enumerate(TAXONOMY)}
    return sorted(out, key=lambda e: order.get(e.taxonomy, len(order)))


def catalogue_text() -> str:
    """The map as text: one block per taxonomy family, one line per rule."""
    lines = ["Verification rules (spec: name:param=value,...; leading parameters may be positional).",
             "Law: per-token (factors by position) or sequence-level; baseline: the true baseline a lossy rule is",
             "judged against (the target sampled with the same truncation, or p)."]
    current = None
    for e in entries():
        if e.taxonomy != current:
            current = e.taxonomy
            lines += ["", f"{current}:"]
        law = "per-token law" if e.per_token else "sequence-level law"
        lines.append(f"  {e.syntax}")
        lines.append(f"      {e.summary}")
        lines.append(f"      {e.lossless}, {law}, baseline {e.baseline}; e.g. {e.example}")
    return "\n".join(lines)
