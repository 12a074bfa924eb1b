"""The checks of ``verispec lm-eval``'s flags and of the ``verispec`` model's ``model_args``, shared by the command
(:mod:`verispec.integrations.lm_eval`, which must not import lm_eval before it runs) and the model
(:mod:`verispec.integrations.lm_eval_model`, which imports it): one module below both, so neither imports the
other's module at load time."""

from __future__ import annotations

from typing import Any

from verispec.params import check_number, shown
from verispec.settings import MAX_BATCH_ROWS, MAX_GAMMA, MAX_N_CTX, MAX_SEED, MAX_THREADS

#: the draft sources of a request (as :data:`verispec.engine.request.DRAFT_SOURCES`; not imported: the command
#: parses its flags before torch loads)
DRAFT_SOURCES = ("model", "ngram", "none")


def check_rule_applies(rule: str, draft: str, baseline: bool, *, flag: bool) -> None:
    """Refuse a lossy rule with no draft source: ``draft="none"`` decodes the target alone, so the rule would be
    ignored (its true baseline is ``baseline``). ``flag``: name the command's flags, else the model_args."""
    from verispec.rules import get as get_rule

    if draft != "none" or baseline:
        return
    rule_obj = get_rule(rule)
    if rule_obj.is_lossless:     # the law of target-only sampling: nothing is lost by not drafting
        return
    if flag:
        raise ValueError(f"--draft-source none decodes the target alone, so --rule {rule_obj.spec()} cannot apply: "
                         "drop --rule, add --baseline for its true baseline, or choose --draft-source model or ngram")
    raise ValueError(f"model_args draft_source=none decodes the target alone, so rule={rule_obj.spec()} cannot apply: "
                     "drop rule, add baseline=true for its true baseline, or choose draft_source=model or ngram")


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def boolean_arg(what: str, value: Any) -> bool:
    """A yes/no argument as lm_eval passes it (a bool, 0 / 1, or text such as ``true``); anything else, such
    as ``maybe``, is refused rather than taken as true."""
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    if not isinstance(value, bool):
        raise ValueError(f"{what} must be true or false, got {shown(value)}")
    return value


def model_args(values: dict[str, Any]) -> dict[str, Any]:
    """The ``verispec`` model's arguments (``--model_args`` over ``verispec lm-eval``'s flags) checked and typed:
    lm_eval hands them over as it parsed them (``gamma=2.5`` a float, ``baseline=maybe`` a string), so a value
    of the wrong type or out of range is refused here (``ValueError`` naming the argument) instead of being
    rounded or taken as true."""
    out = dict(values)

    def integer(name: str, lo: int, hi: int, *, nullable: bool = False) -> None:
        value = out.get(name)
        if value is None and nullable:
            return
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        out[name] = int(check_number(value, f"model_args {name}", kind=int, lo=lo, hi=hi))

    for name in ("baseline", "add_bos_token", "batch_invariant"):
        out[name] = boolean_arg(f"model_args {name}", out.get(name, False))
    gamma = out.get("gamma", 5)
    if isinstance(gamma, str) and gamma.strip().lower() == "auto":
        out["gamma"] = "auto"
    else:
        if isinstance(gamma, float) and gamma.is_integer():
            gamma = int(gamma)
        try:
            out["gamma"] = int(check_number(gamma, "model_args gamma", kind=int, lo=1, hi=MAX_GAMMA))
        except ValueError as exc:
            raise ValueError(f"{exc} (or auto)") from None
    integer("seed", 0, MAX_SEED)
    integer("rows", 1, MAX_BATCH_ROWS)
    integer("max_gen_toks", 1, MAX_N_CTX)
    integer("n_ctx", 1, MAX_N_CTX)
    integer("n_threads", 1, MAX_THREADS, nullable=True)
    for name in ("rule", "device"):
        if not isinstance(out.get(name), str) or not out[name].strip():
            raise ValueError(f"model_args {name} must be a non-empty string, got {shown(out.get(name))}")
    for name in ("tree", "target", "draft", "dtype"):
        if out.get(name) is not None and (not isinstance(out[name], str) or not out[name].strip()):
            raise ValueError(f"model_args {name} must be a non-empty string (or left out), got {shown(out[name])}")
    source = out.get("draft_source")
    if source is not None and source not in DRAFT_SOURCES:
        raise ValueError(f"model_args draft_source must be one of {', '.join(DRAFT_SOURCES)}, got {shown(source)}")
    return out
