"""One line of JSON for the agent's documents, written without importing ``json``.

``import json`` loads ``re`` and with it ``enum`` and ``functools``: more than the rest of
``gpu-agent status`` costs. This writer uses the C string escaper that ``json`` uses itself, so
its text is byte for byte ``json.dumps(doc, sort_keys=True, separators=(",", ":"))``: ASCII
only, keys sorted, no spaces, ``NaN``/``Infinity`` as ``json`` writes them.

Standard library only, Python 3.9+.
"""

from __future__ import annotations

# ``typing`` is needed by type checkers only: not importing it keeps the agent's start fast.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, List, Optional

_c_quote: Optional[Callable[[str], str]]
try:
    from _json import encode_basestring_ascii as _c_quote
except ImportError:  # another Python implementation: the pure-Python escaper below
    _c_quote = None

_SHORT_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def dumps(doc: Any) -> str:
    """``doc`` as compact, key-sorted, ASCII-only JSON text.

    Takes dicts with str keys, lists, tuples, str, int, float, bool and None (subclasses too);
    raises TypeError for anything else, including a key that is not a str.
    """
    parts: List[str] = []
    _write(doc, parts.append)
    return "".join(parts)


def quote(text: str) -> str:
    """A JSON string literal for ``text``; characters outside printable ASCII become ``\\u``
    escapes (surrogate pairs above U+FFFF)."""
    if _c_quote is not None:
        return _c_quote(text)
    return quote_python(text)


def quote_python(text: str) -> str:
    """:func:`quote` in pure Python (used where the ``_json`` accelerator is missing)."""
    out = ['"']
    for char in text:
        if " " <= char <= "~" and char not in '"\\':
            out.append(char)
            continue
        short = _SHORT_ESCAPES.get(char)
        if short is not None:
            out.append(short)
            continue
        code = ord(char)
        if code > 0xFFFF:  # a surrogate pair, as JSON has no longer escape
            code -= 0x10000
            high, low = 0xD800 | (code >> 10), 0xDC00 | (code & 0x3FF)
            out.append(f"\\u{high:04x}\\u{low:04x}")
        else:
            out.append(f"\\u{code:04x}")
    out.append('"')
    return "".join(out)


def _write(value: Any, out: Callable[[str], Any]) -> None:
    if isinstance(value, str):
        out(quote(value))
    elif value is None:
        out("null")
    elif value is True:
        out("true")
    elif value is False:
        out("false")
    elif isinstance(value, int):
        out(int.__repr__(value))
    elif isinstance(value, float):
        out(_float(value))
    elif isinstance(value, dict):
        _write_object(value, out)
    elif isinstance(value, (list, tuple)):
        out("[")
        for position, item in enumerate(value):
            if position:
                out(",")
            _write(item, out)
        out("]")
    else:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _write_object(value: Any, out: Callable[[str], Any]) -> None:
    for key in value:
        if not isinstance(key, str):
            raise TypeError(f"keys must be str, not {type(key).__name__}")
    out("{")
    for position, key in enumerate(sorted(value)):
        if position:
            out(",")
        out(quote(key))
        out(":")
        _write(value[key], out)
    out("}")


def _float(value: float) -> str:
    if value != value:
        return "NaN"
    if value == float("inf"):
        return "Infinity"
    if value == -float("inf"):
        return "-Infinity"
    return float.__repr__(value)
