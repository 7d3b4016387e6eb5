"""What `ckpt convert` refuses, and what it keeps, at the edges of its write path.

- An OUT that is one of the input's own files (the file itself, a shard or the index of a set,
  a data file of a DCP folder): exit 8 before anything is written, the input still reads.
- A file replaced keeps its permission bits (0600 stays 0600), as torch.save, which opens the
  existing file, keeps them.
- --budget-mb: 0 or more than fits 64 bits of bytes is a usage error saying the bound.
- Out of memory names the input and the output.
- A flag of another format is refused, naming the flag and the format.
"""

import os
import resource
import stat
import subprocess

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture
def model(tmp_path):
    g = torch.Generator().manual_seed(3)
    sd = {f"l{i}.weight": torch.randn(64, 64, generator=g) for i in range(6)}
    path = tmp_path / "m.pt"
    torch.save(sd, path)
    return path, sd


def snapshot(folder):
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_out_that_is_the_input_itself_is_refused(ckpt, model):
    path, _ = model
    before = path.read_bytes()
    r = ckpt.run("convert", path, path, "--to", "safetensors")
    assert r.returncode == 8, r.stderr
    assert "is a file of the input" in r.stderr, r.stderr
    assert path.read_bytes() == before


def test_out_that_is_a_shard_or_the_index_of_the_input_set_is_refused(ckpt, model, tmp_path):
    path, _ = model
    d = tmp_path / "set"
    ckpt.ok("convert", path, d / "model.safetensors", "--max-shard-size", "20000")
    index = d / "model.safetensors.index.json"
    before = snapshot(d)
    shard = d / "model-00001-of-00006.safetensors"
    assert shard.exists(), sorted(os.listdir(d))
    for out, extra in ((shard, []), (index, ["--max-shard-size", "20000"]),
                       (d / "model.safetensors", ["--max-shard-size", "20000"])):
        r = ckpt.run("convert", index, out, *extra)
        assert r.returncode == 8, (out, r.stderr)
        assert "is a file of the input" in r.stderr, r.stderr
        assert snapshot(d) == before
    ckpt.ok("load", index)


def test_out_that_is_a_data_file_of_the_input_dcp_folder_is_refused(ckpt, model, tmp_path):
    path, _ = model
    d = tmp_path / "dcp"
    ckpt.ok("convert", path, d, "--to", "dcp")
    before = snapshot(d)
    r = ckpt.run("convert", d, d / "__0_0.distcp", "--to", "pt")
    assert r.returncode == 8, r.stderr
    assert "is a file of the input" in r.stderr, r.stderr
    assert snapshot(d) == before
    ckpt.ok("load", d)


@pytest.mark.parametrize("ext", ["pt", "safetensors", "tensors"])
def test_replacing_a_file_keeps_its_mode(ckpt, model, tmp_path, ext):
    path, _ = model
    out = tmp_path / f"o.{ext}"
    ckpt.ok("convert", path, out)
    os.chmod(out, 0o600)
    ckpt.ok("convert", path, out)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    os.chmod(out, 0o640)
    ckpt.ok("convert", path, out)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o640


@pytest.mark.parametrize("value, says", [
    ("0", "--budget-mb: must be more than 0, not 0"),
    ("1e30", "--budget-mb: must be at most 17592186044415"),
    ("18446744073709551616", "--budget-mb: must be at most 17592186044415"),
])
def test_budget_mb_out_of_range_says_the_bound(ckpt, model, tmp_path, value, says):
    path, _ = model
    r = ckpt.run("convert", path, tmp_path / "o.pt", "--budget-mb", value)
    assert r.returncode == 64, r.stderr
    assert says in r.stderr, r.stderr
    assert not (tmp_path / "o.pt").exists()


@pytest.mark.parametrize("args, says", [
    (["--align", "64"], "--align is only available for pt and safetensors output, not tensorizer"),
    (["--meta", "zeros"], "--meta is only available for safetensors output, not tensorizer"),
    (["--copy-shared"], "--copy-shared is only available for safetensors output, not tensorizer"),
    (["--dcp-files", "2"], "--dcp-files is only available for dcp output, not tensorizer"),
    (["--max-shard-size", "1MB"],
     "--max-shard-size is only available for pt and safetensors output, not tensorizer"),
])
def test_a_flag_of_another_format_is_refused(ckpt, model, tmp_path, args, says):
    path, _ = model
    r = ckpt.run("convert", path, tmp_path / "sub" / "o.tensors", *args)
    assert r.returncode == 8, r.stderr
    assert says in r.stderr, r.stderr
    assert not any(tmp_path.iterdir()) or sorted(os.listdir(tmp_path)) == ["m.pt"]


def test_out_of_memory_names_the_input_and_the_output(ckpt, model, tmp_path):
    if "asan" in ckpt.path:
        pytest.skip("an ASan build reserves terabytes of shadow memory")
    path, _ = model
    d = tmp_path / "dcp"
    ckpt.ok("convert", path, d, "--to", "dcp")
    out = tmp_path / "o.pt"
    limit = 1 << 30

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    # A DCP folder is streamed through a ring of --budget-mb: 4 GiB cannot be had under 1 GiB.
    r = subprocess.run([ckpt.path, "convert", str(d), str(out), "--budget-mb", "4096"],
                       capture_output=True, text=True, timeout=120, preexec_fn=limited)
    assert r.returncode == 7, r.stderr
    assert "out of memory" in r.stderr and str(d) in r.stderr and str(out) in r.stderr, r.stderr
    assert not out.exists()
