"""Streamed conversions of torch.distributed.checkpoint (DCP) folders, and DCP folders in S3.

A DCP folder is not one mapped file: `ckpt convert` reads its storages ahead of the writer, in
the writer's order, through a ring of `--budget-mb` (a larger tensor is held alone), instead of
loading the model first. The peers are torch (dcp_to_torch_save, dcp.load) and safetensors; the
S3 server is a real Ceph RADOS Gateway (the session's `rgw`, conftest.py).
"""

import os
import subprocess
import sys
import time
import warnings
from urllib.parse import quote

import pytest
import torch

import helpers
from helpers import s3_env

pytestmark = pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                                reason="DCP folders are made by torch 2.x")


def tensors_of(path):
    return {k: v for k, v in helpers.flatten(torch.load(path, weights_only=False))
            if isinstance(v, torch.Tensor)}


@pytest.fixture(scope="module")
def dtensor(dcp_dirs):
    """The 4-rank folder (Shard(0), Shard(1), Shard(2), Replicate, bf16) and its tensors as
    dcp_to_torch_save gives them."""
    d = dcp_dirs["dtensor"]
    return d, tensors_of(d + ".pt")


def assert_equal_tensors(got, want):
    assert sorted(got) == sorted(want)
    for k, t in want.items():
        assert got[k].dtype == t.dtype and torch.equal(got[k], t), k


# A budget of 1 KiB is smaller than every tensor: each is then held alone.
@pytest.mark.parametrize("budget", ["0.001", "1"])
def test_safetensors_with_a_budget_below_a_tensor(ckpt, dtensor, budget, tmp_path):
    from safetensors.torch import load_file

    d, want = dtensor
    out = tmp_path / "out.safetensors"
    ckpt.ok("convert", d, out, "--budget-mb", budget)
    assert_equal_tensors(load_file(str(out)), want)


def test_pt_and_tensorizer_streamed(ckpt, dtensor, tmp_path):
    d, want = dtensor
    ckpt.ok("convert", d, tmp_path / "out.pt", "--budget-mb", "0.001")
    assert_equal_tensors(tensors_of(tmp_path / "out.pt"), want)
    ckpt.ok("convert", d, tmp_path / "out.tensors", "--budget-mb", "0.001")
    ckpt.ok("convert", tmp_path / "out.tensors", tmp_path / "back.pt")
    assert_equal_tensors(tensors_of(tmp_path / "back.pt"), want)


def test_digests_read_the_folder_twice_and_verify(ckpt, dtensor, tmp_path):
    d, want = dtensor
    out = tmp_path / "out.safetensors"
    r = ckpt.ok("convert", d, out, "--digests", "--budget-mb", "0.001")
    assert "digest" in (r.stdout + r.stderr).lower()
    ckpt.ok("verify", out)


