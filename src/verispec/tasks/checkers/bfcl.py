"""Function calls (BFCL), graded with a port of the official BFCL AST checker.

Source: ShishirPatil/gorilla, ``berkeley-function-call-leaderboard/bfcl_eval/eval_checker/
ast_eval/ast_checker.py`` (last changed in commit 58f57e9124ea981403792dd51e00a6577e621fae; read
at repository commit 6ea57973c7a6097fd7c5915698c54c17c5b1b6c8, March 2026) and the prompting
decoder ``bfcl_eval/model_handler/utils.py`` (``default_decode_ast_prompting``, ``ast_parse``,
``resolve_ast_call``, ``resolve_ast_by_type``), Apache License 2.0, Copyright the Gorilla /
BFCL authors.  Ported rather than depended on: the ``bfcl-eval`` package pins numpy 1.26.4 and
pulls in openai, anthropic, sentence-transformers, faiss and more.

Matching (ported function by function, same names, same order of checks)
    ``ast_checker`` dispatches on the test category: "parallel" in it (parallel,
    parallel_multiple, live_parallel*) -> ``parallel_function_checker_no_order`` (as many calls as
    answers; answers taken in order, each greedily claims the first unclaimed call that passes);
    "multiple" -> ``multiple_function_checker`` (one call, checked against the doc of the expected
    function); else ``simple_function_checker`` on the first function doc.  Per call: the name
    must equal the expected one exactly (BFCL's underscore-for-dot renaming applies only to
    function-calling APIs that forbid dots, not to prompting models); every required parameter
    present; no parameter outside the function doc *or* the possible answer; the Python type of
    the doc (``any`` means string, ``int`` is accepted for ``float``, a tuple for ``tuple``; a
    value of the possible answer's type is accepted as a "variable"; one level of item types is
    checked for arrays); strings compared after ``standardize_string`` (lower case, without
    spaces and ``,./-_*^``, ``'`` -> ``"``), lists element-wise, dicts and lists of dicts key by
    key; any other value by ``in``; a parameter of the answer that was not given must list ``""``
    (optional).
Deviations (each only where the official code crashes or would run model output)
    * Python only (our datasets hold no Java / JavaScript categories).
    * ``resolve_ast_by_type`` evaluates a binary operation with ``eval``; here only arithmetic
      on numbers (and string concatenation) is evaluated, anything else fails to decode, like any
      other unsupported node.  A unary minus applies to numbers only (the original negates any
      operand, so ``+5`` became -5).
    * A missing function doc, an unknown parameter type or a parameter without ``items`` gives an
      invalid verdict naming the problem instead of a ``KeyError``.

Decoding (strict and flexible): :mod:`verispec.tasks.checkers.bfcl_decode`.
"""

from __future__ import annotations

import re

from .base import CheckResult
from .bfcl_decode import DecodeError, decode_calls, find_calls, is_function_calling_format_output

__all__ = ["ast_checker", "decode_calls", "find_calls", "bfcl_match", "grade"]


# ------------------------------------------------------------------------------------------
# Matching (bfcl_eval/eval_checker/ast_eval/ast_checker.py, Python)
# ------------------------------------------------------------------------------------------
PYTHON_TYPE_MAPPING = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}

# This is the list of types that we need to recursively check its values
PYTHON_NESTED_TYPE_CHECK_LIST = ["array", "tuple"]


def _invalid(error: str, error_type: str) -> dict:
    return {"valid": False, "error": [error], "error_type": error_type}


def ast_checker(func_description: list, model_output: list, possible_answer: list, test_category: str) -> dict:
    """BFCL's ``ast_checker`` (Python): ``{"valid": bool, "error": [...], "error_type": str}``."""
    if "parallel" in test_category:
        return parallel_function_checker_no_order(func_description, model_output, possible_answer)
    elif "multiple" in test_category:
        return multiple_function_checker(func_description, model_output, possible_answer)
    else:
        if len(model_output) != 1:
            return _invalid("Wrong number of functions.", "simple_function_checker:wrong_count")
        return simple_function_checker(func_description[0], model_output[0], possible_answer[0])


def find_description(func_descriptions, name):
    if type(func_descriptions) == list:  # noqa: E721
        for func_description in func_descriptions:
            if func_description["name"] == name:
                return func_description
        return None
    else:
        # it is a dict, there is only one function
        return func_descriptions


def get_possible_answer_type(possible_answer: list):
    for answer in possible_answer:
        if answer != "":  # Optional parameter
            return type(answer)
    return None


