"""Names in error messages: a long value is quoted cut, with its own length (not the length
of its quoted form), in characters and, where they differ, UTF-8 bytes."""

from __future__ import annotations

import pytest

from objmanifest.core.names import MAX_FILE_ID_BYTES, check_file_id, check_name, shown
from objmanifest.errors import InvalidFileId, InvalidInput


@pytest.mark.parametrize(
    ("file_id", "length"),
    [
        ("x" * (MAX_FILE_ID_BYTES + 1), f"({MAX_FILE_ID_BYTES + 1} characters)"),
        ("é" * 300, "(300 characters, 600 bytes)"),
    ],
)
def test_a_file_id_too_long_is_quoted_cut_with_its_own_length(file_id: str, length: str) -> None:
    with pytest.raises(InvalidFileId) as raised:
        check_file_id(file_id)
    message = str(raised.value)
    assert f"... {length}: it is longer than {MAX_FILE_ID_BYTES} bytes" in message
    assert len(message) < 500


def test_a_long_name_is_quoted_cut_with_its_own_length() -> None:
    with pytest.raises(InvalidInput, match=r"\.\.\. \(1000 characters\): use 1-128"):
        check_name("stage name", "s" * 999 + "!")


def test_a_short_value_is_quoted_whole_and_others_say_their_written_length() -> None:
    assert shown("a'b") == '"a\'b"'
    assert shown(list(range(200)), limit=20).endswith("... (890 characters as written)")
