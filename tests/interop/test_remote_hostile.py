"""Remote inputs that reach out, hang, leak or mix (docs/security.md): shard indexes that name
URLs or leave their folder, servers that trickle, never end, redirect to ftp://, drop or change
their validators, or ignore Range; and URLs whose passwords and signatures must never be printed.

The servers are threads in this process (hostile_http.py), started once per session. Checkpoints
are safetensors files written here byte by byte (no torch needed).
"""

import json
import os
import struct
import subprocess
import time

import pytest

import hostile_http


def write_safetensors(path, tensors):
    """tensors: {name: (dtype, shape, bytes)}; the file safetensors would write."""
    header, data, at = {}, b"", 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(raw)]}
        data += raw
        at += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def noise(n, seed):
    import random
    return random.Random(seed).randbytes(n)


@pytest.fixture(scope="session")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile-www")
    big = {"a": ("F32", [256, 1024], noise(1 << 20, 1)),
           "b": ("F32", [512, 1024], noise(2 << 20, 2)),
           "c": ("I64", [1000], noise(8000, 3))}
    write_safetensors(d / "m.safetensors", big)
    write_safetensors(d / "s1.safetensors", {"a": big["a"]})
    write_safetensors(d / "s2.safetensors", {"b": big["b"], "c": big["c"]})
    return d


@pytest.fixture(scope="session")
def server(files):
    s = hostile_http.HostileServer(str(files))
    yield s
    s.stop()


_tokens = iter(range(1, 1 << 30))


@pytest.fixture
def tok():
    """A fresh path prefix, so each test's requests are counted apart."""
    return f"t{next(_tokens)}"


