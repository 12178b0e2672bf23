"""A launch command line, or the shell script around it, read without running anything.

Published launch scripts (Megatron-LM's ``examples/``, slime's ``scripts/``) build the command
from variables and bash arrays: ``MODEL_ARGS=(--num-layers 32 ...)`` then ``torchrun
${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${MODEL_ARGS[@]}``. This module evaluates that much of
bash as data: assignments (``NAME=value``, ``${NAME:-default}``, ``$((a * b))`` on integers),
arrays and their appends, ``if``/``elif``/``else`` on string and integer tests of those variables,
quoting and word splitting. It never runs a command: a command substitution (``$(...)`` or
backquotes) stays an opaque value, and the command line that launches the job may not contain
one. Loops, functions and ``case`` are skipped (the launch may not be inside them); a condition it
cannot decide (a file test, a variable of the caller's environment) counts as false and is
reported. Every other command (``mkdir``, ``export`` without a value, ``echo``) is skipped.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field
from typing import Callable

from ..spec.errors import ConfigError

FIELD = "command line"
OPAQUE = "\x00"  # marks a value that came from a command substitution (never run)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?=)(.*)", re.S)
_OPERATORS = ("&&", "||", "|", "&", ";")
_REDIRECT = re.compile(r"\d*(>>|>|<|&>)(&\d+|-)?")
_UNSET = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*|\d)\}?")  # a variable left as written: not set
_BLOCKS = {"for": "done", "while": "done", "until": "done", "select": "done", "case": "esac"}
MAX_WORDS = 20_000  # words of one expanded command (a published launch has a few hundred)


@dataclass(frozen=True)
class Launch:
    """The launching command: the launcher's words (``torchrun --nproc_per_node 8``), the entry
    point it runs (``pretrain_gpt.py``; empty when the text is bare arguments) and its arguments."""

    launcher: tuple[str, ...]
    entry: str
    args: tuple[str, ...]
    notes: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # variables set in the file or before the command (NAME=value cmd)


@dataclass
class _State:
    scalars: dict[str, str] = field(default_factory=dict)
    arrays: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    flag_sources: list = field(default_factory=list)  # names of variables holding flags, or flag lines


# --- splitting the text into statements and raw words ---------------------------------------------

def statements(text: str) -> list[list[str]]:
    """The script's simple statements, each a list of raw words (quotes kept): split at newlines and
    ``;`` outside quotes and parentheses, comments dropped, line continuations joined."""
    out: list[list[str]] = []
    words: list[str] = []
    cur: list[str] = []
    quote, depth, i, n = None, 0, 0, len(text)

    def end_word():
        if cur:
            words.append("".join(cur))
            cur.clear()

    def end_statement():
        end_word()
        if words:
            out.append(words.copy())
            words.clear()

    while i < n:
        c = text[i]
        if quote:
            cur.append(c)
            if c == "\\" and quote == '"' and i + 1 < n:
                cur.append(text[i + 1])
                i += 1
            elif c == quote:
                quote = None
        elif c == "\\" and i + 1 < n:
            if text[i + 1] == "\n":  # a line continuation
                i += 2
                continue
            cur.append(text[i:i + 2])
            i += 1
        elif c in "'\"`":
            quote = c
            cur.append(c)
        elif c == "#" and (not cur or (depth > 0 and cur[-1] in " \t\n(")):  # a comment: to the line's end
            while i < n and text[i] != "\n":
                i += 1
            continue
        elif c in "({" and (cur or c == "("):
            depth += 1
            cur.append(c)
        elif c in ")}" and depth > 0:
            depth -= 1
            cur.append(c)
        elif depth > 0 and c in " \t\n\r":
            cur.append(c)
        elif c in " \t\r":
            end_word()
        elif c in "\n;":
            end_statement()
        else:
            cur.append(c)
        i += 1
    end_statement()
    return out


def _raw_split(text: str) -> list[str]:
    """Raw words of an array's body (the same rules, one statement)."""
    return [w for part in statements(text) for w in part]


