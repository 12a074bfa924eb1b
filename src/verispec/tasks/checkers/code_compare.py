"""EvalPlus's input rebuilding and output comparison, applied by the grader (outside the sandbox)
to plain data decoded by :mod:`.code_child` -- never to objects a candidate made.

Parts marked "from EvalPlus" follow EvalPlus (Apache-2.0): ``evalplus/data/mbpp.py``
(``mbpp_deserialize_inputs``), ``evalplus/eval/_special_oracle.py`` and the comparison of
``evalplus/eval/__init__.py`` (``==``; then ``numpy.allclose``-style with ``rtol=1e-7`` and
``atol`` -- ``1e-6`` when the task gives none and the expected output is a float or list of
floats; special oracles for ``find_zero``, Mbpp 164/295/558/581, set-equality and not-None tasks).

Two departures keep the comparison honest and bounded where EvalPlus relies on numpy and trusted
objects: the tolerance applies to numbers only (``bool``, ``int``, ``float``, ``complex``, as
``numpy.allclose`` does; a string element fails instead of being read as a number), and the
set-equality oracle builds its sets only from at most :data:`.code_child.MAX_ITEMS` elements
of which no more than :data:`.code_child.MAX_HASH_COLLISIONS` unequal ones share a hash value
(else building them could take hours or gigabytes).
An :class:`.code_child.Opaque` value equals nothing but itself, wherever it is nested.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .code_child import MAX_ITEMS, safe_for_set


@dataclass(frozen=True)
class Digest:
    """A big output, known by :func:`.code_child.digest` of its encoding: equal only to itself."""

    sha256: str

# ---- from EvalPlus: evalplus/data/mbpp.py, mbpp_deserialize_inputs ----
def mbpp_deserialize_inputs(task_id: str, inputs: list) -> list:
    task_id = int(task_id.split("/")[-1])
    if task_id in [2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616, 630,
                   726, 740, 744, 809]:
        modified_inputs = [[tuple(lst) for lst in inp] for inp in inputs]
    elif task_id in [63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780]:
        modified_inputs = [[[tuple(lst) for lst in lst_lst] for lst_lst in inp] for inp in inputs]
    elif task_id in [75, 413, 444, 753]:
        modified_inputs = [[[tuple(lst) for lst in inp[0]]] + [inp[1]] for inp in inputs]
    elif task_id == 106 or task_id == 750:
        modified_inputs = [[inp[0]] + [tuple(inp[1])] for inp in inputs]
    elif task_id == 115:
        modified_inputs = [[[set(item) if isinstance(item, list) and len(item) else {} for item in inp[0]]]
                           for inp in inputs]
    elif task_id == 124:
        modified_inputs = [(float(inp[0]), complex(inp[1])) for inp in inputs]
    elif task_id in [250, 405, 446, 617, 720, 763, 808]:
        modified_inputs = [[tuple(inp[0])] + [inp[1]] for inp in inputs]
    elif task_id in [259, 401, 445]:
        modified_inputs = [[[tuple(lst) for lst in lst_lst] for lst_lst in inp] for inp in inputs]
        modified_inputs = [[tuple(lst) for lst in inp] for inp in modified_inputs]
    elif task_id == 278:
        modified_inputs = [[[tuple(item) if isinstance(item, list) else item for item in inp[0]]]
                           for inp in inputs]
        modified_inputs = [[tuple(lst) for lst in inp] for inp in modified_inputs]
    elif task_id == 307:
        modified_inputs = [[tuple(inp[0])] + [inp[1], inp[2]] for inp in inputs]
    elif task_id == 722:
        modified_inputs = [[{key: tuple(value) for key, value in inp[0].items()}] + inp[1:] for inp in inputs]
    elif task_id == 252:
        modified_inputs = [[complex(inp[0])] for inp in inputs]
    elif task_id in [580, 615, 791]:
        def turn_all_list_into_tuple(inp):
            if isinstance(inp, list):
                return tuple([turn_all_list_into_tuple(item) for item in inp])
            return inp
        modified_inputs = [turn_all_list_into_tuple(inp) for inp in inputs]
    else:
        modified_inputs = inputs
    return modified_inputs


# ---- from EvalPlus: evalplus/eval/_special_oracle.py ----
MBPP_OUTPUT_NOT_NONE_TASKS = ["check_str", "text_match_three", "text_starta_endb"]
MBPP_OUTPUT_SET_EQ_TASKS = ["similar_elements", "find_char_long", "common_in_nested_lists", "extract_singly",
                            "larg_nnum", "intersection_array", "find_dissimilar", "Diff"]


def _surface_Area(base_edge, height):
    slant_height = math.sqrt((base_edge / 2) ** 2 + height**2)
    base_area = base_edge**2
    lateral_area = 4 * (base_edge * slant_height) / 2
    return round(base_area + lateral_area)


def _digit_distance_nums(num1, num2):
    str_num1, str_num2 = str(num1), str(num2)
    max_length = max(len(str_num1), len(str_num2))
    str_num1, str_num2 = str_num1.zfill(max_length), str_num2.zfill(max_length)
    return sum(abs(int(a) - int(b)) for a, b in zip(str_num1, str_num2))


def _poly(xs, x):
    return sum([coeff * math.pow(x, i) for i, coeff in enumerate(xs)])
# ---- end of EvalPlus code ----


def _is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(i, float) for i in x)
    return False


_NUMBERS = (bool, int, float, complex)


def _allclose(a, b, rtol: float, atol: float) -> bool:
    """``numpy.allclose(a, b)`` for numbers and (nested) lists/tuples of numbers, without numpy:
    every element must be a ``bool``, ``int``, ``float`` or ``complex`` (exact types, as the
    codec delivers them), else the comparison fails as numpy's would."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_allclose(x, y, rtol, atol) for x, y in zip(a, b))
    if isinstance(a, (list, tuple)):
        return all(_allclose(x, b, rtol, atol) for x in a)
    if isinstance(b, (list, tuple)):
        return all(_allclose(a, y, rtol, atol) for y in b)
    if type(a) not in _NUMBERS or type(b) not in _NUMBERS:
        return False
    try:
        if a == b:
            return True
        a, b = complex(a), complex(b)
    except (TypeError, ValueError, OverflowError):
        return False
    if any(math.isnan(v) for v in (a.real, a.imag, b.real, b.imag)):
        return False
    return abs(a - b) <= atol + rtol * abs(b)


