"""Renders a Helm chart template the way Helm's engine (Go text/template with Sprig) does, for the
subset of the language a template uses: trim markers, comments, `$var :=`, `if`/`else`/`end`,
pipelines of `include`, `toYaml`, `fromYaml`, `has`, `hasKey` and `nindent`, and field paths
(`.Values.a.b`, `$var.a`, `(expr).a`). Any other action or function raises, so a template that
needs more fails loudly instead of rendering wrongly. No Helm binary exists on this machine.

Sprig's semantics: `has needle list` (list.go), `hasKey dict key` (dict.go), `nindent n s` is
"\n" + every line of s indented n (strings.go); Helm's `toYaml` drops the trailing newline and
`fromYaml` parses a string (pkg/engine/funcs.go)."""

from __future__ import annotations

import re
import shlex
from typing import Any

import yaml

ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)


def _path(value: Any, fields: str) -> Any:
    for name in filter(None, fields.split(".")):
        value = value.get(name) if isinstance(value, dict) else None
    return value


class _Engine:
    def __init__(self, values: dict, release: dict, includes: dict[str, str]):
        self.root = {"Values": values, "Release": release}
        self.includes, self.vars = includes, {}

    def term(self, word: str) -> Any:
        if word.startswith('"'):
            return word[1:-1]
        if word.isdigit():
            return int(word)
        if word == ".":
            return self.root
        if word.startswith("("):
            inner, _, rest = word[1:].rpartition(")")
            return _path(self.pipeline(inner), rest)
        if word.startswith("$"):
            name, _, rest = word[1:].partition(".")
            return _path(self.vars[name], rest)
        if word.startswith("."):
            return _path(self.root, word)
        raise ValueError(f"unsupported term {word!r}")

    def command(self, words: list[str], piped: Any = None) -> Any:
        fn, args = words[0], [self.term(w) for w in words[1:]]
        if piped is not None:
            args.append(piped)
        if fn == "include":
            return self.includes[args[0]]
        if fn == "toYaml":
            return yaml.safe_dump(args[0], sort_keys=True).rstrip("\n")
        if fn == "fromYaml":
            return yaml.safe_load(args[0]) or {}
        if fn == "has":
            return args[0] in (args[1] or [])
        if fn == "hasKey":
            return args[1] in args[0]
        if fn == "nindent":
            return "\n" + "\n".join(" " * args[0] + line for line in str(args[1]).splitlines())
        if len(words) == 1:
            return self.term(fn)
        raise ValueError(f"unsupported function {fn!r}")

    def pipeline(self, text: str) -> Any:
        value = None
        for i, part in enumerate(text.split("|")):
            words = _words(part)
            value = self.command(words, value if i else None)
        return value


def _words(text: str) -> list[str]:
    """Split on spaces, keeping a parenthesized group and a quoted string whole."""
    out, depth, cur = [], 0, ""
    for ch in text.strip():
        if ch == " " and depth == 0 and cur.count('"') % 2 == 0:
            if cur:
                out.append(cur)
            cur = ""
            continue
        depth += (ch == "(") - (ch == ")")
        cur += ch
    return [*out, cur] if cur else out


def render(template: str, values: dict, release: dict, includes: dict[str, str]) -> str:
    """The template's text for `values`, `.Release` and the named templates `include` returns."""
    engine, out, stack = _Engine(values, release, includes), [], [True]
    pos = 0
    for m in ACTION.finditer(template):
        text = template[pos:m.start()]
        if m.group(1):
            text = text.rstrip()
        if all(stack):
            out.append(text)
        pos = m.end()
        if m.group(3):
            rest = template[pos:]
            pos += len(rest) - len(rest.lstrip())
        action = m.group(2)
        if action.startswith("/*"):
            continue
        if action.startswith("if "):
            stack.append(bool(engine.pipeline(action[3:])) if all(stack) else False)
        elif action == "else":
            stack[-1] = not stack[-1] and all(stack[:-1])
        elif action == "end":
            stack.pop()
        elif all(stack):
            name, sep, expr = action.partition(":=")
            if sep:
                engine.vars[name.strip().lstrip("$")] = engine.pipeline(expr)
            else:
                out.append(str(engine.pipeline(action)))
    out.append(template[pos:])
    return "".join(out)