def type_checker(param, value, possible_answer, expected_type_description, expected_type_converted,
                 nested_type_converted) -> dict:
    # NOTE (BFCL): nested type checking is only one level deep.
    result = {"valid": True, "error": [], "is_variable": False, "error_type": "type_error:simple"}

    is_variable = False
    # A variable used instead of an actual value: the possible answer's type is the expected type.
    possible_answer_type = get_possible_answer_type(possible_answer)
    if possible_answer_type is not None:
        if possible_answer_type != expected_type_converted:
            is_variable = True

    # value is the same type as in function description
    if type(value) is expected_type_converted:
        if nested_type_converted is None:
            result["is_variable"] = is_variable
            return result
        else:
            for possible_answer_item in possible_answer:
                flag = True  # Each parameter should match to at least one possible answer type.
                if type(possible_answer_item) is list:
                    for value_item in value:
                        checker_result = type_checker(param, value_item, possible_answer_item,
                                                      str(nested_type_converted), nested_type_converted, None)
                        if not checker_result["valid"]:
                            flag = False
                            break

                if flag:
                    return {"valid": True, "error": [], "is_variable": is_variable}

            result["valid"] = False
            result["error"] = [
                f"Nested type checking failed for parameter {param!r}. Expected outer type "
                f"{expected_type_description} with inner type {nested_type_converted}. Parameter value: {value!r}."
            ]
            result["error_type"] = "type_error:nested"

    # value is not as expected: a variable of the possible answer's type is accepted
    possible_answer_type = get_possible_answer_type(possible_answer)
    if possible_answer_type is not None:
        if type(value) is possible_answer_type:
            result["is_variable"] = True
            return result

    result["valid"] = False
    result["error"].append(
        f"Incorrect type for parameter {param!r}. Expected type {expected_type_description}, "
        f"got {type(value).__name__}. Parameter value: {value!r}."
    )
    result["error_type"] = "type_error:simple"
    return result


def standardize_string(input_string: str) -> str:
    """Lower case, without spaces and ``,./-_*^``, single quotes made double (BFCL)."""
    regex_string = r"[ \,\.\/\-\_\*\^]"
    return re.sub(regex_string, "", input_string).lower().replace("'", '"')


def string_checker(param: str, model_output: str, possible_answer: list) -> dict:
    standardize_possible_answer = [standardize_string(a) for a in possible_answer if type(a) == str]  # noqa: E721
    if standardize_string(model_output) not in standardize_possible_answer:
        return _invalid(f"Invalid value for parameter {param!r}: {model_output!r}. Expected one of "
                        f"{possible_answer}. Case insensitive.", "value_error:string")
    return {"valid": True, "error": []}


def list_checker(param: str, model_output: list, possible_answer: list) -> dict:
    standardize_model_output = list(model_output)
    for i in range(len(standardize_model_output)):
        if type(standardize_model_output[i]) == str:  # noqa: E721
            standardize_model_output[i] = standardize_string(model_output[i])

    standardize_possible_answer = []
    for i in range(len(possible_answer)):
        standardize_possible_answer.append([])
        for j in range(len(possible_answer[i])):
            if type(possible_answer[i][j]) == str:  # noqa: E721
                standardize_possible_answer[i].append(standardize_string(possible_answer[i][j]))
            else:
                standardize_possible_answer[i].append(possible_answer[i][j])

    if standardize_model_output not in standardize_possible_answer:
        return _invalid(f"Invalid value for parameter {param!r}: {model_output!r}. Expected one of {possible_answer}.",
                        "value_error:list/tuple")
    return {"valid": True, "error": []}


def dict_checker(param: str, model_output: dict, possible_answers: list) -> dict:
    # BFCL: works for simple dictionaries, not nested ones (the datasets hold only simple ones).
    result = {"valid": False, "error": [], "error_type": "dict_checker:unclear"}
    for i in range(len(possible_answers)):
        if possible_answers[i] == "":
            continue

        result = {"valid": False, "error": [], "error_type": "dict_checker:unclear"}
        flag = True
        possible_answer = possible_answers[i]

        for key, value in model_output.items():
            if key not in possible_answer:
                result["error"].append(f"Unexpected dict key parameter: '{key}'.")
                result["error_type"] = "value_error:dict_key"
                flag = False
                break

            standardize_value = standardize_string(value) if type(value) == str else value  # noqa: E721
            standardize_possible_answer = [
                standardize_string(a) if type(a) == str else a for a in possible_answer[key]  # noqa: E721
            ]
            if standardize_value not in standardize_possible_answer:
                result["error"].append(f"Invalid value for parameter {key!r}: {value!r}. "
                                       f"Expected one of {standardize_possible_answer}.")
                result["error_type"] = "value_error:dict_value"
                flag = False
                break

        for key, value in possible_answer.items():
            if key not in model_output and "" not in value:
                result["error"].append(f"Missing dict key parameter: '{key}'.")
                result["error_type"] = "value_error:dict_key"
                flag = False
                break

        if flag:
            return {"valid": True, "error": []}

    return result


