"""Which names from the heap may be printed: holder paths go to the job's log, to dumps and to
``/debug/memory``, and a dict's keys are data, not code.

A string dict key is shown (``['train']``) only when it reads like a name written in code: a
Python identifier or a small index (``'0'``), at most 40 characters, that does not look random
(a run of 16+ letters and digits mixing both, or of 24+ characters) and does not name a
credential (``password``, ``secret``, ``token``, ``api_key``, ...). Anything else (a cache keyed
by an API key, a user id, a path, a prompt) reads ``['<redacted 32 chars>']``: its length, never
its characters. Keys of ``nn.Module``'s own dicts (``_modules``, ``_parameters``, ``_buffers``)
and attribute names are set by code, so only the shape rule applies to them.
"""

from __future__ import annotations

import re

MAX_SHOWN = 40
_RUN = re.compile(r"[A-Za-z0-9]+")
_CREDENTIAL = re.compile(
    r"passw|secret|token(?!s(?:_|$)|iz)|api_?key|access_?key|private_?key|auth_?key|credential|bearer|"
    r"cookie|session_?id|signature",
    re.IGNORECASE,
)


def redacted(text: str) -> str:
    """``<redacted N chars>``: the length of ``text``, never its characters."""
    return f"<redacted {len(text)} chars>"


def _random_looking(text: str) -> bool:
    for run in _RUN.findall(text):
        mixed = any(c.isdigit() for c in run) and any(c.isalpha() for c in run)
        if (len(run) >= 16 and mixed) or len(run) >= 24:
            return True
    return False


def code_like(text: str) -> bool:
    """A name code would write: an identifier or a small index, not too long, not random."""
    return (
        0 < len(text) <= MAX_SHOWN
        and (text.isidentifier() or (text.isdecimal() and len(text) <= 6))
        and text.isascii()
        and not _random_looking(text)
    )


def shown(key: str) -> bool:
    """Whether a string dict key may be printed as it is."""
    return code_like(key) and not _CREDENTIAL.search(key)


def subscript(key: str, code: bool = False) -> str:
    """``['key']`` or ``['<redacted N chars>']``; ``code``: a dict keyed by attribute names."""
    return f"[{key!r}]" if (code_like(key) if code else shown(key)) else f"['{redacted(key)}']"


def attribute(name: str) -> str:
    """An attribute, global or local name as it is, unless ``setattr`` gave it a name code would not."""
    return name if code_like(name) or name == "?" else redacted(name)
