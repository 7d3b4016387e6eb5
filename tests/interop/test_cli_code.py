"""`ckpt code` against torch 1.13 (issue 16, point 7).

- A name that is no code file, class or function is an error (exit 2, one line naming it and
  what exists), never the whole module with exit 0.
- `--ranges`: every original line ckpt gives a stored line is one that torch's own graph gives a
  node generated from that line. The module is scripted from a source file written here, so
  each statement sits on a known line, some inside an if/else branch or a loop whose own range
  starts on another line (the record in effect at such a line's start is the enclosing one).
  torch.jit.load reads the same debug_pkl records back into its graphs, printed as
  `# file:line:col` after each node.
"""

import collections
import json
import re
import subprocess
import sys

import pytest

from conftest import one_error_line

SOURCE = '''\
import torch
from typing import List


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.register_buffer("scale", torch.ones(6))

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:
            y = torch.tanh(y) * 2
        else:
            y = torch.sigmoid(
                y) - 1
        acc = torch.zeros(6)
        for i in range(x.size(0)):
            acc = acc + torch.abs(y[i]) * self.scale
        return self.combine(acc,
                            y)

    @torch.jit.export
    def combine(self, a, b):
        c = a + b.mean(0)
        parts: List[torch.Tensor] = [a,
                                     c]
        d = torch.cat(parts,
                      dim=0)
        while bool(d.max() > 10.0):
            d = d / 2
        return torch.relu(d)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = Block()
        self.second = Block()

    def forward(self, x):
        h = self.first(x)
        g = self.second(x)
        return torch.clamp(h + g,
                           min=-3.0,
                           max=3.0)
'''

GRAPH_RANGE = re.compile(r"(\w+::\w+).*# (.+):(\d+):(\d+)$")
RANGED_LINE = re.compile(r"^ *(\d+)  (.*?) *  # (\S+):(\d+)$")
PLAIN_LINE = re.compile(r"^ *(\d+)  ?(.*)$")


