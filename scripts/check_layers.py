#!/usr/bin/env python3
"""Checks that #include "..." only runs down the layers (docs/design.md, "Layers").

    scripts/check_layers.py [--root DIR] [-v]

Walks src/, tools/, include/ckpt/ and python/ (if present). Every quoted include (and every
<ckpt/...> include) is resolved the way the build resolves it: next to the including file,
then under src/, then under include/. An edge is a back edge when:

  - it runs from a lower layer to a higher one (rank of the included file > rank of the file);
  - it joins two sibling folders of the same rank (zip <-> pickle; formats/torch <->
    formats/safetensors <-> formats/tensorizer). Files directly in src/formats/ are shared by
    all formats: the format folders may include them, not the other way round;
  - a file in tools/ or python/ includes anything but a public header "ckpt/..." or a file of
    its own folder;
  - a public header (include/ckpt/) includes a private header, or a public header of a higher
    rank (installed headers must stand alone).

A source file of rank r may include a public header of rank <= r. Exit status 1 (with one line
per back edge: file:line -> included) on any back edge, 0 otherwise. Stdlib only.
"""

import argparse
import os
import re
import sys

# ---------------------------------------------------------------------------------------------
# The layers: folder (relative to the repository root) -> rank. Lower ranks may not include
# higher ones; two different folders of the same rank may not include each other, except that a
# folder may include its parent folder of the same rank (src/formats/torch -> src/formats).
LAYERS = {
    "src/util": 0,
    "src/io": 1,
    "src/device": 1,               # copy engines: CUDA by dlopen, a host engine for tests
    "src/zip": 2,
    "src/pickle": 2,
    "src/model": 3,
    "src/formats": 4,              # code shared by the formats (files directly in src/formats/)
    "src/formats/torch": 4,
    "src/formats/safetensors": 4,
    "src/formats/tensorizer": 4,
    "src/formats/onnx": 4,
    "src/formats/dcp": 4,          # torch.distributed.checkpoint .metadata
    "src/load": 5,
    "src/api": 6,
    "src/ranks": 7,                # rank plans and the group load (public API only)
    "src/convert": 7,
    "tools": 8,
    "python": 8,
    "capi": 8,                     # the C ABI (libckpt_c.so)
}

# Layers that may include only public headers ("ckpt/...") and files of their own folder.
PUBLIC_ONLY = {"tools", "python", "capi"}

# Public headers (include/ckpt/<name>) -> rank. Any header not listed gets DEFAULT_PUBLIC_RANK.
PUBLIC_HEADERS = {
    # vocabulary: usable everywhere
    "error.h": 0,
    "dtype.h": 0,
    "tensor.h": 0,
    "value.h": 0,
    "source.h": 0,
    "sink.h": 0,
    "options.h": 0,
    "remote.h": 0,  # URL sources and the S3 sink (src/io/remote)
    "format.h": 0,
    "memory.h": 0,  # kept load memory (src/util/arena.cc)
    "device.h": 0,  # where loaded bytes live (src/device)
    "features.h": 0,  # build_features() (src/util/features.cc)
    # one format's entry points
    "safetensors.h": 4,
    "tensorizer.h": 4,
    "torch.h": 4,
    "dcp.h": 4,
    "torchscript_types.h": 4,
    "onnx_types.h": 4,
    # the API: checkpoint.h, torchscript.h, convert.h, ckpt.h, ...
    "digest.h": 6,  # implemented in src/convert (it names tensors as flatten_state_dict does)
}
DEFAULT_PUBLIC_RANK = 6

# Headers written at configure time into the build folder (cmake/ckpt_features.cmake): no layer.
GENERATED = {"ckpt_features.h"}

# What is walked, and which files are read.
ROOTS = ["src", "tools", "include/ckpt", "python", "capi"]
SOURCE_EXT = {".h", ".hh", ".hpp", ".hxx", ".inl", ".ipp", ".c", ".cc", ".cpp", ".cxx"}
PUBLIC_DIR = "include/ckpt"
INCLUDE_PATH = ["src", "include"]  # after the including file's own folder, as in the build

# ---------------------------------------------------------------------------------------------

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<(ckpt/[^>]+)>)')


def norm(path):
    return os.path.normpath(path).replace(os.sep, "/")


def layer_of(rel):
    """The LAYERS key of the longest folder that holds `rel`, or None."""
    best = None
    for folder in LAYERS:
        if rel == folder or rel.startswith(folder + "/"):
            if best is None or len(folder) > len(best):
                best = folder
    return best


def public_rank(rel):
    return PUBLIC_HEADERS.get(rel[len(PUBLIC_DIR) + 1:], DEFAULT_PUBLIC_RANK)


