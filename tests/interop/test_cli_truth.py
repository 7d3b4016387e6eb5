"""The command line tells the truth (issue 16, points 4, 6, 8 and 9).

- Progress: every long command (convert, verify, load in each mode, extract, sample, digest,
  rewrite, bench) draws one line on stderr with --progress, ending at 100% and one newline; none
  without it when stderr is not a terminal, none with --no-progress on a terminal.
- Options that would be ignored are usage errors (64) or warnings, never silent: load --digest
  without --json, --threads -3, sample --size-mb 0, digest --json with -o, a decryption key for a
  file that is not encrypted.
- An unknown command names the nearest real one; ls ends with a totals line; convert reports the
  bytes it wrote; converting a module's state_dict prints no note about `_metadata`.
- sample honours --size-mb and writes the format its extension names (read back by torch and by a
  plain safetensors parse).
- Key files: an existing key file is used, never replaced.
- bench: every ckpt row that moves bytes names its limit, measured with the same thread count.
"""

import json
import os
import pty
import shutil
import struct
import subprocess

import pytest
import helpers

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A training checkpoint (model + optimizer state) and a TorchScript archive, from torch;
    the archive is scripted in a child process (scripting here would rename classes that other
    test modules compare)."""
    d = tmp_path_factory.mktemp("truth")
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 256)).sum().backward()
    opt.step()
    ckpt_path = d / "train.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}, ckpt_path)
    sd_path = d / "sd.pt"
    torch.save(model.state_dict(), sd_path)
    ts_path = d / "ts.pt"
    script = d / "make_ts.py"
    script.write_text(f"""
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(128, 128)
    def forward(self, x):
        return self.lin(x).relu()
