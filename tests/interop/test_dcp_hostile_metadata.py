"""Hostile `.metadata` pickles of torch.distributed.checkpoint folders, as `ckpt ls` meets them: a
tree nested 300,000 deep, planner_data paths whose list indexes ask for gigabytes of padding, keys
listed twice. Each is refused with its exit status, within bounded memory and time, naming the
key; nothing crashes.

The folders start as a real one-process torch save (or hold only the crafted `.metadata`); the
metadata is changed through torch's own classes and written back with pickle, as torch writes it.
"""

import os
import pickle
import resource
import shutil
import subprocess
import time

import pytest
import torch

pytestmark = pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                                reason="DCP folders are made by torch 2.x")

CORRUPT, LIMIT = 5, 7


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    import torch.distributed.checkpoint as dcp

    d = tmp_path_factory.mktemp("dcp_hostile_md") / "base"
    dcp.save({"w": torch.arange(32.0).reshape(8, 4), "b": torch.ones(4), "n": 3},
             checkpoint_id=str(d), no_dist=True)
    return d


def variant(base, tmp_path, change, name="v", protocol=None):
    d = tmp_path / name
    shutil.copytree(base, d)
    with open(d / ".metadata", "rb") as f:
        md = pickle.load(f)
    change(md)
    with open(d / ".metadata", "wb") as f:
        pickle.dump(md, f, protocol=protocol)
    return d


def run_bounded(ckpt, *args, mem_gb=1):
    """ckpt with its address space capped: an allocation past the cap fails instead of paging."""
    def cap():  # ASan reserves terabytes of shadow address space: no cap under it
        lim = mem_gb << 30
        if "asan" not in ckpt.path:
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    start = time.monotonic()
    r = subprocess.run([ckpt.path, *map(str, args)], capture_output=True, text=True,
                       errors="replace", timeout=120, preexec_fn=cap)
    return r, time.monotonic() - start


def test_deep_tree_is_limit_exceeded_not_a_crash(ckpt, tmp_path):
    d = tmp_path / "deep"
    d.mkdir()
    (d / ".metadata").write_bytes(b"\x80\x02N" + b"\x85" * 300000 + b".")
    r = ckpt.run("ls", d)
    assert r.returncode == LIMIT, (r.returncode, r.stderr)
    assert ".metadata" in r.stderr and "--max-pickle-depth" in r.stderr, r.stderr
    # Raised past the depth, the tree is read and refused as what it is, printed cut short.
    r = ckpt.run("ls", d, "--max-pickle-depth", "400000")
    assert r.returncode == 6, (r.returncode, r.stderr)
    assert "((((((((" in r.stderr and "Metadata" in r.stderr, r.stderr


@pytest.mark.parametrize("lists", [1, 16])
def test_index_padding_is_bounded_by_the_input(ckpt, base, tmp_path, lists):
    """("a", 16777216) in planner_data asked for a list of 16M None: 2.5 GB from 479 bytes."""
    def change(md):
        for i in range(lists):
            key = "w" if i == 0 else f"x{i}"
            if i:
                md.state_dict_metadata[key] = md.state_dict_metadata["b"]
            md.planner_data[key] = (f"a{i}", 16777216)
    d = variant(base, tmp_path, change)
    assert os.path.getsize(d / ".metadata") < 2048
    r, took = run_bounded(ckpt, "ls", d)
    assert r.returncode == LIMIT, (r.returncode, r.stderr)
    assert "planner_data" in r.stderr and "w" in r.stderr, r.stderr
    assert "--max-object-mb" in r.stderr or "max_object_bytes" in r.stderr, r.stderr
    assert took < 20, took


def test_gaps_torch_writes_are_read(ckpt, tmp_path):
    """An empty dict in a list leaves no key: torch writes ("a", 3) alone. ckpt pads as torch's
    set_element does."""
    import torch.distributed.checkpoint as dcp

    d = tmp_path / "gap"
    dcp.save({"a": [{}, {}, {}, torch.ones(2)]}, checkpoint_id=str(d), no_dist=True)
    with open(d / ".metadata", "rb") as f:
        assert pickle.load(f).planner_data == {"a.3": ("a", 3)}
    out = ckpt.ok("ls", d).stdout
    assert "a.3" in out, out


def test_duplicate_keys_are_corrupt(ckpt, base, tmp_path):
    """A pickle can list one dict key twice (SETITEMS appends): Python keeps the last, ckpt listed
    both and wrote one of them. Refused, naming the key (and a NUL in it printed escaped)."""
    twin = "TWIN_OF_A_KEY"
    for key in ("w", "w\x00z"):
        def change(md):
            md.state_dict_metadata[key] = md.state_dict_metadata["w"]
            md.state_dict_metadata[twin] = md.state_dict_metadata["w"]
        # Protocol 2 (no frames): the twin's BINUNICODE becomes the key's, lengths and all.
        d = variant(base, tmp_path, change, name=f"dup{len(key)}", protocol=2)
        raw = (d / ".metadata").read_bytes()

        def binunicode(s):
            return b"X" + len(s.encode()).to_bytes(4, "little") + s.encode()
        assert raw.count(binunicode(twin)) == 1
        (d / ".metadata").write_bytes(raw.replace(binunicode(twin), binunicode(key)))
        r = ckpt.run("ls", d)
        assert r.returncode == CORRUPT, (r.returncode, r.stderr)
        assert "twice" in r.stderr and r.stderr.rstrip().endswith("[corrupt]"), r.stderr
        assert key.replace("\x00", "\\x00") in r.stderr, r.stderr
        r = ckpt.run("convert", d, tmp_path / f"out{len(key)}.pt")
        assert r.returncode == CORRUPT, (r.returncode, r.stderr)
