"""How large a regular expression grows once compiled, worked out before it is compiled.

The ``regex`` engine expands counted repeats of groups: ``((a{1000}){1000}){1000}`` becomes
a program of about 10⁹ nodes, and compiling it takes gigabytes and minutes inside C code that
no signal interrupts. :func:`expanded_size` reads the pattern's text once (linear time,
nothing allocated per repeat) and returns its size with every counted repeat expanded: each
character, escape, class and group counts once per repetition of every ``{m,n}`` around it.
A figure-of-merit regex larger than ``LIMITS.regex_size`` is refused before ``regex.compile``
sees it.

The reading is deliberately simple: it knows escapes, character classes (nested, as in
``regex``'s version 1 syntax), groups, alternation and the quantifiers ``*``, ``+``, ``?``,
``{m}``, ``{m,}``, ``{,n}`` and ``{m,n}``; anything else counts as one character. It may
overestimate (``{e<=1}``, a fuzzy constraint, is read as a repeat of one), never
underestimate a repeat.
"""

from __future__ import annotations

import re

__all__ = ["expanded_size"]

_COUNT = re.compile(r"\{(\d*)(?:(,)(\d*))?\}")
_NAMED_ESCAPE = re.compile(r"\\[pPNxuUgkL]\{[^}]*\}|\\[gkL]<[^>]*>")
_HUGE = 10**18
"""A repeat count read as this many (counts with more than 18 digits are never converted)."""


def _count(match: re.Match[str]) -> int:
    """The largest number of repetitions a ``{m,n}`` quantifier allows (``{m,}``: m)."""
    low, comma, high = match.group(1), match.group(2), match.group(3)
    digits = high if comma and high else low
    if not digits:
        return 1
    return _HUGE if len(digits) > 18 else int(digits)


def _skip_class(pattern: str, i: int) -> int:
    """The index after the character class that opens at ``pattern[i] == '['``."""
    depth, i = 1, i + 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    while i < len(pattern) and depth:
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        i += 1
    return i


def expanded_size(pattern: str, limit: int) -> int:
    """The size of ``pattern`` with its counted repeats expanded, or a number larger than
    ``limit`` as soon as it is known to exceed it."""
    # one frame per open group: [size so far, size of the last item (what a quantifier
    # repeats)]
    stack: list[list[int]] = [[0, 0]]
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        frame = stack[-1]
        if ch == "\\":
            named = _NAMED_ESCAPE.match(pattern, i)
            i = named.end() if named else i + 2
            frame[0] += 1
            frame[1] = 1
        elif ch == "[":
            i = _skip_class(pattern, i)
            frame[0] += 1
            frame[1] = 1
        elif ch == "(":
            stack.append([1, 0])  # the group itself counts once
            i += 1
        elif ch == ")" and len(stack) > 1:
            size = stack.pop()[0]
            stack[-1][0] += size
            stack[-1][1] = size
            i += 1
        elif ch == "|":
            frame[1] = 0
            i += 1
        elif ch == "{" and (count := _COUNT.match(pattern, i)) is not None:
            times = _count(count)
            frame[0] += frame[1] * (times - 1) if times > 0 else -frame[1]
            frame[1] *= times
            i = count.end()
        else:  # a character, or a quantifier that adds nothing: * + ?
            if ch not in "*+?":
                frame[0] += 1
                frame[1] = 1
            i += 1
        if stack[-1][0] > limit or stack[-1][1] > limit:
            return limit + 1
    while len(stack) > 1:  # unbalanced: compile reports it; size what was read
        size = stack.pop()[0]
        stack[-1][0] += size
    return stack[0][0]
