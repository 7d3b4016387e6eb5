#!/usr/bin/env python3
"""Checks the documentation's cross-references (run by `make doc-links`, part of `make test`).

    scripts/check_doc_links.py [--root DIR]

Three checks, over the files git tracks (every file under ROOT when it is not a git checkout):

  - every relative markdown link [text](path#anchor) in a .md file names an existing file and,
    when it has an anchor, a heading of that file (anchors as GitHub makes them);
  - every textual reference `docs/X.md, "Heading"` (in .md, C++, Python, shell, CMake, Makefile
    and TOML files; a comment's continuation lines are joined first) names an existing file and
    the start of one of its headings; bold paragraph names that follow it (`"Heading",
    **Name**`) must appear in that file as `**Name`;
  - no .md file under docs/ is over 800 lines.

One line per problem (file:line: what), exit status 1 if there is one, 0 otherwise. Stdlib only,
no network.
"""

import argparse
import bisect
import os
import re
import subprocess
import sys

MAX_DOC_LINES = 800
SCANNED_SUFFIXES = (".md", ".h", ".cc", ".c", ".py", ".sh", ".txt", ".toml", ".in", ".cmake")
SCANNED_NAMES = ("Makefile",)
SKIPPED_DIRS = (".git",)

LINK = re.compile(r"(?<!\!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A path in backquotes is another project's (tensorizer's `docs/encryption.md`): not checked.
REF = re.compile(r"(?<![\w/.`-])(docs/[\w./-]+?\.md)((?:[\s,(])+\"([^\"]+)\")?")
BOLD_AFTER = re.compile(r"\s*(?:,|:|and|→)?\s*\*\*([^*]+?)\*\*")
FENCE = re.compile(r"^\s*(```|~~~)")


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                             capture_output=True).stdout.decode()
        files = [f for f in out.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for base, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("build")]
            files += [os.path.relpath(os.path.join(base, n), root) for n in names]
    return [f for f in files if os.path.isfile(os.path.join(root, f))]


def scanned(path):
    name = os.path.basename(path)
    return name in SCANNED_NAMES or name.endswith(SCANNED_SUFFIXES)


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def outside_fences(text):
    """The lines of a markdown text with fenced code blocks blanked (line numbers kept)."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return lines


def plain_heading(title):
    return re.sub(r"\s+", " ", title.replace("`", "").replace("*", "")).strip()


def slug(title):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = plain_heading(title).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


class Doc:
    """The headings of one markdown file, and its text for the bold-name check."""

    def __init__(self, path):
        text = read(path)
        self.text = re.sub(r"\s+", " ", text)
        self.headings, self.anchors = [], set()
        seen = {}
        for line in outside_fences(text):
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            self.headings.append(plain_heading(m.group(1)).lower())
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            self.anchors.add(base if n == 0 else f"{base}-{n}")

    def has_heading(self, quoted):
        q = plain_heading(quoted).lower().rstrip(".")
        for h in self.headings:
            if h == q or (h.startswith(q) and not h[len(q)].isalnum()):
                return True
        return False

    def has_bold(self, name):
        return "**" + re.sub(r"\s+", " ", name).strip() in self.text


class Checker:
    def __init__(self, root):
        self.root = root
        self.docs = {}
        self.problems = []

    def doc(self, rel):
        if rel not in self.docs:
            path = os.path.join(self.root, rel)
            self.docs[rel] = Doc(path) if os.path.isfile(path) else None
        return self.docs[rel]

    def problem(self, rel, line, what):
        self.problems.append(f"{rel}:{line}: {what}")

    def check_links(self, rel, text):
        for number, line in enumerate(outside_fences(text), 1):
            line = re.sub(r"`[^`]*`", "", line)
            for m in LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
                    continue
                path, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(rel), path)) if path else rel
                if not os.path.exists(os.path.join(self.root, dest)):
                    self.problem(rel, number, f"link to a missing file: {target}")
                elif anchor and dest.endswith(".md"):
                    doc = self.doc(dest)
                    if doc is not None and anchor.lower() not in doc.anchors:
                        self.problem(rel, number, f"link to a missing heading: {target}")

    def check_refs(self, rel, text):
        # A comment's continuation lines are joined, so that a reference may wrap.
        pieces, line_starts, offset = [], [], 0
        for number, line in enumerate(text.split("\n")):
            if number:
                line = re.sub(r"^[ \t]*(?://+|#+|\*(?!\*))?[ \t]*", "", line)
                pieces.append(" ")
                offset += 1
            line_starts.append(offset)
            pieces.append(line)
            offset += len(line)
        joined = "".join(pieces)
        for m in REF.finditer(joined):
            line = bisect.bisect_right(line_starts, m.start())
            target, quoted = m.group(1), m.group(3)
            doc = self.doc(target)
            if doc is None:
                if not os.path.exists(os.path.join(self.root, target)):
                    self.problem(rel, line, f"reference to a missing file: {target}")
                continue
            if quoted is None:
                continue
            if not doc.has_heading(quoted):
                self.problem(rel, line, f'{target} has no heading "{quoted}"')
                continue
            pos = m.end()
            while True:
                b = BOLD_AFTER.match(joined, pos)
                if not b:
                    break
                if not doc.has_bold(b.group(1)):
                    self.problem(rel, line, f"{target} has no paragraph **{b.group(1)}**")
                pos = b.end()

    def check_length(self, rel, text):
        if rel.startswith("docs/") and rel.endswith(".md"):
            n = text.count("\n") + (0 if text.endswith("\n") else 1)
            if n > MAX_DOC_LINES:
                self.problem(rel, n, f"{n} lines, over the limit of {MAX_DOC_LINES}")

    def run(self):
        for rel in sorted(tracked_files(self.root)):
            if not scanned(rel):
                continue
            text = read(os.path.join(self.root, rel))
            if rel.endswith(".md"):
                self.check_links(rel, text)
                self.check_length(rel, text)
            self.check_refs(rel, text)
        return self.problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--root", default=os.path.dirname(here))
    args = parser.parse_args()
    problems = Checker(args.root).run()
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} broken documentation reference(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