def test_dcp_to_dcp_streamed_loads_in_torch(ckpt, dtensor, tmp_path):
    import torch.distributed.checkpoint as dcp

    d, want = dtensor
    out = tmp_path / "three"
    ckpt.ok("convert", d, out, "--to", "dcp", "--dcp-files", "3", "--budget-mb", "0.001")
    sd = {k: torch.zeros_like(v) for k, v in want.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... single process"
        dcp.load(sd, checkpoint_id=str(out))
    assert_equal_tensors(sd, want)


def test_fsdp_training_state_to_pt_keeps_the_tree(ckpt, dcp_dirs, tmp_path):
    """Adam state and step counters (bytes items and tensors) through the streamed pt writer."""
    d = dcp_dirs["fsdp"]
    out = tmp_path / "out.pt"
    ckpt.ok("convert", d, out, "--budget-mb", "0.001")
    assert not helpers.compare(torch.load(out, weights_only=False),
                               torch.load(d + ".pt", weights_only=False))


MAKE_BIG = r"""
import sys, torch, torch.distributed.checkpoint as dcp
g = torch.Generator().manual_seed(1)
sd = {f"w.{i}": torch.randn(1024, 1024, generator=g) for i in range(48)}  # 48 x 4 MiB
dcp.save(sd, checkpoint_id=sys.argv[1], no_dist=True)
"""


def test_peak_memory_is_the_budget_plus_the_largest_tensor(ckpt, tmp_path):
    """192 MiB of tensors of 4 MiB converted with --budget-mb 16: the process holds about the
    budget (plus its own code and heap), never the model."""
    if "asan" in ckpt.path:
        pytest.skip("ASan's shadow memory counts in the RSS")
    d = tmp_path / "big"
    subprocess.run([sys.executable, "-c", MAKE_BIG, str(d)], check=True, capture_output=True,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = tmp_path / "big.safetensors"
    r, peak = helpers.run_measured(ckpt, "convert", d, out, "--budget-mb", "16")
    assert r.returncode == 0, r.stderr
    base = 48 << 20  # the binary, its libraries and heap (ckpt ls of a small file: ~20 MiB)
    assert peak < base + (16 << 20) + (4 << 20), f"peak RSS {peak >> 20} MiB"
    from safetensors.torch import load_file
    got = load_file(str(out))
    assert len(got) == 48 and got["w.7"].shape == (1024, 1024)


# ---------------------------------------------------------------------------------------------
# A DCP folder under an s3:// prefix (a real RGW: SigV4, ranged GETs).


def upload(rgw, folder, prefix):
    for name in sorted(os.listdir(folder)):
        rgw.put_file("/ckpt/" + quote(f"{prefix}/{name}", safe="/-._~"),
                     os.path.join(folder, name))
    return f"s3://ckpt/{prefix}/"


def run_env(ckpt, env, *args, timeout=120):
    return subprocess.run([ckpt.path, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, errors="replace")


def test_s3_prefix_lists_converts_and_slices(ckpt, rgw, dtensor, tmp_path):
    from safetensors.torch import load_file

    d, want = dtensor
    url = upload(rgw, d, "dcp/dtensor")
    env = s3_env(rgw)
    r = run_env(ckpt, env, "ls", url, "--json")
    assert r.returncode == 0, r.stderr
    import json
    listed = {t["name"]: t["shape"] for t in json.loads(r.stdout)["tensors"]}
    assert listed == {k: list(v.shape) for k, v in want.items()}
    out = tmp_path / "from_s3.safetensors"
    r = run_env(ckpt, env, "convert", url, out, "--budget-mb", "0.001")
    assert r.returncode == 0, r.stderr
    assert_equal_tensors(load_file(str(out)), want)


def test_s3_prefix_missing_data_file_is_named(ckpt, rgw, dtensor):
    d, _ = dtensor
    names = [n for n in sorted(os.listdir(d)) if n.endswith(".distcp")]
    for name in sorted(os.listdir(d)):
        if name != names[-1]:
            rgw.put_file("/ckpt/" + quote(f"dcp/holed/{name}", safe="/-._~"),
                         os.path.join(d, name))
    r = run_env(ckpt, s3_env(rgw), "ls", "s3://ckpt/dcp/holed/")
    assert r.returncode != 0
    assert names[-1] in r.stderr, r.stderr


def test_s3_metadata_over_the_limit_is_refused_before_it_is_read(ckpt, rgw, tmp_path):
    """A `.metadata` larger than Limits::max_metadata_bytes under an s3:// prefix is refused by
    its size (exit 7, naming it and the limit) before it is downloaded: the message is the size
    check's (the pickle reader's own bound says "pickle is larger"), and the gateway's access log
    shows far fewer bytes of it sent than it holds."""
    from conftest import DCP_FIXTURE

    if not DCP_FIXTURE:
        pytest.skip("the torch2/dcp_model fixture is not here")
    d = tmp_path / "bigmeta"
    d.mkdir()
    for name in os.listdir(DCP_FIXTURE):
        with open(os.path.join(DCP_FIXTURE, name), "rb") as src, open(d / name, "wb") as dst:
            dst.write(src.read())
    size = 24 << 20
    with open(d / ".metadata", "r+b") as f:  # the real pickle, then zeros past its STOP
        f.truncate(size)
    url = upload(rgw, d, "dcp/bigmeta")
    logs = [os.path.join(rgw.root, "log", n) for n in os.listdir(os.path.join(rgw.root, "log"))]
    before = {p: os.path.getsize(p) for p in logs}
    r = run_env(ckpt, s3_env(rgw), "ls", url, "--max-metadata-mb", "1")
    assert r.returncode == 7, r.stderr
    assert f".metadata of {size} bytes" in r.stderr and "max_metadata_bytes" in r.stderr, r.stderr
    # beast's access lines (written by Ceph's log thread, a moment later):
    # ... "GET /ckpt/dcp/bigmeta/.metadata HTTP/1.1" STATUS BYTES ...
    sent, deadline = [], time.monotonic() + 15
    while not sent and time.monotonic() < deadline:
        time.sleep(0.2)
        for p in logs:
            with open(p, "rb") as f:
                f.seek(before[p])
                for line in f.read().decode(errors="replace").splitlines():
                    if "GET /ckpt/dcp/bigmeta/.metadata" in line:
                        after = line.split('HTTP/1.1"', 1)[-1].split()
                        if len(after) >= 2 and after[1].isdigit():
                            sent.append(int(after[1]))
    assert sent and sum(sent) < size // 4, (sent, size)