def list_dict_checker(param: str, model_output: list, possible_answers: list) -> dict:
    # Each dictionary of the list is checked against the one at the same position of an answer.
    result = {"valid": False, "error": [], "error_type": "list_dict_checker:unclear"}

    for answer_index in range(len(possible_answers)):
        flag = True
        if len(model_output) != len(possible_answers[answer_index]):
            result = _invalid("Wrong number of dictionaries in the list.", "value_error:list_dict_count")
            continue

        for dict_index in range(len(model_output)):
            result = dict_checker(param, model_output[dict_index], [possible_answers[answer_index][dict_index]])
            if not result["valid"]:
                flag = False
                break
        if flag:
            return {"valid": True, "error": []}

    return result


def simple_function_checker(func_description: dict | None, model_output: dict, possible_answer: dict) -> dict:
    if func_description is None:
        return _invalid("No function doc for the expected function.", "simple_function_checker:missing_doc")
    possible_answer = list(possible_answer.values())[0]
    func_name = func_description["name"]
    param_details = func_description["parameters"]["properties"]
    required_params = func_description["parameters"]["required"]

    result = {"valid": True, "error": [], "error_type": "simple_function_checker:unclear"}

    if func_name not in model_output:
        return _invalid(f"Function name {func_name!r} not found in model output.",
                        "simple_function_checker:wrong_func_name")

    model_params = model_output[func_name]

    for param in required_params:
        if param not in model_params:
            return _invalid(f"Missing required parameter: {param!r}.", "simple_function_checker:missing_required")

    for param, value in model_params.items():
        if param not in param_details or param not in possible_answer:
            return _invalid(f"Unexpected parameter: {param!r}.", "simple_function_checker:unexpected_param")

        full_param_details = param_details[param]
        expected_type_description = full_param_details.get("type")
        nested_type_converted = None
        if expected_type_description not in PYTHON_TYPE_MAPPING:
            return _invalid(f"Function doc gives parameter {param!r} the unknown type {expected_type_description!r}.",
                            "simple_function_checker:unknown_type")
        expected_type_converted = PYTHON_TYPE_MAPPING[expected_type_description]
        if expected_type_description in PYTHON_NESTED_TYPE_CHECK_LIST:
            nested_type = (full_param_details.get("items") or {}).get("type")
            if nested_type not in PYTHON_TYPE_MAPPING:
                return _invalid(f"Function doc gives array parameter {param!r} no known item type.",
                                "simple_function_checker:unknown_type")
            nested_type_converted = PYTHON_TYPE_MAPPING[nested_type]

        # BFCL: tuples become lists (a JSON round trip turns the answers' tuples into lists).
        if expected_type_description == "tuple" and type(value) == tuple:  # noqa: E721
            value = list(value)

        # Allow python auto conversion from int to float
        if expected_type_description == "float" and type(value) == int:  # noqa: E721
            value = float(value)

        type_check_result = type_checker(param, value, possible_answer[param], expected_type_description,
                                         expected_type_converted, nested_type_converted)
        is_variable = type_check_result["is_variable"]
        if not type_check_result["valid"]:
            return type_check_result

        # A variable is compared as a plain value, not as a dict / list / string.
        if not is_variable:
            if expected_type_converted is dict:
                result = dict_checker(param, value, possible_answer[param])
                if not result["valid"]:
                    return result
                continue
            elif expected_type_converted is list and nested_type_converted is dict:
                result = list_dict_checker(param, value, possible_answer[param])
                if not result["valid"]:
                    return result
                continue
            elif expected_type_converted is str:
                # strings are compared case-insensitively unless they are variables
                result = string_checker(param, value, possible_answer[param])
                if not result["valid"]:
                    return result
                continue
            elif expected_type_converted is list:
                result = list_checker(param, value, possible_answer[param])
                if not result["valid"]:
                    return result
                continue

        if value not in possible_answer[param]:
            return _invalid(f"Invalid value for parameter {param!r}: {value!r}. "
                            f"Expected one of {possible_answer[param]}.", "value_error:others")

    # Optional parameters not provided must be marked optional ("" among the answers)
    for param in possible_answer:
        if param not in model_params and "" not in possible_answer[param]:
            return _invalid(f"Optional parameter {param!r} not provided and not marked as optional.",
                            "simple_function_checker:missing_optional")

    return result


