"""The rules for names users choose: stage and task names, file ids, agent names and error
texts, each refused with the rule it broke (control and bidirectional characters, length,
encoding)."""

from __future__ import annotations

import re
import unicodedata

from ..errors import InvalidFileId, InvalidInput

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


"""A task id or stage name, matched whole (``$`` would let a final newline in)."""


MAX_FILE_ID_BYTES = 512


MAX_AGENT_BYTES = 256


"""The longest agent name or consumer role, in bytes of UTF-8: each is stored in every
entry it holds or consumed, and every commit rewrites the shard."""


MAX_ERROR_CHARS = 1024


"""Stored error text (a ``fail`` reason, a mismatch) is cut to this many characters."""


def shown(value: object, limit: int = 300) -> str:
    """``value`` as an error message quotes it: its repr, cut at ``limit`` characters (a
    value of megabytes is not quoted whole), then the value's own length."""
    text = repr(value)
    if len(text) <= limit:
        return text
    if isinstance(value, str):
        size = len(value.encode("utf-8", "surrogatepass"))
        length = f"{len(value)} characters" + (f", {size} bytes" if size != len(value) else "")
    else:
        length = f"{len(text)} characters as written"
    return f"{text[:limit]}... ({length})"


def check_name(kind: str, value: str) -> str:
    """Task ids and stage names become parts of object keys, so they are kept plain."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise InvalidInput(
            f"invalid {kind} {shown(value)}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


INVISIBLE = frozenset(("Cc", "Cf", "Zl", "Zp"))


"""The Unicode categories refused in file ids, agent names and consumer roles: control
characters (tab and newline included), format characters (zero-width spaces and joiners,
U+FEFF, word joiners, tag characters, the bidirectional controls) and the line and
paragraph separators (U+2028, U+2029), which some readers take for line breaks. None shows
as itself: a name is shown in the terminal and on the web page as it is spelt, and read
back from files of one name a line."""


BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)


"""Characters that reorder the text shown around them (``x\u202egpj.exe`` shows as
"xexe.jpg")."""


def unprintable(text: str) -> str | None:
    """Why ``text`` cannot be a name (its first character of the ``INVISIBLE`` categories,
    named by its code point), or None."""
    for c in text:
        category = unicodedata.category(c)
        if category not in INVISIBLE:
            continue
        point = f"U+{ord(c):04X}"
        if category == "Cc":
            return f"it contains a control character ({point}: a newline, a tab, an escape ...)"
        if c in BIDI_CONTROLS:
            return (
                f"it contains a bidirectional control character ({point}: it would be shown "
                "reordered)"
            )
        if category == "Cf":
            return f"it contains an invisible format character ({point})"
        return f"it contains a line or paragraph separator ({point})"
    return None


def _is_utf8(text: str) -> bool:
    """False for a lone surrogate (bytes that were not UTF-8, smuggled in by the OS)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_file_id(file_id: str) -> str:
    """File ids are relative object keys: refuse what could escape or confuse a prefix."""
    problem = None
    if not isinstance(file_id, str) or not file_id:
        problem = "it is empty" if file_id == "" else "it is not a string"
    elif not _is_utf8(file_id):
        problem = "it is not valid UTF-8 text"
    elif file_id.startswith("/"):
        problem = "it is absolute (starts with '/')"
    elif len(file_id.encode()) > MAX_FILE_ID_BYTES:
        problem = f"it is longer than {MAX_FILE_ID_BYTES} bytes"
    elif (unseen := unprintable(file_id)) is not None:
        problem = unseen
    elif "\\" in file_id:
        problem = "it contains a backslash; use '/' between parts"
    else:
        parts = file_id.split("/")
        if any(p in ("", ".", "..") for p in parts):
            problem = "it has an empty, '.' or '..' path segment"
    if problem:
        raise InvalidFileId(
            f"invalid file id {shown(file_id)}: {problem}. Use a relative key such as 'raw/a.json'."
        )
    return file_id


def check_agent(kind: str, value: object) -> str:
    """An agent name or a consumer role: any text a person would type, within limits."""
    problem = None
    if not isinstance(value, str):
        problem = f"it is a {type(value).__name__}, not a string"
    elif not value.strip():
        problem = "it is empty"
    elif not _is_utf8(value):
        problem = "it is not valid UTF-8 text"
    elif len(value.encode()) > MAX_AGENT_BYTES:
        problem = f"it is longer than {MAX_AGENT_BYTES} bytes"
    elif (unseen := unprintable(value)) is not None:
        problem = unseen
    if problem:
        shown = value if not isinstance(value, str) or len(value) <= 80 else value[:80] + "..."
        raise InvalidInput(
            f"invalid {kind} {shown!r}: {problem}. Use up to {MAX_AGENT_BYTES} bytes of "
            "printable text, such as 'collector-1'."
        )
    assert isinstance(value, str)
    return value


def error_text(text: object) -> str:
    """Error text as it is stored in an entry: a string of at most ``MAX_ERROR_CHARS``
    characters (a longer one is cut, saying how long it was), valid UTF-8."""
    if not isinstance(text, str):
        raise InvalidInput(f"a reason must be a string, not {type(text).__name__}")
    text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) <= MAX_ERROR_CHARS:
        return text
    tail = f" ... [cut to {MAX_ERROR_CHARS} of {len(text)} characters]"
    return text[: MAX_ERROR_CHARS - len(tail)] + tail