# --- expanding one raw word ---------------------------------------------------------------------

class _Words:
    """The words one raw word expands to, built a character or an expansion at a time."""

    def __init__(self) -> None:
        self.words: list[str] = []
        self.cur: list[str] = []
        self.started = False  # a word has begun, even if empty so far ("")

    def add(self, text: str) -> None:
        self.cur.append(text)
        self.started = True

    def cut(self) -> None:
        """End the current word and begin the next."""
        self.words.append("".join(self.cur))
        self.cur = []

    def done(self) -> list[str]:
        if self.cur or self.started:
            self.words.append("".join(self.cur))
        return self.words

    def quoted_values(self, values: list[str], is_array: bool) -> None:
        """An expansion inside double quotes: one word, or one per element for "${A[@]}"."""
        if is_array and len(values) != 1:
            if values:
                self.cur.append(values[0])
                for v in values[1:]:
                    self.cut()
                    self.cur = [v]
            self.started = True
        else:
            self.add(" ".join(values))

    def unquoted_values(self, values: list[str]) -> None:
        """An unquoted expansion: split at whitespace, joined to the word it touches on either side."""
        pieces = [p for v in values for p in v.split()] if values else []
        if not pieces:
            return
        text = " ".join(values)
        if text[:1].isspace() and (self.cur or self.started):
            self.cut()
            self.started = False
        self.cur.append(pieces[0])
        for p in pieces[1:]:
            self.cut()
            self.cur = [p]
        self.started = True
        if text[-1:].isspace():
            self.cut()
            self.started = False


def expand(raw: str, state: _State) -> list[str]:
    """The words `raw` becomes: quotes removed, variables expanded, unquoted expansions split at
    whitespace. An unset variable stays as written (``$NAME``) so that argument positions hold."""
    out = _Words()
    quote, i, n = None, 0, len(raw)
    while i < n:
        c = raw[i]
        if quote == "'":
            if c == "'":
                quote = None
            else:
                out.cur.append(c)
            i += 1
        elif c == "\\" and i + 1 < n:
            nxt = raw[i + 1]
            if nxt != "\n":  # a backslash-newline is a line continuation, inside double quotes too
                out.add(nxt if (quote is None or nxt in '$`"\\') else c + nxt)
            i += 2
        elif c == "'" and quote is None:
            quote, out.started = "'", True
            i += 1
        elif c == '"':
            quote, out.started = (None if quote == '"' else '"'), True
            i += 1
        elif c == "`":
            end = raw.find("`", i + 1)
            end = n - 1 if end < 0 else end
            out.add(OPAQUE + raw[i:end + 1])
            i = end + 1
        elif c == "$" and i + 1 < n:
            values, i, is_array = _dollar(raw, i, state)
            if quote == '"':
                out.quoted_values(values, is_array)
            else:
                out.unquoted_values(values)
        else:
            out.add(c)
            i += 1
    return out.done()


def _dollar(raw: str, i: int, state: _State) -> tuple[list[str], int, bool]:
    """The expansion at raw[i] == "$": (values, index after it, whether it is an array's elements)."""
    nxt = raw[i + 1]
    if raw.startswith("$((", i):
        end = _matching(raw, i + 1, "(", ")")
        expr = raw[i + 3:end - 1]
        return [_arithmetic(expr, state, raw[i:end + 1])], end + 1, False
    if nxt == "(":
        end = _matching(raw, i + 1, "(", ")")
        return [OPAQUE + raw[i:end + 1]], end + 1, False
    if nxt == "{":
        end = _matching(raw, i + 1, "{", "}")
        values, is_array = _braced(raw[i + 2:end], raw[i:end + 1], state)
        return values, end + 1, is_array
    m = _NAME.match(raw, i + 1)
    if m:
        name = m.group(0)
        value = state.scalars.get(name)
        if value is None and name in state.arrays:
            value = (state.arrays[name] or [""])[0]
        return [raw[i:m.end()] if value is None else value], m.end(), False
    if nxt.isdigit() or nxt in "@*#?$!-":  # positional and special parameters: the caller's, unknown
        return [raw[i:i + 2]], i + 2, False
    return ["$"], i + 1, False


