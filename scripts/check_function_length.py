#!/usr/bin/env python3
"""Lists C++ function bodies longer than a limit (default 80 lines).

    scripts/check_function_length.py [--max N] [PATH ...]     (default PATH: tools/ckpt)

A body is a brace block that opens at the end of a line whose text looks like a function head or
a lambda (a closing parenthesis, optionally followed by const/noexcept/override/-> type/mutable,
before the brace) and is not a control statement (if/for/while/switch/catch/else/do). Nested
lambdas count on their own and towards the function around them. Strings, characters and
comments are skipped. One line per long body: file:line: N lines: head. Exit status 1 if any,
0 otherwise. Stdlib only.
"""

import argparse
import os
import re
import sys

CONTROL = re.compile(r"^\s*(\}\s*)?(if|for|while|switch|catch|else|do|namespace|struct|class|enum|union)\b")
HEAD = re.compile(r"\)\s*(const|noexcept|override|final|mutable|->\s*[\w:<>,\s\*&]+)*\s*$")


def strip(text):
    """Blanks out comments, strings and character literals, keeping newlines."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def long_bodies(path, limit):
    with open(path, encoding="utf-8") as f:
        text = strip(f.read())
    lines = text.split("\n")
    stack = []  # (line index, is_function, head)
    found = []
    for ln, line in enumerate(lines):
        for col, c in enumerate(line):
            if c == "{":
                before = line[:col].rstrip()
                k = ln
                while not before and k > 0:  # brace on its own line
                    k -= 1
                    before = lines[k].rstrip()
                is_fn = bool(HEAD.search(before)) and not CONTROL.match(before)
                stack.append((ln, is_fn, before.strip()))
            elif c == "}" and stack:
                start, is_fn, head = stack.pop()
                size = ln - start - 1
                if is_fn and size > limit:
                    found.append((start + 1, size, head))
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max", type=int, default=80)
    ap.add_argument("paths", nargs="*", default=["tools/ckpt"])
    args = ap.parse_args()
    files = []
    for p in args.paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                files += [os.path.join(root, x) for x in names if x.endswith((".cc", ".h"))]
        else:
            files.append(p)
    bad = 0
    for path in sorted(files):
        for line, size, head in long_bodies(path, args.max):
            print(f"{path}:{line}: {size} lines: {head[-70:]}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