def top_folder(folder):
    return folder.split("/", 1)[0]


class Node:
    """Where a file sits: a public header (rank from PUBLIC_HEADERS) or a layer folder."""

    def __init__(self, rel, public, layer, rank):
        self.rel, self.public, self.layer, self.rank = rel, public, layer, rank

    def describe(self):
        if self.public:
            return "public %s [%d]" % (os.path.basename(self.rel), self.rank)
        if self.layer is None:
            return "unknown"
        name = self.layer[4:] if self.layer.startswith("src/") else self.layer
        return "%s [%d]" % (name, self.rank)


def classify(rel):
    if rel.startswith(PUBLIC_DIR + "/"):
        return Node(rel, True, None, public_rank(rel))
    layer = layer_of(rel)
    return Node(rel, False, layer, LAYERS[layer] if layer else None)


def resolve(root, including_rel, target):
    """Repository-relative path the build would pick for `#include "target"`, or a guess."""
    candidates = [os.path.join(os.path.dirname(including_rel), target)]
    candidates += [os.path.join(d, target) for d in INCLUDE_PATH]
    for c in candidates:
        if os.path.isfile(os.path.join(root, c)):
            return norm(c), True
    # Not on disk (yet): guess from the spelling, so a header being written is still judged.
    if target.startswith("ckpt/"):
        return norm(os.path.join("include", target)), False
    if layer_of(norm(os.path.join("src", target))):
        return norm(os.path.join("src", target)), False
    return norm(candidates[0]), False


def back_edge(src, dst):
    """Why the edge src -> dst is not allowed, or None."""
    if src.public:
        if not dst.public:
            return "a public header includes a private one"
        if dst.rank > src.rank:
            return "public header of a higher rank"
        return None
    if src.layer in PUBLIC_ONLY:
        if dst.public:
            return None
        if dst.layer is not None and top_folder(dst.layer) == top_folder(src.layer):
            return None
        return "%s/ may include only public headers (ckpt/...)" % top_folder(src.layer)
    if dst.public:
        return None if dst.rank <= src.rank else "public header of a higher layer"
    if dst.layer is None:
        return None  # outside every layer (reported separately when unresolved)
    if dst.layer in PUBLIC_ONLY:
        return "includes %s/" % top_folder(dst.layer)
    if dst.layer == src.layer or dst.rank < src.rank:
        return None
    if dst.rank > src.rank:
        return "lower layer includes a higher one"
    if src.layer.startswith(dst.layer + "/"):
        return None  # a folder may use its parent of the same rank (formats/torch -> formats)
    if dst.layer.startswith(src.layer + "/"):
        return "shared code includes one of its subfolders"
    return "sibling layers of the same rank"


def walk(root):
    for top in ROOTS:
        base = os.path.join(root, top)
        if not os.path.isdir(base):
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for f in sorted(filenames):
                if os.path.splitext(f)[1] in SOURCE_EXT:
                    yield norm(os.path.relpath(os.path.join(dirpath, f), root))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                    help="repository root (default: the script's parent folder)")
    ap.add_argument("-v", "--verbose", action="store_true", help="also list the allowed edges")
    args = ap.parse_args()
    root = os.path.abspath(args.root)

    files = edges = 0
    bad, unresolved, strays = [], [], []
    for rel in walk(root):
        files += 1
        src = classify(rel)
        if not src.public and src.layer is None:
            strays.append(rel)
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                target = m.group(1) or m.group(2)
                if target in GENERATED:
                    continue
                edges += 1
                dst_rel, found = resolve(root, rel, target)
                dst = classify(dst_rel)
                why = back_edge(src, dst)
                where = "%s:%d -> %s" % (rel, lineno, target)
                if not found:
                    unresolved.append(where)
                if why:
                    bad.append("%s  (%s -> %s: %s)" % (where, src.describe(), dst.describe(), why))
                elif args.verbose:
                    print("ok   %s  (%s -> %s)" % (where, src.describe(), dst.describe()))

    for w in unresolved:
        print("warning: not found (judged by its spelling): %s" % w, file=sys.stderr)
    for s in strays:
        bad.append("%s  (in no layer: add its folder to LAYERS in scripts/check_layers.py "
                   "and to CKPT_LAYERS in CMakeLists.txt)" % s)
    if bad:
        print("check_layers: %d back edge(s) in %d files, %d includes:" % (len(bad), files, edges))
        for b in bad:
            print("  " + b)
        return 1
    print("check_layers: OK: %d files, %d includes, no back edges" % (files, edges))
    return 0


if __name__ == "__main__":
    sys.exit(main())