def _braced(body: str, written: str, state: _State) -> tuple[list[str], bool]:
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*|\d+)(\[(@|\*|\d+)\])?(?:(:?[-=+?])(.*))?", body, re.S)
    if not m:
        if body.startswith("#") and body[1:] in state.arrays:  # ${#A[@]} style lengths are rare: as written
            return [written], False
        return [written], False
    name, index, op, rest = m.group(1), m.group(3), m.group(4), m.group(5)
    if index in ("@", "*"):
        if name in state.arrays:
            return list(state.arrays[name]), True
        value = state.scalars.get(name)
        return ([value] if value is not None else [written]), True
    if index is not None and name in state.arrays:
        items = state.arrays[name]
        k = int(index)
        value = items[k] if k < len(items) else None
    elif name in state.arrays:
        value = (state.arrays[name] or [""])[0]
    else:
        value = state.scalars.get(name)
    if op is None:
        return [written if value is None else value], False
    default = " ".join(expand(rest, state)) if rest else ""
    empty = value is None or (op.startswith(":") and value == "")
    if op in (":-", "-", ":=", "="):
        if empty:
            if "=" in op and _NAME.fullmatch(name):
                state.scalars[name] = default
            return [default], False
        return [value], False
    if op in (":+", "+"):
        return (["" if empty else default]), False
    return [written if value is None else value], False  # ${x:?message}


def _matching(text: str, start: int, open_: str, close: str) -> int:
    """Index of the bracket closing the one at `start` (or the text's last index)."""
    depth, quote = 0, None
    for j in range(start, len(text)):
        c = text[j]
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
          ast.Div: operator.floordiv, ast.Mod: operator.mod}


def _arithmetic(expr: str, state: _State, written: str) -> str:
    """Bash integer arithmetic on numbers and variables: + - * / % and parentheses only."""
    text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", r"\1", expr)
    if len(text) > 200:
        return written

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name):
            raw = state.scalars.get(node.id, "")
            if re.fullmatch(r"\s*-?\d{1,18}\s*", raw):
                return int(raw)
            raise ValueError(node.id)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise ValueError("division by zero")
            result = _ARITH[type(node.op)](left, right)
            if abs(result) > 2**62:
                raise ValueError("too large")
            return result
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        raise ValueError(type(node).__name__)

    try:
        return str(value(ast.parse(text.strip(), mode="eval").body))
    except (ValueError, SyntaxError, RecursionError, MemoryError):
        return written


# --- running the statements as data -------------------------------------------------------------

def read_launch(text: str, is_entry: Callable[[str], bool]) -> Launch:
    """The launching command of a command line or a script; `is_entry` tells the entry point's word
    (``pretrain_gpt.py``). Text without such a word is read as bare arguments (an arguments file)."""
    state = _State()
    stack: list[list[bool]] = []  # per open `if`: [parent active, a branch was taken, this branch active]
    found: Launch | None = None
    items = statements(text)
    k = 0
    while k < len(items):
        words = items[k]
        k += 1
        head = words[0]
        active = all(frame[2] for frame in stack)
        if head in ("then", "do", "else", "fi", "elif", "if") or head in _BLOCKS or _is_function(words):
            k = _control(words, items, k, state, stack, is_entry)
            continue
        if not active:
            continue
        if head in ("export", "declare", "local", "readonly", "typeset"):
            words = [w for w in words[1:] if not w.startswith("-")] or ["export"]
        if all(_ASSIGN.fullmatch(w) for w in words):
            for w in words:
                name = _assign(w, state)
                value = state.arrays.get(name) or state.scalars.get(name, "").split()
                if value and value[0].startswith("--") and name not in state.flag_sources:
                    state.flag_sources.append(name)
            continue
        if head.startswith("--"):
            state.flag_sources.append([v for w in words for v in expand(w, state)])
            continue
        launch = _launch_in(words, state, is_entry)
        if launch is not None:
            if found is not None:
                raise ConfigError(FIELD, launch.entry, "one launch command", "the file launches twice")
            found = launch
    if found is None:  # an arguments file: its flag lines and the variables that hold flags, in order
        args: list[str] = []
        for source in state.flag_sources:
            if isinstance(source, str):
                source = state.arrays.get(source) or state.scalars.get(source, "").split()
            args += source
        _check_words(args)
        found = Launch((), "", tuple(args))
    env = tuple((k, v) for k, v in state.scalars.items() if OPAQUE not in v) + found.env
    return Launch(found.launcher, found.entry, found.args, tuple(state.notes), env)