def parallel_function_checker_no_order(func_descriptions: list, model_output: list, possible_answers: list) -> dict:
    if len(model_output) != len(possible_answers):
        return _invalid("Wrong number of functions.", "parallel_function_checker_no_order:wrong_count")

    matched_indices: list[int] = []
    # Answers one by one, each eliminating the first unclaimed model call that matches it (greedy,
    # as in BFCL: the ground truth names the function doc to check against).
    for i in range(len(possible_answers)):
        func_name_expected = list(possible_answers[i].keys())[0]
        func_description = find_description(func_descriptions, func_name_expected)

        all_errors: list = []
        result = {"valid": False}
        for index in range(len(model_output)):
            if index in matched_indices:
                continue
            result = simple_function_checker(func_description, model_output[index], possible_answers[i])
            if result["valid"]:
                matched_indices.append(index)
                break
            all_errors.append({f"Model Result Index {index}": {
                "sub_error": result["error"], "sub_error_type": result["error_type"],
                "model_output_item": model_output[index], "possible_answer_item": possible_answers[i],
            }})

        if not result["valid"]:
            considered_indices = [j for j in range(len(model_output)) if j not in matched_indices]
            all_errors.insert(0, f"Could not find a matching function among index {considered_indices} of model "
                                 f"output for index {i} of possible answers.")
            return {"valid": False, "error": all_errors,
                    "error_type": "parallel_function_checker_no_order:cannot_find_match"}

    return {"valid": True, "error": []}


def multiple_function_checker(func_descriptions: list, model_output: list, possible_answers: list) -> dict:
    if len(model_output) != len(possible_answers):
        return _invalid("Wrong number of functions.", "multiple_function_checker:wrong_count")
    # possible_answers is a list of only one dictionary with only one key
    func_name_expected = list(possible_answers[0].keys())[0]
    func_description = find_description(func_descriptions, func_name_expected)
    return simple_function_checker(func_description, model_output[0], possible_answers[0])


# ------------------------------------------------------------------------------------------
# Grading
# ------------------------------------------------------------------------------------------
def bfcl_match(calls: list[dict], answer: dict) -> tuple[bool, str]:
    """Match decoded ``calls`` (``[{name: {param: value}}]``) against a BFCL ``Problem.answer``."""
    if not is_function_calling_format_output(calls):
        return False, "Did not output in the specified format."
    category = answer.get("category") or answer.get("kind", "simple")
    res = ast_checker(answer.get("functions", []), calls, answer["ground_truth"], category)
    if res["valid"]:
        return True, "match"
    return False, f"{res.get('error_type')}: {_first_error(res.get('error'))}"


def _first_error(errors) -> str:
    if not errors:
        return ""
    head = errors[0]
    if isinstance(head, str) and len(errors) > 1 and isinstance(errors[1], dict):
        sub = next(iter(errors[1].values()))
        return f"{head} First: {sub.get('sub_error_type')}: {'; '.join(map(str, sub.get('sub_error', [])))}"
    return str(head)


def render_calls(calls: list[dict]) -> str:
    parts = []
    for call in calls:
        for name, kwargs in call.items():
            parts.append(f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})")
    return "[" + ", ".join(parts) + "]"


def grade(problem, completion: str, timeout_s: float = 10.0, *, truncated: bool = False) -> CheckResult:
    answer = problem.answer
    try:
        strict_calls = decode_calls(completion)
        ok, why = bfcl_match(strict_calls, answer)
    except DecodeError as e:
        strict_calls, ok, why = None, False, f"ast_decoder:decoder_failed: {e}"
    if strict_calls is not None or truncated:
        shown = render_calls(strict_calls) if strict_calls is not None else None
        tail = "same" if strict_calls is not None else "truncated: graded on the strict decoding only"
        return CheckResult(ok, shown, f"strict: {why}; flexible: {tail}", correct_flexible=ok)
    calls = find_calls(completion)
    if not calls:
        return CheckResult(False, None, f"strict: {why}; flexible: no Python function call found",
                           correct_flexible=False)
    fok, fwhy = bfcl_match(calls, answer)
    return CheckResult(False, render_calls(calls), f"strict: {why}; flexible (calls amid prose): {fwhy}",
                       correct_flexible=fok)
