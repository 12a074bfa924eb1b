"""Typed, validated parameters and the one ``key=value,...`` grammar of rule specs and sampling configs.

Rule specs (``lenience:ell=0.5``, :func:`verispec.rules.get`) and sampling configs
(``temperature=0.7,top_p=0.8``, :meth:`verispec.sampling.SamplingConfig.parse`) are both a comma-
separated list of ``key=value`` settings over a declared set of :class:`Param`. One parser and one
validator serve both, so a value means the same thing and is refused with the same wording wherever it
is written — in particular a truncation rule's parameter and the sampling field of its true baseline
(``typical:eps`` and ``eta``) share their valid range.

Grammar: settings are separated by commas, blanks around keys and values are ignored; keys are case-
insensitive and ``-`` may replace ``_``; a declared alias stands for its parameter; a declared bare
word (``greedy``) stands for fixed settings; where ``positional`` is allowed the leading settings
may omit ``key=`` and are taken in declaration order. Every error names the owner, the offending text
and what is valid.
"""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Param", "check_number", "in_range", "one_of", "parse_settings", "shown"]

#: The most characters of a user's value an error line quotes (a sweep file's value can be megabytes).
SHOWN_CHARS = 120

_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxlist, _repr.maxtuple, _repr.maxdict, _repr.maxset = 3, 6, 6, 6, 6
_repr.maxstring, _repr.maxother, _repr.maxlong = SHOWN_CHARS, SHOWN_CHARS, 40


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` cut to about ``limit`` characters, at bounded cost whatever ``value`` holds (nested
    lists sharing one list 9^8 times, as a YAML alias bomb makes, are walked 3 levels and 6 items deep)."""
    text = _repr.repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _bound(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def check_number(value: object, what: str, *, kind: type = float, lo: float | None = None, hi: float | None = None,
                 lo_open: bool = False, hi_open: bool = False, unit: str = "") -> int | float:
    """``value`` (a number, or its text) as a finite ``kind`` (``int`` or ``float``) within [``lo``, ``hi``]
    (``lo_open`` / ``hi_open``: the bound excluded), else ``ValueError``: "``what`` must be <kind, range>, got
    <value>". Booleans, NaN, infinities (``inf``, ``1e400``), non-integral values for an ``int`` and text that is
    no number are refused; ``unit`` completes the kind ("seconds"). The one check of every numeric flag,
    sweep value, model argument and environment variable."""
    noun = ("an integer" if kind is int else "a number") + (f" of {unit}" if unit else "")
    if lo is not None and hi is not None:
        noun += f" in {'(' if lo_open else '['}{_bound(lo)}, {_bound(hi)}{')' if hi_open else ']'}"
    elif lo is not None:
        noun += f" {'>' if lo_open else '>='} {_bound(lo)}"
    elif hi is not None:
        noun += f" {'<' if hi_open else '<='} {_bound(hi)}"
    error = ValueError(f"{what} must be {noun}, got {shown(value)}")
    if isinstance(value, bool):
        raise error
    if isinstance(value, str):
        text = value.strip()
        if len(text) > 400:        # int() of thousands of digits is slow (and capped by Python): not a setting
            raise error
        try:
            number: int | float = int(text) if kind is int else float(text)
        except ValueError:
            raise error from None
    elif kind is int and isinstance(value, numbers.Integral):
        number = int(value)
    elif kind is float and isinstance(value, numbers.Real):
        number = float(value)
    else:
        raise error
    if isinstance(number, float) and not math.isfinite(number):
        raise error
    if lo is not None and (number <= lo if lo_open else number < lo):
        raise error
    if hi is not None and (number >= hi if hi_open else number > hi):
        raise error
    return number


@dataclass(frozen=True)
class Param:
    """A parameter: name, type (``float``, ``int`` or ``str``), valid range and meaning.

    ``default`` ``None`` means required (unless ``nullable``: then ``None`` is a legal value, written
    ``none`` in text). ``valid_text`` completes the sentence "``name`` must be ...".
    """

    name: str
    kind: type
    valid: Callable[[object], bool]
    valid_text: str
    help: str = ""
    default: object = None
    aliases: tuple[str, ...] = ()
    nullable: bool = False

    def _error(self, owner: str, raw: object) -> ValueError:
        where = f"{owner}: " if owner else ""
        return ValueError(f"{where}{self.name} must be {self.valid_text}, got {shown(raw)}")

    def from_text(self, owner: str, raw: str) -> object:
        """Convert the text of a setting and validate it."""
        if self.nullable and raw.strip().lower() == "none":
            return None
        try:
            value = self.kind(raw)
        except (TypeError, ValueError):
            raise self._error(owner, raw) from None
        return self._in_range(owner, value, raw)

    def check(self, owner: str, value: object) -> object:
        """Validate a typed value (no conversion from text: ``"0.7"`` or ``2.0`` for an int are refused)."""
        if value is None and self.nullable:
            return None
        if self.kind is float:
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise self._error(owner, value)
            value = float(value)
        elif self.kind is int:
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise self._error(owner, value)
            value = int(value)
        elif not isinstance(value, self.kind):
            raise self._error(owner, value)
        return self._in_range(owner, value, value)

    def _in_range(self, owner: str, value: object, raw: object) -> object:
        if isinstance(value, float) and not math.isfinite(value):
            raise self._error(owner, raw)
        if not self.valid(value):
            raise self._error(owner, raw)
        return value


def in_range(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> Callable[[object], bool]:
    def check(v: object) -> bool:
        x = float(v)  # type: ignore[arg-type]
        return (x > lo if lo_open else x >= lo) and (x < hi if hi_open else x <= hi)

    return check


def one_of(*choices: str) -> Callable[[object], bool]:
    return lambda v: v in choices


def _norm(key: str) -> str:
    return key.strip().lower().replace("-", "_")


def parse_settings(
    text: str,
    params: Sequence[Param],
    *,
    owner: str,
    noun: str = "parameter",
    positional: bool = False,
    words: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, object]:
    """``"k=v,k2=v2"`` -> ``{param name: validated value}`` for the settings present in ``text``.

    ``owner`` prefixes every error (the rule name, or ``sampling``); ``noun`` is how the keys are
    called in errors ("parameter" or "key"). ``positional``: leading values without ``key=`` fill the
    parameters in order. ``words``: bare words standing for settings (``{"greedy": {"temperature": "0"}}``).
    Required parameters are not checked here (the caller knows which may be omitted).
    """
    by_key: dict[str, Param] = {}
    for p in params:
        for key in (p.name, *p.aliases):
            by_key[_norm(key)] = p
    names = ", ".join(p.name for p in params)
    valid = f"valid {noun}s: {names}" if params else f"valid {noun}s: none ({owner} takes no {noun}s)"
    words = {_norm(w): s for w, s in (words or {}).items()}
    values: dict[str, object] = {}
    positional_open = positional
    for i, item in enumerate(x.strip() for x in text.split(",") if x.strip()):
        if _norm(item) in words:
            settings = list(words[_norm(item)].items())
            positional_open = False
        elif "=" not in item:
            if not positional_open or i >= len(params):
                if positional and params:
                    raise ValueError(f"{owner}: cannot place positional value {shown(item)}; "
                                     f"write {noun}=value with one of: {names}")
                raise ValueError(f"{owner}: malformed setting {shown(item)}: expected {noun}=value; {valid}")
            settings = [(params[i].name, item)]
        else:
            positional_open = False
            if item.count("=") != 1:
                raise ValueError(f"{owner}: malformed setting {shown(item)}: expected one {noun}=value; {valid}")
            key, raw = (s.strip() for s in item.split("="))
            if not raw:
                raise ValueError(f"{owner}: malformed setting {shown(item)}: missing value for {key[:SHOWN_CHARS]}")
            settings = [(key, raw)]
        for key, raw in settings:
            param = by_key.get(_norm(key))
            if param is None:
                raise ValueError(f"{owner}: unknown {noun} {shown(key)}; {valid}")
            if param.name in values:
                raise ValueError(f"{owner}: {noun} {param.name!r} given more than once in {shown(text)}")
            values[param.name] = param.from_text(owner, raw)
    return values