# Scripting in this process would compile torch.nn classes into the session's global
# compilation unit and make the qualified names other tests expect mangled
# (test_torchscript.py): the module is scripted, saved, loaded and its graphs printed by a
# child process.
CHILD = """
import collections, importlib.util, json, re, sys
import torch
src, out = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("ckpt_code_net", src)
mod = importlib.util.module_from_spec(spec)
sys.modules["ckpt_code_net"] = mod
spec.loader.exec_module(mod)
torch.jit.save(torch.jit.script(mod.Net()), out)
m = torch.jit.load(out)
graphs = []
for _, sub in m.named_modules():
    for name in sub._c._method_names():
        graphs.append(str(getattr(sub, name).graph))
print(json.dumps(graphs))
"""


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("code")
    src = tmp / "ckpt_code_net.py"
    src.write_text(SOURCE)
    path = tmp / "net.pt"
    r = subprocess.run([sys.executable, "-c", CHILD, str(src), str(path)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return path, str(src), json.loads(r.stdout)


def _graph_ranges(graphs):
    """{(file, line): {node kinds}} over every method graph of every module, as torch.jit.load
    reads them back from the archive's debug_pkl."""
    out = collections.defaultdict(set)
    for graph in graphs:
        for line in graph.splitlines():
            g = GRAPH_RANGE.search(line)
            if g:
                out[(g.group(2), int(g.group(3)))].add(g.group(1))
    return out


def _ranged_lines(ckpt, path):
    """[(stored text, (file, line) or None)] of every stored line, all code files."""
    out = []
    for line in ckpt.ok("code", "--ranges", path).stdout.splitlines():
        if line.startswith("# code/"):
            continue
        r = RANGED_LINE.match(line)
        if r:
            out.append((r.group(2).strip(), (r.group(3), int(r.group(4)))))
        else:
            p = PLAIN_LINE.match(line)
            assert p, f"unexpected --ranges line: {line!r}"
            out.append((p.group(2).strip(), None))
    return out


def _expression(text):
    """The stored statement's expression: after `return ` or an assignment's targets."""
    if text.startswith("return "):
        return text[len("return "):]
    m = re.match(r"^[\w.]+(?:\s*,\s*[\w.]+)*\s*(?::\s*[^=]+)?=(?!=)\s*(.*)$", text)
    return m.group(1) if m else text


def _node_kinds(expr):
    """The graph node kinds a stored expression starts with (None: no rule for it)."""
    if expr.startswith("for ") or expr.startswith("while "):
        return {"prim::Loop"}
    if expr.startswith("if "):
        return {"prim::If"}
    call = re.match(r"^torch\.(\w+)\(", expr)
    if call:
        return {f"aten::{call.group(1)}"}
    if re.match(r"^\(\w+\)\.\w+\(", expr):  # (self.first).forward(...), (self).combine(...)
        return {"prim::CallMethod"}
    if expr.startswith("bool("):
        return {"aten::Bool"}
    return None


def test_every_range_is_one_torch_gives(ckpt, scripted):
    path, src, graphs = scripted
    graph = _graph_ranges(graphs)
    assert graph, "torch's graphs carry no source ranges"
    lines = _ranged_lines(ckpt, path)
    tagged = [(t, o) for t, o in lines if o]
    assert len(tagged) >= 20, lines
    lines_of = collections.defaultdict(set)  # node kind -> {(file, line)}
    for where, kinds in graph.items():
        for k in kinds:
            lines_of[k].add(where)
    checked = 0
    for text, where in tagged:
        assert where in graph, (f"stored line {text!r} is tagged {where[0]}:{where[1]}, a line "
                                f"no node of torch's graphs comes from")
        kinds = _node_kinds(_expression(text))
        if kinds and any(lines_of[k] for k in kinds):
            want = set().union(*(lines_of[k] for k in kinds))
            assert where in want, (f"stored line {text!r} is tagged {where[0]}:{where[1]}; torch "
                                   f"puts its {'/'.join(sorted(kinds))} at "
                                   f"{sorted(l for f, l in want if f == where[0])}")
            checked += 1
    assert checked >= 15, tagged
    # Every stored call of an operator that torch's graph places in this file is tagged.
    for text, where in lines:
        kinds = _node_kinds(_expression(text))
        if kinds and any(f == src for k in kinds for f, _ in lines_of[k]):
            assert where is not None, f"stored line {text!r} has no range"


def test_branch_statements_get_their_own_line(ckpt, scripted):
    """The statements inside if/else branches and loops: their own line, not the line of the
    `if`, `for` or `while` (whose record is in effect where the stored line starts)."""
    path, src, _ = scripted
    # the call a stored statement starts with -> (its line in SOURCE, text on that line)
    want = {"torch.mul": (14, "torch.tanh(y) * 2"), "torch.sub": (16, "torch.sigmoid("),
            "torch.abs": (20, "torch.abs(y[i])"), "torch.div": (32, "d / 2"),
            "torch.relu": (33, "torch.relu(d)"), "torch.clamp": (45, "torch.clamp(h + g")}
    found = collections.defaultdict(set)
    for text, where in _ranged_lines(ckpt, path):
        call = re.match(r"^(torch\.\w+)\(", _expression(text))
        if call and call.group(1) in want:
            found[call.group(1)].add(where)
    for call, (line, marker) in want.items():
        assert marker in SOURCE.splitlines()[line - 1], (call, line)
        assert found[call] == {(src, line)}, f"{call}: tagged {found[call]}, want {src}:{line}"


def test_missing_name_is_an_error(ckpt, scripted):
    path, _, _ = scripted
    qual = "__torch__.ckpt_code_net"
    one = ckpt.ok("code", path, f"{qual}.Block").stdout
    assert one.startswith("class Block(Module):") and "class Net" not in one
    for name, must in ((f"{qual}.Nope", ["'Nope'", "Block", "Net"]),
                       ("__torch__.Nope", ["'__torch__.Nope'", qual]),
                       (f"{qual}.Block.forward.x", ["'Block.forward.x'"]),
                       ("__torch__.torch.nn.modules.linear.Nope", ["'Nope'", "Linear"])):
        for extra in ([], ["--ranges"]):
            r = ckpt.run("code", path, name, *extra)
            line = one_error_line(r)
            assert r.returncode == 2 and "[not_found]" in line, f"{name}: exit {r.returncode}: {line}"
            for m in must:
                assert m in line, f"{name}: {m} not in {line}"
            assert r.stdout == "", f"{name}: printed code: {r.stdout[:200]}"
