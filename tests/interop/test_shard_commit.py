"""Interrupted sharded conversions (`convert --max-shard-size`) never mix two models.

A set A (same tensor names, other values than B) is written as shards; then B is converted over
it with the same shard names and killed (SIGKILL, SIGINT, SIGTERM) at many points, most of them
in the commit (many small shards, each committed with an fsync and a rename). After each kill
the index names either A's shards or B's, every file it names is there, `ckpt load` of it exits
0, and every tensor read back with safetensors is A's or B's, bit for bit, all from the same
one. A fresh target interrupted by SIGINT or SIGTERM leaves no shard, no index and no folder
made for it. docs/design/writers.md ("Writers", **Shard sets**) says why this holds.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import time

import pytest

np = pytest.importorskip("numpy")
st = pytest.importorskip("safetensors.numpy")

TENSORS, NUMEL = 48, 32768  # 48 float32 tensors of 128 KiB: 48 shards of one tensor each
KILLS = int(os.environ.get("CKPT_SHARD_KILLS", "12"))
SHARD = str(NUMEL * 4)


def model(seed):
    rng = np.random.default_rng(seed)
    return {f"layer{i}.weight": rng.standard_normal(NUMEL, dtype=np.float32)
            for i in range(TENSORS)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("shardcommit")
    out = {}
    for name, seed in (("a", 1), ("b", 2)):
        tensors = model(seed)
        st.save_file(tensors, str(d / f"{name}.safetensors"))
        out[name] = tensors
    return d, out


def which_model(index, models):
    """'a' or 'b': the model the set at `index` holds whole; fails on a mix or a missing file."""
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    folder = os.path.dirname(index)
    seen = set()
    for name, shard in weight_map.items():
        path = os.path.join(folder, shard)
        assert os.path.isfile(path), f"the index names {shard}, which is not there"
        got = st.load_file(path)[name]
        match = [m for m, ts in models.items() if np.array_equal(ts[name], got)]
        assert match, f"{name} in {shard} is neither model's"
        seen.update(match)
    assert len(seen) == 1, f"a mix of both models: {seen}"
    assert sorted(weight_map) == sorted(models["a"])
    return seen.pop()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM],
                         ids=["SIGKILL", "SIGINT", "SIGTERM"])
def test_interrupted_replacement_is_the_old_set_or_the_new_one(ckpt, models, tmp_path, sig):
    d, tensors = models
    out = tmp_path / "set" / "model.safetensors"
    index = str(out) + ".index.json"
    ckpt.ok("convert", d / "a.safetensors", out, "--max-shard-size", SHARD)
    t0 = time.monotonic()
    ckpt.ok("convert", d / "b.safetensors", out, "--max-shard-size", SHARD)
    full = time.monotonic() - t0
    rng = random.Random(int(sig))
    outcomes = {"a": 0, "b": 0}
    for k in range(KILLS):
        ckpt.ok("convert", d / "a.safetensors", out, "--max-shard-size", SHARD)
        assert which_model(index, tensors) == "a"
        p = subprocess.Popen([ckpt.path, "convert", str(d / "b.safetensors"), str(out),
                              "--max-shard-size", SHARD],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(full * 0.2, full * 1.05))
        p.send_signal(sig)
        p.wait()
        got = which_model(index, tensors)
        outcomes[got] += 1
        r = ckpt.run("load", index)
        assert r.returncode == 0, r.stderr
    print(f"{signal.Signals(sig).name}: {KILLS} kills: {outcomes}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_fresh_set_leaves_nothing(ckpt, models, tmp_path, sig):
    d, tensors = models
    top = tmp_path / "fresh"
    out = top / "sub" / "model.safetensors"
    t0 = time.monotonic()
    ckpt.ok("convert", d / "b.safetensors", out, "--max-shard-size", SHARD)
    full = time.monotonic() - t0
    rng = random.Random(int(sig) + 100)
    for k in range(KILLS):
        shutil.rmtree(top, ignore_errors=True)
        p = subprocess.Popen([ckpt.path, "convert", str(d / "b.safetensors"), str(out),
                              "--max-shard-size", SHARD],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0, full * 1.05))
        p.send_signal(sig)
        rc = p.wait()
        if rc == 0:
            assert which_model(str(out) + ".index.json", tensors) == "b"
        else:
            # 128 + sig from ckpt's handler; -sig when the signal came before ckpt handled
            # signals (the process's first instants).
            assert rc in (128 + int(sig), -int(sig)), rc
            # Nothing, or (a signal after the index was committed) the whole new set.
            if top.exists() and os.path.exists(str(out) + ".index.json"):
                assert which_model(str(out) + ".index.json", tensors) == "b"
            else:
                assert not top.exists(), os.listdir(top)


def test_rename_failure_keeps_the_old_set(ckpt, models, tmp_path):
    """A shard that cannot be put in place (a folder holds its name): the conversion fails, the
    old set is whole and loads, and no shard of the new one is left."""
    d, tensors = models
    out = tmp_path / "model.safetensors"
    ckpt.ok("convert", d / "a.safetensors", out, "--max-shard-size", SHARD)
    before = sorted(os.listdir(tmp_path))
    blocker = tmp_path / f"model-00003-of-00024.safetensors"
    (blocker / "x").mkdir(parents=True)
    r = ckpt.run("convert", d / "b.safetensors", out, "--max-shard-size", str(2 * NUMEL * 4))
    assert r.returncode != 0
    assert which_model(str(out) + ".index.json", tensors) == "a"
    shutil.rmtree(blocker)
    assert sorted(os.listdir(tmp_path)) == before


def test_a_shard_that_cannot_be_replaced_leaves_a_whole_set(ckpt, models, tmp_path):
    """The same shard names, and the old set's 10th shard cannot be replaced (immutable:
    `chattr +i`, so a rename over it fails with EPERM) once earlier shards have been. The set
    on disk is then A's or B's whole, and it loads: never A's index over a mix, or over shards
    that were removed."""
    d, tensors = models
    out = tmp_path / "model.safetensors"
    index = str(out) + ".index.json"
    ckpt.ok("convert", d / "a.safetensors", out, "--max-shard-size", SHARD)
    pinned = tmp_path / f"model-00010-of-{TENSORS:05d}.safetensors"
    assert pinned.is_file()
    if subprocess.run(["chattr", "+i", str(pinned)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (needs root and a file system with flags)")
    try:
        ckpt.run("convert", d / "b.safetensors", out, "--max-shard-size", SHARD)
        assert which_model(index, tensors) in ("a", "b")
        r = ckpt.run("load", index)
        assert r.returncode == 0, r.stderr
    finally:
        subprocess.run(["chattr", "-i", str(pinned)])