def _is_function(words: list[str]) -> bool:
    return words[0] == "function" or (len(words) >= 1 and re.fullmatch(r"[A-Za-z_][\w-]*\(\)\{?", words[0]) is not None)


def _control(words, items, k, state, stack, is_entry) -> int:
    """An `if` branch keyword, or a loop/function/case block skipped whole; returns the next index."""
    head = words[0]
    if head in _BLOCKS or _is_function(words):
        return _skip_block(words, items, k, is_entry)
    if head in ("if", "elif"):
        cond = words[1:]
        if head == "if":
            parent = all(frame[2] for frame in stack)
            stack.append([parent, False, False])
        if not stack:
            raise ConfigError(FIELD, head, "balanced if ... fi", "an elif without its if")
        frame = stack[-1]
        value = _condition(cond, state) if frame[0] and not frame[1] else False
        if value is None:  # neither this branch nor a later one runs
            state.notes.append(f"not applied: the lines under a condition this reader cannot decide "
                               f"({' '.join(cond)[:120]})")
            frame[1], frame[2] = True, False
            return k
        frame[2] = bool(value) and frame[0] and not frame[1]
        frame[1] = frame[1] or frame[2]
        return k
    if head == "else":
        if not stack:
            raise ConfigError(FIELD, head, "balanced if ... fi", "an else without its if")
        frame = stack[-1]
        frame[2] = frame[0] and not frame[1]
        frame[1] = True
    elif head == "fi":
        if not stack:
            raise ConfigError(FIELD, head, "balanced if ... fi", "a fi without its if")
        stack.pop()
    rest = words[1:]  # `then cmd`, `else cmd`, `do cmd`: the command after the keyword
    if rest:
        items.insert(k, rest)
    return k


def _skip_block(words, items, k, is_entry) -> int:
    head = "function" if _is_function(words) else words[0]
    closing = _BLOCKS.get(head, "}")
    opening = [h for h, c in _BLOCKS.items() if c == closing] or [head]
    depth, j = 1, k
    body = [words]
    while j < len(items) and depth:
        first = items[j][0]
        if first in opening or (head == "function" and _is_function(items[j])):
            depth += 1
        elif first == closing or (closing == "}" and first.startswith("}")):
            depth -= 1
        body.append(items[j])
        j += 1
    if any(is_entry(w.strip("'\"")) for part in body for w in part):
        raise ConfigError(FIELD, head, "a launch command outside loops, functions and case blocks",
                          "the launch is inside a block this reader does not run")
    return j


def _condition(words: list[str], state: _State) -> bool | None:
    """`[[ ... ]]`, `[ ... ]` or `test ...` joined by && and ||; None when undecidable."""
    result: bool | None = None
    joiner = None
    group: list[str] = []
    for w in words + ["&&"]:
        if w in ("&&", "||"):
            value = _test(group, state)
            if joiner is None:
                result = value
            elif joiner == "&&":
                result = None if (result is None or value is None) and result is not False and value is not False \
                    else bool(result and value)
            else:
                result = None if (result is None or value is None) and result is not True and value is not True \
                    else bool(result or value)
            joiner, group = w, []
        else:
            group.append(w)
    return result


