"""ECMA-262 patterns, JSON Schema's regex dialect, translated for `regex`, whose matcher can stop.

JSON Schema gives `pattern` and `patternProperties` the meaning of ECMA-262 with the `u` flag:
`$` only at the very end, `.` not across any line terminator, `\\d` ASCII digits only. Python's
regexes read the same text differently (`$` before a final newline, `\\d` any Unicode digit), so
a pattern is checked by `regress` (an ECMA-262 engine), then translated construct by construct
into `regex` syntax with the ECMA meaning spelled out (`$` -> `\\Z`, `\\d` -> `[0-9]`, ...).
`regress` itself is not used to match: it has no timeout, and `^(a|a)*$` on 24 characters
already holds the interpreter for most of a second (bench/patterns.py).

What the translation cannot give the ECMA meaning is refused (PatternError): backreferences
(ECMA resets them on every repetition, Python does not) and group modifiers (`(?i:...)`).
"""

from __future__ import annotations

from collections.abc import Iterable

import regex
import regress

# `regex` unrolls the minimum of every counted repeat when it compiles: `a{99999}` becomes
# 99,999 nodes, 25 ms and 14 MB (`a{10000000}` exhausts memory). The nodes repeats add, over
# all the patterns of one schema, are held to this; the text itself is bounded by its length.
MAX_UNROLLED = 10_000
_MAX_CODE_POINT = 0x10FFFF
_SYNTAX = frozenset("^$\\.*+?()[]{}|/")
_CONTROL = {"f": 0x0C, "n": 0x0A, "r": 0x0D, "t": 0x09, "v": 0x0B}

Ranges = list[tuple[int, int]]

