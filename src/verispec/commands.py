"""Running a parsed command the way every verispec entry point does (``verispec``, ``python -m verispec.serve``,
``python -m verispec.integrations.lm_eval``): bad input and failures the user can fix end in one
``verispec: error:`` line and exit status 2 (1 for a failure at run time), never a traceback
(``VERISPEC_DEBUG=1`` shows it)."""

from __future__ import annotations

import argparse
import os
import sys

#: The longest error line printed: user data quoted in a message is cut where it is quoted
#: (:func:`verispec.params.shown`); this bounds every other line (a 254 MB line came from a YAML bomb).
MAX_ERROR_CHARS = 2000


def debug_enabled() -> bool:
    """``VERISPEC_DEBUG`` set to anything but empty, ``0``, ``false``, ``no`` or ``off``."""
    return os.environ.get("VERISPEC_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


def run_command(args: argparse.Namespace) -> int:
    """``args.func(args)`` (a subcommand's handler) -> its exit status, errors turned into one line; the
    environment is checked first (:func:`verispec.runtime.check_environment`)."""
    from verispec.runtime import check_environment

    try:
        check_environment()
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("verispec: interrupted (a bench keeps every stored sample: the same command resumes it)", file=sys.stderr)
        return 130
    except Exception as exc:
        if debug_enabled():
            raise
        code, text = error_text(exc)
        if text is None:
            raise
        print(f"verispec: error: {bounded(text)}", file=sys.stderr)
        return code


def bounded(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters (saying how many were left out)."""
    line = " ".join(text.split()) if "\n" in text or "\r" in text else text
    if len(line) <= limit:
        return line
    return f"{line[:limit]}… ({len(line) - limit} more characters)"


#: optional dependency -> the verispec extra that installs it
_EXTRAS = {"transformers": "hf", "accelerate": "hf", "gguf": "hf", "llama_cpp": "llama", "ray": "ray",
           "matplotlib": "bench", "yaml": "bench", "scipy": "bench"}


def error_text(exc: BaseException) -> tuple[int, str | None]:
    """``(exit status, one line)`` for an error the user can act on; ``(1, None)`` for a bug (re-raised)."""
    import sqlite3

    from verispec.outputs import os_error_text

    if isinstance(exc, UnicodeError):
        return 2, f"text that is not valid UTF-8: {exc}; pass UTF-8 text"
    if isinstance(exc, (ValueError, FileNotFoundError, argparse.ArgumentTypeError)):
        return 2, str(exc)
    if isinstance(exc, ImportError):
        extra = _EXTRAS.get((getattr(exc, "name", None) or "").split(".")[0])
        return 2, str(exc) + (f": pip install 'verispec[{extra}]'" if extra and "pip install" not in str(exc) else "")
    if isinstance(exc, OSError):
        return 2, os_error_text(exc, "use")
    if isinstance(exc, sqlite3.Error):
        return 2, f"SQLite: {exc}"
    if isinstance(exc, NotImplementedError):
        return 2, str(exc) or "not supported"
    if isinstance(exc, MemoryError):
        return 1, "out of memory: use smaller models, a smaller --n-ctx or --batch-size"
    if isinstance(exc, RuntimeError) and str(exc):
        return 1, f"{exc} (VERISPEC_DEBUG=1 shows the traceback)"
    return 1, None
