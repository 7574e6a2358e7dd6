"""ClickHouse SQL read as the engine's lexer reads it, for the store's guards and ``rolloutbus query``. Pure.

The guards must see the same code the engine runs: a comment or a string the guard misreads can hide
``file(...)`` or a ``SETTINGS`` clause from it. So this follows ClickHouse's lexer where it matters:
``--`` comments end at a newline only, ``#`` followed by a space or ``!`` is a comment, ``/* */`` nest,
strings take both ``\\'`` and ``''``, identifiers may be quoted with ``"`` or backticks, and heredocs
``$tag$...$tag$`` are strings. What it does not recognise it leaves as code, which the guards then see.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WS = " \t\n\r\f\v"
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_NUMBER = re.compile(r"(?:0[xX][0-9A-Fa-f]+|0[bB][01]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)")
_HEREDOC = re.compile(r"\$([A-Za-z0-9_]*)\$")


@dataclass(frozen=True)
class Token:
    kind: str  # word, number, string, ident (quoted identifier), punct
    text: str
    start: int
    end: int

    def is_word(self, *words: str) -> bool:
        return self.kind == "word" and self.text.upper() in words


def _quoted_end(sql: str, i: int) -> int:
    """End (exclusive) of the quoted token starting at ``i``: backslash escapes and a doubled quote."""
    quote, n, j = sql[i], len(sql), i + 1
    while j < n:
        ch = sql[j]
        if ch == "\\":
            j += 2
            continue
        if ch == quote:
            if j + 1 < n and sql[j + 1] == quote:
                j += 2
                continue
            return j + 1
        j += 1
    return n  # unterminated: the engine refuses it; the rest is not code


def scan(sql: str) -> tuple[list[Token], list[tuple[int, int]]]:
    """The tokens of ``sql`` (comments and whitespace dropped) and the spans of its comments."""
    tokens: list[Token] = []
    comments: list[tuple[int, int]] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in _WS:
            i += 1
        elif sql.startswith("--", i) or (ch == "#" and i + 1 < n and sql[i + 1] in " !"):
            j = sql.find("\n", i)
            j = n if j < 0 else j + 1
            comments.append((i, j))
            i = j
        elif sql.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if sql.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif sql.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            comments.append((i, j))
            i = j
        elif ch == "'":
            j = _quoted_end(sql, i)
            tokens.append(Token("string", sql[i:j], i, j))
            i = j
        elif ch in "\"`":
            j = _quoted_end(sql, i)
            tokens.append(Token("ident", sql[i:j], i, j))
            i = j
        elif ch == "$" and (m := _HEREDOC.match(sql, i)):
            close = sql.find(m.group(0), m.end())
            j = n if close < 0 else close + len(m.group(0))
            tokens.append(Token("string", sql[i:j], i, j))
            i = j
        elif m := _WORD.match(sql, i):
            tokens.append(Token("word", m.group(0), i, m.end()))
            i = m.end()
        elif ch.isdigit() or (ch == "." and i + 1 < n and sql[i + 1].isdigit()):
            m = _NUMBER.match(sql, i)
            j = m.end() if m else i + 1
            tokens.append(Token("number", sql[i:j], i, j))
            i = j
        else:
            tokens.append(Token("punct", ch, i, i + 1))
            i += 1
    return tokens, comments


def strip_literals(sql: str) -> str:
    """``sql`` with string literals blanked to ``''`` and comments to a space, so a name inside one does not count."""
    tokens, comments = scan(sql)
    spans = sorted([(t.start, t.end, "''") for t in tokens if t.kind == "string"] + [(a, b, " ") for a, b in comments])
    out, at = [], 0
    for start, end, repl in spans:
        out.append(sql[at:start])
        out.append(repl)
        at = end
    out.append(sql[at:])
    return "".join(out)


def unquote(token: Token) -> str:
    """A string literal's or a quoted identifier's text; a word or number as written."""
    if token.kind in ("string", "ident"):
        if token.text.startswith("$"):
            tag = _HEREDOC.match(token.text)
            assert tag is not None
            return token.text[len(tag.group(0)): len(token.text) - len(tag.group(0))]
        body, quote = token.text[1:-1], token.text[0]
        return re.sub(r"\\(.)", r"\1", body.replace(quote * 2, quote))
    return token.text


class Unreadable(ValueError):
    """A SETTINGS clause or SET statement whose values are not plain literals."""


# Words that may follow a column or alias named ``settings``: after one of them ``settings`` is no clause.
_AFTER_NAME = {
    "FROM", "AS", "WHERE", "PREWHERE", "GROUP", "ORDER", "HAVING", "LIMIT", "OFFSET", "UNION", "EXCEPT", "INTERSECT", "AND",
    "OR", "NOT", "IS", "IN", "LIKE", "ILIKE", "BETWEEN", "FORMAT", "JOIN", "LEFT", "RIGHT", "INNER", "OUTER", "FULL", "CROSS",
    "ARRAY", "GLOBAL", "ANY", "ALL", "ASOF", "SEMI", "ANTI", "ON", "USING", "FINAL", "SAMPLE", "WINDOW", "QUALIFY", "DESC",
    "ASC", "NULLS", "COLLATE", "WITH", "INTO", "THEN", "ELSE", "END", "WHEN", "OVER", "DIV", "MOD", "FILL", "INTERPOLATE",
}


def _settings_list(tokens: list[Token], i: int) -> tuple[list[tuple[str, str]], int]:
    """``name [= literal] [, ...]`` from ``tokens[i]``: (pairs, index after the list). A name without a value is
    a boolean set to true, as the engine reads it."""
    pairs: list[tuple[str, str]] = []
    while True:
        if i >= len(tokens) or tokens[i].kind not in ("word", "ident"):
            raise Unreadable("a SETTINGS list holds something other than name = value")
        name, j = tokens[i], i + 1
        value = "1"
        if j < len(tokens) and tokens[j].text == "=":
            j += 1
            sign = ""
            if j < len(tokens) and tokens[j].kind == "punct" and tokens[j].text in "+-":
                sign, j = tokens[j].text, j + 1
            if j >= len(tokens) or tokens[j].kind not in ("number", "string", "word") or \
                    (j + 1 < len(tokens) and tokens[j + 1].text in "(.[{"):
                raise Unreadable(f"the value of setting {unquote(name)!r} is not a plain literal")
            value = sign + unquote(tokens[j])
            j += 1
        elif j < len(tokens) and tokens[j].text not in (",", ";", ")") and not tokens[j].kind == "word":
            raise Unreadable(f"setting {unquote(name)!r} is followed by {tokens[j].text!r}")
        pairs.append((unquote(name), value))
        if j < len(tokens) and tokens[j].text == ",":
            i = j + 1
            continue
        return pairs, j


def _starts_list(tokens: list[Token], i: int) -> bool:
    return i < len(tokens) and (tokens[i].kind == "ident" or (tokens[i].kind == "word" and tokens[i].text.upper() not in _AFTER_NAME))


def settings_in(sql: str) -> list[tuple[str, str]]:
    """Every setting the SQL itself changes: its ``SETTINGS`` clauses (anywhere, subqueries included) and
    ``SET`` statements, as (name, value) pairs. Raises :class:`Unreadable` when one is there but its values
    are not plain literals (a function, a map, a query parameter), so a guard can refuse what it cannot check."""
    tokens, _ = scan(sql)
    found: list[tuple[str, str]] = []
    for i, tok in enumerate(tokens):
        after_dot = i > 0 and tokens[i - 1].text == "."
        statement_start = i == 0 or tokens[i - 1].text == ";"
        if (tok.is_word("SETTINGS") and not after_dot and _starts_list(tokens, i + 1)) or (tok.is_word("SET") and statement_start):
            found += _settings_list(tokens, i + 1)[0]
    return found


def statement_keywords(sql: str) -> list[str]:
    """The first word of each statement, upper-cased (``SELECT``, ``CREATE``, ...)."""
    tokens, _ = scan(sql)
    return [t.text.upper() for i, t in enumerate(tokens)
            if t.kind == "word" and (i == 0 or tokens[i - 1].text == ";")]


_NOT_FORMATS = {"ASC", "DESC", "NULLS", "FIRST", "LAST", "COLLATE", "WITH", "FROM", "AS", "AND", "OR", "SETTINGS", "LIMIT",
                "OFFSET", "FILL", "STEP", "INTERPOLATE", "TO"}


def output_format(sql: str) -> str | None:
    """The output format named by the statement's own ``FORMAT`` clause (``... FORMAT JSON [SETTINGS ...]``), or None."""
    tokens, _ = scan(sql)
    while tokens and tokens[-1].text == ";":
        tokens.pop()
    # SETTINGS may follow FORMAT: step back over a trailing settings list.
    for i in range(len(tokens) - 1, 0, -1):
        tok = tokens[i - 1]
        if tok.is_word("FORMAT") and tokens[i].kind in ("word", "ident") and tokens[i].text.upper() not in _NOT_FORMATS:
            rest = tokens[i + 1:]
            if not rest:
                return unquote(tokens[i])
            if rest[0].is_word("SETTINGS"):
                try:
                    pairs, after = _settings_list(tokens, i + 2)
                except Unreadable:
                    return None
                if after == len(tokens):
                    return unquote(tokens[i])
            return None
    return None


__all__ = ["Token", "Unreadable", "scan", "strip_literals", "unquote", "settings_in", "statement_keywords", "output_format"]