_DIGIT: Ranges = [(0x30, 0x39)]
_WORD: Ranges = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
# WhiteSpace and LineTerminator of ECMA-262 (§12.2, §12.3): Python's \s differs (it has
# U+001C..U+001F and U+0085, and lacks U+FEFF).
_SPACE: Ranges = [
    (0x09, 0x0D),
    (0x20, 0x20),
    (0xA0, 0xA0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
    (0xFEFF, 0xFEFF),
]
_LINE_TERMINATORS: Ranges = [(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]


class PatternError(ValueError):
    """A pattern that is not ECMA-262, or that the proxy cannot match with ECMA-262's meaning."""


def compile_pattern(source: str, max_length: int | None = None) -> regex.Pattern[str]:
    """The `regex` pattern with the ECMA-262 (`u` flag) meaning of `source`.

    Raises PatternError naming what is wrong; `max_length` (characters) is checked first, so
    that no engine spends time on a pattern over it.
    """
    if max_length is not None and len(source) > max_length:
        raise PatternError(f"pattern of {len(source)} characters is over {max_length}")
    return Patterns().get(source)


class Patterns:
    """The patterns of one schema, each compiled once; the nodes their repeats unroll to, all
    together, stay within MAX_UNROLLED."""

    def __init__(self) -> None:
        self._compiled: dict[str, regex.Pattern[str]] = {}
        self.unrolled = 0

    def get(self, source: str) -> regex.Pattern[str]:
        """`source` compiled (once) with its ECMA-262 meaning; raises PatternError."""
        found = self._compiled.get(source)
        if found is not None:
            return found
        try:
            regress.Regex(source, "u")
        except regress.RegressError as exc:
            raise PatternError(f"not an ECMA-262 pattern: {exc}") from None
        translated, unrolled = _translate(source)
        if self.unrolled + unrolled > MAX_UNROLLED:
            raise PatternError(
                f"counted repeats unroll to {self.unrolled + unrolled} nodes, over {MAX_UNROLLED}"
            )
        try:
            found = regex.compile(translated, regex.V0)
        except regex.error as exc:  # a property escape `regex` does not know
            raise PatternError(f"not supported: {exc}") from None
        self.unrolled += unrolled
        self._compiled[source] = found
        return found

    def __len__(self) -> int:
        return len(self._compiled)


def translate(source: str) -> str:
    """`source`, an ECMA-262 pattern, in `regex` syntax with the same meaning."""
    return _translate(source)[0]


def _translate(source: str) -> tuple[str, int]:
    """The translation and the nodes its counted repeats add when `regex` unrolls them."""
    parser = _PatternParser(source)
    try:
        out, _ = parser.disjunction()
    except RecursionError:
        raise PatternError("pattern nested too deep") from None
    if parser.pos != len(source):
        raise PatternError(f"unexpected {source[parser.pos]!r} at {parser.pos}")
    if parser.unrolled > MAX_UNROLLED:
        raise PatternError(
            f"counted repeats unroll to {parser.unrolled} nodes, over {MAX_UNROLLED}"
        )
    return out, parser.unrolled


def _char(code: int) -> str:
    return f"\\U{code:08x}"


def _normalised(ranges: Iterable[tuple[int, int]]) -> Ranges:
    merged: Ranges = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def _weight(ranges: Ranges) -> int:
    """What a class weighs against MAX_UNROLLED: `regex` builds it range by range."""
    return max(1, len(ranges))


def _complement(ranges: Ranges) -> Ranges:
    found: Ranges = []
    start = 0
    for lo, hi in _normalised(ranges):
        if lo > start:
            found.append((start, lo - 1))
        start = hi + 1
    if start <= _MAX_CODE_POINT:
        found.append((start, _MAX_CODE_POINT))
    return found


def _class(ranges: Ranges, properties: Iterable[str] = (), negated: bool = False) -> str:
    """A `regex` character class of code point ranges and property escapes."""
    ranges = _normalised(ranges)
    properties = list(properties)
    if not properties:
        if negated:
            ranges, negated = _complement(ranges), False
        if not ranges:
            return "(?!)"  # `[]`: matches nothing
    body = "".join(_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in ranges)
    return "[" + ("^" if negated else "") + body + "".join(properties) + "]"


# ECMA-262's \b is between a character of [A-Za-z0-9_] and one outside it: `regex`'s \b
# under the ASCII flag, scoped to the assertion.
_BOUNDARY = "(?a:\\b)"
_NOT_BOUNDARY = "(?a:\\B)"
_ESCAPE_SETS = {
    "d": _DIGIT,
    "D": _complement(_DIGIT),
    "w": _WORD,
    "W": _complement(_WORD),
    "s": _SPACE,
    "S": _complement(_SPACE),
}


class _PatternParser:
    """Recursive descent over ECMA-262's Pattern grammar (§22.2.1, `u` flag); each method
    returns the `regex` text and its size in nodes once unrolled. `unrolled` sums the nodes
    that counted repeats add."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.pos = 0
        self.unrolled = 0

    def peek(self, ahead: int = 0) -> str:
        at = self.pos + ahead
        return self.source[at] if at < len(self.source) else ""

    def take(self, expected: str) -> None:
        if not self.source.startswith(expected, self.pos):
            raise PatternError(f"expected {expected!r} at {self.pos}")
        self.pos += len(expected)

    def disjunction(self) -> tuple[str, int]:
        parts = [self.alternative()]
        while self.peek() == "|":
            self.pos += 1
            parts.append(self.alternative())
        return "|".join(p for p, _ in parts), sum(n for _, n in parts)

    def alternative(self) -> tuple[str, int]:
        out: list[str] = []
        unrolled = 0
        while self.peek() not in ("", "|", ")"):
            text, n = self.term()
            out.append(text)
            unrolled += n
        return "".join(out), unrolled

    def term(self) -> tuple[str, int]:
        c = self.peek()
        rest = self.source[self.pos :]
        if c == "^":
            self.pos += 1
            return "\\A", 1
        if c == "$":
            self.pos += 1
            return "\\Z", 1
        if rest.startswith(("\\b", "\\B")):
            self.pos += 2
            return (_BOUNDARY if rest[1] == "b" else _NOT_BOUNDARY), 1
        for opener in ("(?=", "(?!", "(?<=", "(?<!"):
            if rest.startswith(opener):
                self.pos += len(opener)
                inner, n = self.disjunction()
                self.take(")")
                return f"{opener}{inner})", n
        atom, n = self.atom()
        return self.quantified(atom, n)

    def quantified(self, atom: str, unrolled: int) -> tuple[str, int]:
        c = self.peek()
        if c in ("*", "+", "?"):
            self.pos += 1
            quantifier, least = c, (1 if c == "+" else 0)
        elif c == "{":
            quantifier, least = self.braces()
        else:
            return atom, unrolled
        if self.peek() == "?":
            self.pos += 1
            quantifier += "?"
        if least > 1:
            self.unrolled += unrolled * (least - 1)
            if self.unrolled > MAX_UNROLLED:  # stop before the sizes grow without bound
                raise PatternError(f"counted repeats unroll to over {MAX_UNROLLED} nodes")
        return f"(?:{atom}){quantifier}", unrolled * max(least, 1)

    def braces(self) -> tuple[str, int]:
        self.take("{")
        least = self.number()
        most: int | None = least
        if self.peek() == ",":
            self.pos += 1
            most = self.number() if self.peek() != "}" else None
        self.take("}")
        if most is not None and most < least:
            raise PatternError("numbers out of order in a {} quantifier")
        if least > MAX_UNROLLED or (most is not None and most > 0xFFFFFFFE):
            raise PatternError(f"repeat count over {MAX_UNROLLED}")
        if most is None:
            return f"{{{least},}}", least
        return (f"{{{least}}}" if most == least else f"{{{least},{most}}}"), least

    def number(self) -> int:
        start = self.pos
        while self.peek().isascii() and self.peek().isdigit():
            self.pos += 1
        if start == self.pos:
            raise PatternError(f"expected a number at {start}")
        digits = self.source[start : self.pos]
        return int(digits) if len(digits) <= 12 else 10**12

    def atom(self) -> tuple[str, int]:
        c = self.peek()
        if c == ".":
            self.pos += 1
            return _class(_LINE_TERMINATORS, negated=True), _weight(_complement(_LINE_TERMINATORS))
        if c == "[":
            return self.character_class()
        if c == "(":
            return self.group()
        if c == "\\":
            self.pos += 1
            return self.atom_escape()
        if c == "" or c in "*+?{}])|":
            raise PatternError(f"unexpected {c!r} at {self.pos}")
        self.pos += 1
        return _char(ord(c)), 1

    def group(self) -> tuple[str, int]:
        self.take("(")
        if self.peek() == "?":
            if self.peek(1) == ":":
                self.pos += 2
            elif self.peek(1) == "<":
                end = self.source.find(">", self.pos)
                if end < 0:
                    raise PatternError(f"unterminated group name at {self.pos}")
                self.pos = end + 1  # the name only serves backreferences, refused below
            else:
                raise PatternError(f"group modifiers are not supported (at {self.pos - 1})")
        inner, n = self.disjunction()
        self.take(")")
        return f"(?:{inner})", n

    def atom_escape(self) -> tuple[str, int]:
        c = self.peek()
        if c in _ESCAPE_SETS:
            self.pos += 1
            return _class(_ESCAPE_SETS[c]), _weight(_ESCAPE_SETS[c])
        if c in ("p", "P"):
            return f"[{self.property_escape()}]", 1
        if c == "k" or ("1" <= c <= "9"):
            raise PatternError(f"backreferences are not supported (at {self.pos - 1})")
        return _char(self.character_escape(in_class=False)), 1

    def property_escape(self) -> str:
        negated = self.peek() == "P"
        self.pos += 1
        self.take("{")
        end = self.source.find("}", self.pos)
        if end < 0:
            raise PatternError(f"unterminated property escape at {self.pos}")
        name = self.source[self.pos : end]
        self.pos = end + 1
        if not all(ch.isascii() and (ch.isalnum() or ch in "_=") for ch in name):
            raise PatternError(f"property name {name!r}")
        return ("\\P{" if negated else "\\p{") + name + "}"

    def character_escape(self, *, in_class: bool) -> int:
        """The code point of a CharacterEscape (after its backslash)."""
        c = self.peek()
        self.pos += 1
        if c in _CONTROL:
            return _CONTROL[c]
        if c == "c" and self.peek().isascii() and self.peek().isalpha():
            self.pos += 1
            return ord(self.source[self.pos - 1]) % 32
        if c == "0" and not self.peek().isdigit():
            return 0
        if c == "x":
            return self.hex_digits(2)
        if c == "u":
            return self.unicode_escape(in_class=in_class)
        if c in _SYNTAX or (in_class and c == "-"):
            return ord(c)
        raise PatternError(f"invalid escape \\{c} at {self.pos - 2}")

    def hex_digits(self, count: int) -> int:
        digits = self.source[self.pos : self.pos + count]
        if len(digits) != count or not all(d in "0123456789abcdefABCDEF" for d in digits):
            raise PatternError(f"expected {count} hex digits at {self.pos}")
        self.pos += count
        return int(digits, 16)

    def unicode_escape(self, *, in_class: bool) -> int:
        if self.peek() == "{":
            end = self.source.find("}", self.pos)
            digits = self.source[self.pos + 1 : end] if end > 0 else ""
            if not digits or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise PatternError(f"invalid \\u{{...}} escape at {self.pos}")
            self.pos = end + 1
            code = int(digits, 16)
            if code > _MAX_CODE_POINT:
                raise PatternError("\\u{...} beyond U+10FFFF")
            return code
        code = self.hex_digits(4)
        # With the `u` flag a surrogate pair written as two escapes is one code point.
        if 0xD800 <= code <= 0xDBFF and self.source.startswith("\\u", self.pos):
            saved = self.pos
            self.pos += 2
            try:
                low = self.hex_digits(4)
            except PatternError:
                low = -1
            if 0xDC00 <= low <= 0xDFFF:
                return 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
            self.pos = saved
        return code

    def character_class(self) -> tuple[str, int]:
        self.take("[")
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges: Ranges = []
        properties: list[str] = []
        while self.peek() != "]":
            if self.peek() == "":
                raise PatternError("unterminated character class")
            low = self.class_atom(ranges, properties)
            if low is None or self.peek() != "-" or self.peek(1) in ("]", ""):
                if low is not None:
                    ranges.append((low, low))
                continue
            self.pos += 1  # the range's `-`
            high = self.class_atom(ranges, properties)
            if high is None or high < low:
                raise PatternError(f"invalid character range before {self.pos}")
            ranges.append((low, high))
        self.take("]")
        merged = _normalised(ranges)
        return _class(merged, properties, negated), _weight(merged) + len(properties)

    def class_atom(self, ranges: Ranges, properties: list[str]) -> int | None:
        """One code point, or None after adding a class escape's set to `ranges`/`properties`."""
        c = self.peek()
        if c != "\\":
            self.pos += 1
            return ord(c)
        self.pos += 1
        c = self.peek()
        if c in _ESCAPE_SETS:
            self.pos += 1
            ranges.extend(_ESCAPE_SETS[c])
            return None
        if c in ("p", "P"):
            properties.append(self.property_escape())
            return None
        if c == "b":
            self.pos += 1
            return 0x08
        return self.character_escape(in_class=True)
