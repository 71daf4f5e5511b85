"""Check ``--selector`` as PromQL reads it: a comma-separated list of label matchers.

Every series in the rules is written ``metric{<selector>}``, so a selector that PromQL cannot parse
(``job=foo``, unquoted) would render rules that Prometheus refuses to load. ``parse_selector`` takes
the grammar of Prometheus' lexer: ``name op "value"``, the name ``[a-zA-Z_][a-zA-Z0-9_]*`` (not a
reserved ``__`` name: the rules set the metric name themselves), the operator one of ``=`` ``!=``
``=~`` ``!~``, the value a double- or single-quoted string with Go escapes or a backquoted raw
string; an optional trailing comma. Regular expressions are checked by Prometheus (RE2), not here.
"""

from __future__ import annotations

import re

OPERATORS = ("=~", "!~", "!=", "=")
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# A valid escape inside '...' or "..." (Prometheus' lexEscape): the string's own quote, one of
# \a \b \f \n \r \t \v \\, \x and two hex digits, \u and four, \U and eight, or three octal digits.
_ESCAPE = re.compile(r"\\(?:[abfnrtv\\]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3})")
Matcher = tuple[str, str, str]


def _fail(text: str, why: str) -> ValueError:
    return ValueError(
        f"memexporter: selector {text!r} is not a PromQL label-matcher list: {why} "
        '(expected e.g. \'job="trainer"\' or \'namespace="ml",job=~"trainer-.*"\')'
    )


def _skip(text: str, pos: int) -> int:
    """The first position at or after ``pos`` that is not whitespace."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _string(text: str, pos: int, name: str, op: str) -> int:
    """The end of the quoted string that starts at ``pos`` (after its closing quote)."""
    quote = text[pos] if pos < len(text) else ""
    if quote not in ("'", '"', "`"):
        bare = re.match(r"[^,\s]*", text[pos:])
        value = bare.group(0) if bare else ""
        raise _fail(text, f'the value of {name} must be a quoted string, e.g. {name}{op}"{value}"')
    i = pos + 1
    while i < len(text):
        ch = text[i]
        if ch == quote:
            return i + 1
        if ch == "\n" and quote != "`":
            break
        if ch == "\\" and quote != "`":
            if text.startswith("\\" + quote, i):
                i += 2
                continue
            esc = _ESCAPE.match(text, i)
            if esc is None:
                raise _fail(
                    text,
                    f"unknown escape sequence {text[i : i + 2]!r} in the value of {name}; a regular "
                    'expression\'s backslash is written twice inside quotes, e.g. "\\\\d+"',
                )
            i = esc.end()
            continue
        i += 1
    raise _fail(text, f"the value of {name} has no closing {quote}")


def parse_selector(text: str) -> tuple[Matcher, ...]:
    """``'job="a", rank!="0"'`` -> ``(("job", "=", '"a"'), ("rank", "!=", '"0"'))``; ValueError
    names the selector and what is wrong with it."""
    out: list[Matcher] = []
    pos = _skip(text, 0)
    if text.startswith("{", pos):
        raise _fail(text, "give the matchers without braces")
    while pos < len(text):
        name = _NAME.match(text, pos)
        if name is None:
            raise _fail(text, f"{text[pos:]!r} does not start with a label name ([a-zA-Z_][a-zA-Z0-9_]*)")
        if name.group(0).startswith("__"):
            raise _fail(text, f"{name.group(0)} is reserved (labels starting with __ are Prometheus' own)")
        pos = _skip(text, name.end())
        op = next((o for o in OPERATORS if text.startswith(o, pos)), None)
        if op is None:
            raise _fail(text, f"{name.group(0)} must be followed by one of {', '.join(OPERATORS)}")
        start = _skip(text, pos + len(op))
        if text.startswith(("=", "~", "!"), start):
            raise _fail(
                text, f"{text[pos : start + 1].strip()!r} is not a matcher operator; use one of {', '.join(OPERATORS)}"
            )
        end = _string(text, start, name.group(0), op)
        out.append((name.group(0), op, text[start:end]))
        pos = _skip(text, end)
        if pos < len(text):
            if text[pos] != ",":
                raise _fail(
                    text, f"matchers are separated by commas; found {text[pos:]!r} after {text[:pos].strip()!r}"
                )
            pos = _skip(text, pos + 1)
    if not out:
        raise _fail(text, "it is empty; to select every job write 'job=~\".+\"'")
    return tuple(out)
