"""``--chat-template``'s value: a template file or the template text (torch- and
transformers-free, so ``mmserve serve`` checks it before it loads anything)."""

from __future__ import annotations

import codecs
from pathlib import Path

_JINJA_CHARS = "{}\n"


def load_chat_template_arg(value: str) -> str:
    """``--chat-template``: the contents of the file it names, else the template itself (escape
    sequences such as ``\\n`` decoded, as vLLM does). A value that looks like a path but names
    no readable file is a ValueError."""
    try:
        return Path(value).expanduser().read_text()
    except OSError as exc:
        if not any(c in value for c in _JINJA_CHARS):
            raise ValueError(
                f"--chat-template {value!r} looks like a file path but cannot be read"
                f" ({exc.strerror or exc}); pass an existing file or the template text"
            ) from None
    except ValueError:  # e.g. a NUL byte in a long template string
        pass
    return codecs.decode(value, "unicode_escape")
