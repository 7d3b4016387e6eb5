"""scripts/check_doc_links.py (make doc-links): each kind of broken reference is found, with its
file and line, and the repository's own documentation passes."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "check_doc_links.py")
# The fixtures' folder through a variable, so that the check does not read them as references.
D = "docs"


def run(root):
    r = subprocess.run([sys.executable, SCRIPT, "--root", str(root)], capture_output=True,
                       text=True)
    return r.returncode, r.stdout.splitlines()


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_repository_passes():
    code, out = run(REPO)
    assert code == 0, out


def test_good_references_pass(tmp_path):
    write(tmp_path, f"{D}/a.md", "# A\n\n## Zip layout (`.pt`)\n\n**Records.** text\n"
                                 "```\n# not a heading\n```\n")
    write(tmp_path, f"{D}/b.md", "# B\n\n[a](a.md) [zip](a.md#zip-layout-pt) [self](#b)\n"
                                 f"`[code](missing.md)` and tensorizer's `{D}/encryption.md`\n")
    write(tmp_path, "src/x.h", f'// see {D}/a.md, "Zip layout", **Records** and {D}/a.md\n'
                               '// "Zip\n// layout" (wrapped)\n')
    code, out = run(tmp_path)
    assert (code, out) == (0, [])


def test_each_broken_reference_is_named(tmp_path):
    write(tmp_path, f"{D}/a.md", "# A\n\n## Zip layout\n\n**Records.** text\n")
    write(tmp_path, f"{D}/b.md", "# B\n\n[gone](gone.md)\n[anchor](a.md#records)\n"
                                 "[code block](a.md#not-a-heading)\n")
    write(tmp_path, f"{D}/long.md", "x\n" * 801)
    write(tmp_path, "src/x.h", f'// {D}/a.md, "Records"\n// {D}/a.md, "Zip layout", **CRC32**\n'
                               f'// {D}/gone.md\n')
    write(tmp_path, "Makefile", f'# {D}/a.md\n# "Zip layouts"\n')
    code, out = run(tmp_path)
    assert code == 1
    assert out == [
        f'Makefile:1: {D}/a.md has no heading "Zip layouts"',
        f"{D}/b.md:3: link to a missing file: gone.md",
        f"{D}/b.md:4: link to a missing heading: a.md#records",
        f"{D}/b.md:5: link to a missing heading: a.md#not-a-heading",
        f"{D}/long.md:801: 801 lines, over the limit of 800",
        f'src/x.h:1: {D}/a.md has no heading "Records"',
        f"src/x.h:2: {D}/a.md has no paragraph **CRC32**",
        f"src/x.h:3: reference to a missing file: {D}/gone.md",
    ]