def expected_output(flavour: str, entry: str, ref_out):
    """What the reference's output is compared as (MBPP not-None tasks compare ``is not None``)."""
    if flavour == "mbpp" and entry in MBPP_OUTPUT_NOT_NONE_TASKS:
        return ref_out is not None
    return ref_out


def same_output(flavour: str, entry: str, atol: float, out, exp, inp) -> bool:
    """EvalPlus's verdict for one input: candidate output ``out`` against expected ``exp``.

    ``out``, ``exp`` and ``inp`` are plain data (decoded by :func:`.code_child.decode`).
    Big outputs (:class:`Digest`) must match exactly: no tolerance or special oracle applies.
    """
    if isinstance(out, Digest) or isinstance(exp, Digest):
        return out == exp
    try:
        exact = out == exp
        if flavour == "mbpp":
            if entry == "are_equivalent":
                exact = exact or True
            elif entry == "sum_div":
                exact = exact or out == 0
            elif entry == "surface_Area":
                exact = exact or abs(out - _surface_Area(*inp)) <= atol
            elif entry == "digit_distance_nums":
                exact = exact or out == _digit_distance_nums(*inp)
            elif entry in MBPP_OUTPUT_SET_EQ_TASKS:
                if len(out) > MAX_ITEMS or len(exp) > MAX_ITEMS:  # e.g. a long string: a set per character
                    return False
                exact = set(safe_for_set(list(out))) == set(safe_for_set(list(exp)))
            elif entry in MBPP_OUTPUT_NOT_NONE_TASKS:
                exact = (out == exp) if isinstance(out, bool) else (exp == (out is not None))
        if flavour == "humaneval" and entry == "find_zero":
            return abs(_poly(*inp, out)) <= atol
        if atol == 0 and _is_floats(exp):
            atol = 1e-6
        if not exact and atol != 0:
            if type(out) is not type(exp):
                return False
            if isinstance(exp, (list, tuple)) and len(out) != len(exp):
                return False
            return _allclose(out, exp, 1e-07, atol)
        return bool(exact)
    except (TypeError, ValueError, OverflowError, ArithmeticError, RecursionError):
        return False  # e.g. set() of unhashable items, abs() of a string: not the right answer