torch.jit.save(torch.jit.script(M()), {str(ts_path)!r})
""")
    subprocess.run(["/usr/bin/python3", str(script)], check=True, timeout=120)
    return {"train": str(ckpt_path), "sd": str(sd_path), "ts": str(ts_path), "dir": d}


def _run_raw(ckpt, *args):
    """Runs ckpt keeping stderr's bytes (text mode would turn \\r into \\n)."""
    r = subprocess.run([ckpt.path, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=120)
    assert r.returncode == 0, (args, r.returncode, r.stderr[-2000:])
    return r.stderr.decode()


def _progress_done(stderr):
    """The progress line: redrawn with \\r, ends at 100% and one newline."""
    assert "\r" in stderr and "100%" in stderr, repr(stderr[-300:])
    last = stderr.split("\r")[-1]
    assert "100%" in last and last.endswith("\n"), repr(last)


@pytest.mark.parametrize("cmd", ["convert", "verify", "load-eager", "load-mmap", "load-stream",
                                 "extract", "sample", "digest", "rewrite", "verify-digests"])
def test_progress_when_asked(ckpt, files, tmp_path, cmd):
    f = files["train"]
    manifest = files["dir"] / "m.json"
    if cmd == "verify-digests" and not manifest.exists():
        ckpt.ok("digest", f, "-o", manifest)
    out = tmp_path / "out"
    args = {
        "convert": ["convert", f, out / "o.safetensors"],
        "verify": ["verify", f],
        "load-eager": ["load", f],
        "load-mmap": ["load", f, "--mode", "mmap"],
        "load-stream": ["load", f, "--mode", "stream", "--budget-mb", "1"],
        "extract": ["extract", f, out / "x"],
        "sample": ["sample", out / "s.pt", "--size-mb", "4"],
        "digest": ["digest", f, "-o", out / "m.json"],
        "rewrite": ["rewrite", files["ts"], out / "r.pt"],
        "verify-digests": ["verify", f, "--digests", manifest],
    }[cmd]
    for progress in (True, False):
        out.mkdir()
        err = _run_raw(ckpt, *args, *(["--progress"] if progress else []))
        if progress:
            _progress_done(err)
        else:  # not a terminal, not asked: no progress line at all
            assert "\r" not in err and "100%" not in err, repr(err)
        shutil.rmtree(out)


def test_no_progress_on_a_terminal(ckpt, files, tmp_path):
    """On a terminal, --no-progress draws nothing; --progress and --no-progress together are a
    usage error."""
    master, slave = pty.openpty()
    try:
        r = subprocess.run([ckpt.path, "sample", str(tmp_path / "s.pt"), "--size-mb", "64",
                            "--no-progress"], stdout=subprocess.PIPE, stderr=slave, timeout=60)
    finally:
        os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    assert r.returncode == 0
    assert err == b"", err
    r = ckpt.run("verify", files["train"], "--progress", "--no-progress")
    assert r.returncode == 64, r.stderr


@pytest.mark.parametrize("args, says", [
    (["load", "{train}", "--digest"], "--digest requires --json"),
    (["load", "{train}", "--threads", "-3"], "--threads: must be at least 0, not -3"),
    (["load", "{train}", "--mode", "stream", "--budget-mb", "0"], "--budget-mb: must be more than 0"),
    (["sample", "{dir}/z.pt", "--size-mb", "0"], "--size-mb: must be more than 0, not 0"),
    (["sample", "{dir}/z.pt", "--size-mb", "ten"], "'ten' is not a number"),
    (["digest", "{train}", "--json", "-o", "{dir}/m.json"], "excludes"),
    (["bench", "{train}", "--repeat", "0"], "--repeat: must be at least 1"),
])
def test_options_that_would_be_ignored_are_usage_errors(ckpt, files, tmp_path, args, says):
    args = [a.format(train=files["train"], dir=tmp_path) for a in args]
    r = ckpt.run(*args)
    assert r.returncode == 64, (r.returncode, r.stderr)
    assert says in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not any(tmp_path.iterdir())  # nothing written


def test_decrypt_key_for_a_plain_file_is_warned_about(ckpt, files, tmp_path):
    key = tmp_path / "k.key"
    key.write_text("00" * 32 + "\n")
    key.chmod(0o600)
    r = ckpt.ok("ls", files["train"], "--decrypt-key", key)
    assert f"ckpt: warning: {files['train']} is not encrypted; --decrypt-key ignored" in r.stderr


@pytest.mark.parametrize("word, nearest", [("lss", "ls"), ("verfy", "verify"), ("conv", "convert"),
                                           ("digets", "digest"), ("extrct", "extract")])
def test_unknown_command_names_the_nearest(ckpt, word, nearest):
    r = ckpt.run(word, "x.pt")
    assert r.returncode == 64
    assert r.stderr == f"ckpt: unknown command '{word}'; did you mean '{nearest}'? (see ckpt --help)\n"
    r = ckpt.run("zzzzzzzz", "x.pt")
    assert r.returncode == 64 and r.stderr == "ckpt: unknown command 'zzzzzzzz' (see ckpt --help)\n"


def test_ls_ends_with_totals(ckpt, files):
    r = ckpt.ok("ls", files["train"])
    lines = r.stdout.rstrip("\n").split("\n")
    sd = helpers.torch_load(files["train"])
    listed = json.loads(ckpt.ok("ls", files["train"], "--json").stdout)["tensors"]
    total = sum(t["nbytes"] for t in listed)
    assert set(lines[-2]) == {"-"}, lines[-2]
    assert lines[-1].startswith(f"{len(listed)} tensors, {total} bytes ("), lines[-1]
    assert len(lines) == 1 + len(listed) + 2
    n_params = sum(v.numel() * v.element_size() for v in sd["model"].values())
    assert total > n_params  # the optimizer's moments are listed too


def test_convert_reports_the_bytes_it_wrote(ckpt, files, tmp_path):
    for out in ("o.pt", "o.safetensors", "o.tensors"):
        r = ckpt.ok("convert", files["train"], tmp_path / out)
        size = os.path.getsize(tmp_path / out)
        assert f"({size} bytes)" in r.stdout, (r.stdout, size)


def test_state_dict_conversion_has_no_metadata_note(ckpt, files, tmp_path):
    # A module's state_dict carries `_metadata` (module versions): not worth a note.
    r = ckpt.ok("convert", files["sd"], tmp_path / "sd.safetensors")
    assert "note" not in r.stderr and "_metadata" not in r.stderr, r.stderr
    # Real non-tensor values are still reported.
    r = ckpt.ok("convert", files["train"], tmp_path / "t.safetensors")
    assert "not written" in r.stderr and "epoch" in r.stderr, r.stderr
    assert "attributes of" not in r.stderr, r.stderr


def _safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


@pytest.mark.parametrize("size_mb", [1, 10, 64])
@pytest.mark.parametrize("ext", ["pt", "safetensors", "tensors"])
def test_sample_honours_size_and_format(ckpt, tmp_path, size_mb, ext):
    out = tmp_path / f"s.{ext}"
    r = ckpt.ok("sample", out, "--size-mb", size_mb)
    want = size_mb * 2**20
    info = json.loads(ckpt.ok("info", out, "--json").stdout)
    fmt = {"pt": "torch-zip", "safetensors": "safetensors", "tensors": "tensorizer"}[ext]
    assert info["format"] == fmt, info["format"]
    listed = json.loads(ckpt.ok("ls", out, "--json").stdout)["tensors"]
    data = sum(t["nbytes"] for t in listed)
    assert abs(data - want) <= 0.02 * want, (data, want)
    if ext == "pt":
        sd = helpers.torch_load(out)
        assert sum(v.numel() * v.element_size() for v in sd.values()) == data
    elif ext == "safetensors":
        header, start = _safetensors_header(out)
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        assert start + max(ends) == os.path.getsize(out)
    assert f"wrote {out} ({'pt' if ext == 'pt' else fmt})" in r.stdout, r.stdout


def test_sample_unknown_extension_is_refused(ckpt, tmp_path):
    r = ckpt.run("sample", tmp_path / "s.npz", "--size-mb", "1")
    assert r.returncode == 8 and "cannot tell the output format" in r.stderr
    assert not any(tmp_path.iterdir())


def test_existing_key_file_is_used_not_replaced(ckpt, files, tmp_path):
    key = tmp_path / "k.key"
    r = ckpt.ok("convert", files["sd"], tmp_path / "a.tensors", "--encrypt-key", key)
    assert "wrote a new random key" in r.stderr
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    before = key.read_bytes()
    r = ckpt.ok("convert", files["sd"], tmp_path / "b.tensors", "--encrypt-key", key)
    assert "wrote a new random key" not in r.stderr
    assert key.read_bytes() == before
    # Both files open with the one key.
    for name in ("a.tensors", "b.tensors"):
        ckpt.ok("verify", tmp_path / name, "--decrypt-key", key)


def test_bench_rows_name_their_limits(ckpt, files):
    r = ckpt.ok("bench", files["train"], "--json", "--repeat", "1", timeout=300)
    j = json.loads(r.stdout)
    rows = {x["name"]: x for x in j["results"]}
    threads = j["threads"]
    assert threads >= 1
    bounded = [x for x in j["results"] if x["name"].startswith("ckpt:") and x["gb_per_s"]
               and "fsync" not in x["name"]]
    assert len(bounded) >= 6
    for x in bounded:
        assert x["limit"] in rows and rows[x["limit"]]["name"].startswith("limit:"), x
        # Same thread count on both sides of every ratio.
        ours, theirs = x["name"].rsplit(", ", 1)[-1], x["limit"].rsplit(", ", 1)[-1]
        assert ours == theirs or (ours, theirs) in {("1 reader", "1 thread"),
                                                    ("2 threads", "best of 1 and 2 threads")}, x
        assert x["vs_limit"] > 0
    eager = rows[f"ckpt: eager load, {threads} thread{'s' if threads > 1 else ''}"]
    assert eager["limit"] == f"limit: pread into fresh huge pages, {threads} thread{'s' if threads > 1 else ''}"