def _test(raw: list[str], state: _State) -> bool | None:
    if raw and raw[0] in ("[[", "[", "test"):
        raw = raw[1:]
        if raw and raw[-1] in ("]]", "]"):
            raw = raw[:-1]
    negate = False
    if raw and raw[0] == "!":
        negate, raw = True, raw[1:]
    args = []
    for w in raw:
        values = expand(w, state)
        if any(OPAQUE in v for v in values):
            return None  # a command's output
        unset = [v for v in values if _UNSET.fullmatch(v)]
        for v in unset:  # bash reads an unset variable as empty; the caller's environment is not known here
            state.notes.append(f"{v} is not set in the file: read as empty in the condition {' '.join(raw)[:80]}")
        args.append(" ".join(v for v in values if v not in unset))
    value: bool | None = None
    if len(args) == 2 and args[0] in ("-z", "-n"):
        value = (args[1] == "") == (args[0] == "-z")
    elif len(args) == 3 and args[1] in ("==", "=", "!="):
        value = (args[0] == args[2]) == (args[1] != "!=")
    elif len(args) == 3 and args[1] in ("-eq", "-ne", "-lt", "-le", "-gt", "-ge"):
        try:
            a, b = int(args[0]), int(args[2])
        except ValueError:
            return None
        value = {"-eq": a == b, "-ne": a != b, "-lt": a < b, "-le": a <= b, "-gt": a > b, "-ge": a >= b}[args[1]]
    if value is None:
        return None
    return not value if negate else value


def _assign(word: str, state: _State) -> str:
    m = _ASSIGN.fullmatch(word)
    name, op, raw = m.group(1), m.group(2), m.group(3)
    if raw.startswith("(") and raw.endswith(")"):
        items = [v for w in _raw_split(raw[1:-1]) for v in expand(w, state)]
        if op == "+=":
            state.arrays.setdefault(name, []).extend(items)
        else:
            state.arrays[name] = items
        state.scalars.pop(name, None)
        return name
    value = " ".join(expand(raw, state)) if raw else ""
    if op == "+=":
        value = state.scalars.get(name, "") + value
    state.scalars[name] = value
    state.arrays.pop(name, None)
    return name


def _launch_in(raw_words: list[str], state: _State, is_entry) -> Launch | None:
    words: list[str] = []
    for raw in raw_words:
        words += expand(raw, state) if raw not in _OPERATORS else [raw]
        if len(words) > MAX_WORDS:
            raise ConfigError(FIELD, f"{len(words)} words", f"a command of at most {MAX_WORDS} words", "too long")
    segments: list[list[str]] = [[]]
    for w in words:
        if w in _OPERATORS:
            segments.append([])
        else:
            segments[-1].append(w)
    for seg in segments:
        for j, w in enumerate(seg):
            if is_entry(w):
                launcher = [x for x in seg[:j] if not _ASSIGN.fullmatch(x)]  # VAR=1 torchrun ...
                prefix = tuple(tuple(x.split("=", 1)) for x in seg[:j] if _ASSIGN.fullmatch(x))
                args = _without_redirections(seg[j + 1:])
                _check_words(launcher + [w] + args)
                return Launch(tuple(launcher), w, tuple(args), env=prefix)
    return None


def _without_redirections(words: list[str]) -> list[str]:
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        m = _REDIRECT.match(w)
        if m and m.end() > 0:
            skip = m.end() == len(w) and not m.group(2)  # `> file`: the next word is the target
            continue
        out.append(w)
    return out


def _check_words(words: list[str]) -> None:
    for w in words:
        if OPAQUE in w:
            shown = w.replace(OPAQUE, "")
            raise ConfigError(FIELD, shown, "literal values and variables set in the file",
                              "a command substitution would have to run a command; nothing is run")