def digests(ckpt, *args, timeout=60):
    r = ckpt.run("load", "--json", "--digest", *args, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["digests"]


def index(folder, weight_map, name="model.safetensors.index.json"):
    p = os.path.join(folder, name)
    with open(p, "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return p


def run_in(ckpt, cwd, *args, env=None, timeout=60):
    return subprocess.run([ckpt.path, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env, errors="replace")


# ---------------------------------------------------------------------------------------------
# What an index may name.

def test_local_index_naming_urls_is_refused_before_any_request(ckpt, server, tmp_path, tok):
    url = server.url(tok, "plain", "m.safetensors")
    p = index(str(tmp_path), {"a": url, "b": url, "c": url})
    for cwd, arg in ((str(tmp_path), os.path.basename(p)), (None, p)):
        for cmd in (["ls"], ["load"]):
            r = run_in(ckpt, cwd, *cmd, arg)
            assert r.returncode == 5, r.stderr
            assert "local index names local files only" in r.stderr, r.stderr
    assert server.requests_under(f"/{tok}/") == []


def test_local_index_naming_s3_is_refused_before_signing(ckpt, server, tmp_path, tok):
    # Were the name followed, the request would be signed with these and sent to the server.
    env = {**os.environ, "AWS_ENDPOINT_URL": server.base, "AWS_ACCESS_KEY_ID": "AKIDHOSTILE",
           "AWS_SECRET_ACCESS_KEY": "hostile-secret", "AWS_REGION": "us-east-1"}
    p = index(str(tmp_path), {"a": f"s3://{tok}/plain/m.safetensors"})
    r = run_in(ckpt, str(tmp_path), "ls", os.path.basename(p), env=env)
    assert r.returncode == 5, r.stderr
    assert server.requests_under(f"/{tok}/") == []


def test_remote_index_names_only_its_own_prefix(ckpt, server, files, tok):
    other = f"{tok}x"
    for name, bad in ((f"{tok}-url.index.json", server.url(other, "plain", "m.safetensors")),
                      (f"{tok}-pct.index.json", "%2e%2e/%2e%2e/" + other + "/plain/m.safetensors"),
                      (f"{tok}-q.index.json", "m.safetensors?x=1")):
        index(str(files), {"a": bad}, name)
        r = ckpt.run("ls", server.url(tok, "plain", name))
        assert r.returncode == 5, (bad, r.stderr)
    assert server.requests_under(f"/{other}/") == []
    # A relative name under the prefix is read.
    index(str(files), {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s2.safetensors"},
          f"{tok}-ok.index.json")
    got = ckpt.json("ls", "--json", server.url(tok, "plain", f"{tok}-ok.index.json"))
    assert sorted(t["name"] for t in got["tensors"]) == ["a", "b", "c"]


# ---------------------------------------------------------------------------------------------
# Symbolic links out of an index's folder.

def test_shard_symlink_out_of_the_folder_is_refused(ckpt, files, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(files / "s1.safetensors", outside / "s1.safetensors")
    d = tmp_path / "idx"
    d.mkdir()
    os.symlink(files / "s1.safetensors", d / "s1.safetensors")       # a shard that is a link
    os.symlink(outside, d / "sub")                                    # a folder that is a link
    (d / "s2.safetensors").write_bytes((files / "s2.safetensors").read_bytes())
    for shard in ("s1.safetensors", "sub/s1.safetensors"):
        p = index(str(d), {"a": shard, "b": "s2.safetensors", "c": "s2.safetensors"})
        for cmd in ("ls", "load"):
            r = ckpt.run(cmd, p)
            assert r.returncode == 5, (shard, r.stderr)
            assert "resolves outside the index's folder" in r.stderr, r.stderr
    # A link that stays inside is followed.
    os.symlink("s2.safetensors", d / "link.safetensors")
    (d / "s1.safetensors").unlink()
    (d / "s1.safetensors").write_bytes((files / "s1.safetensors").read_bytes())
    p = index(str(d), {"a": "s1.safetensors", "b": "link.safetensors", "c": "link.safetensors"})
    assert digests(ckpt, p) == digests(ckpt, str(files / "m.safetensors"))


# ---------------------------------------------------------------------------------------------
# Timeouts during a transfer; refused responses abandoned at their first byte.

@pytest.mark.parametrize("cmd", ["ls", "load"])
def test_timeout_holds_against_a_trickling_server(ckpt, server, tok, cmd):
    url = server.url(tok, "trickle", "m.safetensors")
    t0 = time.monotonic()
    r = ckpt.run(cmd, "--timeout", "2", url, timeout=40)
    took = time.monotonic() - t0
    assert r.returncode == 3, r.stderr
    assert "timed out" in r.stderr, r.stderr
    assert took < 15, took


@pytest.mark.parametrize("cmd", ["ls", "load"])
def test_an_endless_200_to_a_range_is_abandoned_at_once(ckpt, server, tok, cmd):
    url = server.url(tok, "endless", "m.safetensors")
    t0 = time.monotonic()
    r = ckpt.run(cmd, "--timeout", "60", url, timeout=40)
    took = time.monotonic() - t0
    assert r.returncode == 3, r.stderr
    assert "ignores Range" in r.stderr, r.stderr
    assert took < 10, took
    # The socket buffers hold a few MiB; the body itself was not read.
    assert server.sent_to(f"/{tok}/endless/m.safetensors") < 64 << 20


# ---------------------------------------------------------------------------------------------
# Redirects: http and https only.

def test_redirect_to_ftp_is_not_followed(ckpt, server, tok):
    trap = hostile_http.FtpTrap()
    try:
        server.redirect_to = f"ftp://127.0.0.1:{trap.port}/m.safetensors"
        r = ckpt.run("ls", server.url(tok, "redirect", "m.safetensors"), timeout=30)
        time.sleep(0.3)
        assert r.returncode != 0, r.stdout
        assert trap.connections == 0, r.stderr
    finally:
        trap.stop()


# ---------------------------------------------------------------------------------------------
# Validators: every range checked against the first response's.

def test_last_modified_change_is_caught(ckpt, server, tok):
    r = ckpt.run("load", "--chunk-size", "1", server.url(tok, "lmchange", "m.safetensors"))
    assert r.returncode == 3, r.stderr
    assert "Last-Modified" in r.stderr, r.stderr


def test_a_dropped_etag_is_caught(ckpt, server, tok):
    r = ckpt.run("load", "--chunk-size", "1", server.url(tok, "dropetag", "m.safetensors"))
    assert r.returncode == 3, r.stderr
    assert "stopped sending the object's ETag" in r.stderr, r.stderr


def test_an_object_that_cannot_be_pinned_is_said_so(ckpt, server, tok, files):
    r = ckpt.run("load", "--chunk-size", "1", server.url(tok, "nopin", "m.safetensors"))
    assert "cannot be pinned" in r.stderr, r.stderr
    # A pinned object says nothing of the kind.
    r = ckpt.run("load", server.url(tok, "plain", "m.safetensors"))
    assert r.returncode == 0 and "pinned" not in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------
# A server that ignores Range.

def test_server_without_ranges_load_and_convert_download_whole(ckpt, server, tok, files, tmp_path):
    url = server.url(tok, "norange", "m.safetensors")
    want = digests(ckpt, str(files / "m.safetensors"))
    r = ckpt.run("load", "--json", "--digest", url)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["digests"] == want
    assert "ignores Range" in r.stderr and "note" in r.stderr, r.stderr
    out = str(tmp_path / "out.safetensors")
    ckpt.ok("convert", url, out)
    assert digests(ckpt, out) == want
    # ls reads a few bytes: it refuses, and says what would work.
    r = ckpt.run("ls", url)
    assert r.returncode == 3, r.stderr
    assert "ignores Range" in r.stderr and "ckpt load" in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------
# Redaction: no password, no presigned signature in any output.

SECRETS = ("PWSECRET", "SIGSECRET", "CREDSECRET")


def secret_url(server, tok, name="m.safetensors", extra=""):
    port = server.server_address[1]
    return (f"http://user:PWSECRET@127.0.0.1:{port}/{tok}/plain/{name}"
            f"?X-Amz-Signature=SIGSECRET&X-Amz-Credential=CREDSECRET{extra}")


def assert_clean(*texts):
    for t in texts:
        for s in SECRETS:
            assert s not in t, t


def test_urls_are_redacted_in_every_output(ckpt, server, tok, tmp_path):
    url = secret_url(server, tok)
    runs = [ckpt.run("info", url), ckpt.run("info", "--json", url),
            ckpt.run("verify", "--json", url), ckpt.run("verify", url),
            ckpt.run("digest", url), ckpt.run("ls", url), ckpt.run("show", url, "c")]
    for r in runs:
        assert r.returncode in (0, 10), r.stderr
        assert_clean(r.stdout, r.stderr)
    assert json.loads(runs[1].stdout)["file"].endswith("/m.safetensors?...")
    assert runs[4].stdout.splitlines()[0].endswith("/m.safetensors?...")
    d = tmp_path / "x"
    r = ckpt.run("extract", url, str(d))
    assert r.returncode == 0, r.stderr
    assert_clean(r.stdout, r.stderr, (d / "index.json").read_text())
    # Errors: a name in two shards, a missing object.
    r = ckpt.run("ls", url, secret_url(server, tok, extra="&x=2"))
    assert r.returncode == 5 and "two shards" in r.stderr, r.stderr
    assert_clean(r.stdout, r.stderr)
    r = ckpt.run("ls", secret_url(server, tok, "nope.safetensors"))
    assert r.returncode == 2, r.stderr
    assert_clean(r.stdout, r.stderr)
