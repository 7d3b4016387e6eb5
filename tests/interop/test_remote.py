"""Checkpoints read over HTTP (issue 11): nginx for real ranged GETs, a fault-injecting server
of our own (faulty_http.py) for retries and errors.

nginx starts once per session on 127.0.0.1 with a free port, serving a tmp folder; its access
log counts the requests each command makes. Tensors read over HTTP are compared with torch.load
of the local file.
"""

import json
import os
import shutil
import socket
import subprocess
import time

import pytest

import faulty_http
import helpers

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    def __init__(self, root):
        self.root = root
        self.www = os.path.join(root, "www")
        os.makedirs(self.www)
        os.makedirs(os.path.join(root, "tmp"))
        self.port = free_port()
        self.tls_port = free_port()
        self.log = os.path.join(root, "access.log")
        # A self-signed certificate for 127.0.0.1 (the HTTPS server beside the HTTP one).
        self.cert = os.path.join(root, "cert.pem")
        key = os.path.join(root, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", key, "-out", self.cert],
                       check=True, capture_output=True, timeout=60)
        conf = os.path.join(root, "nginx.conf")
        t = os.path.join(root, "tmp")
        with open(conf, "w") as f:
            # As root, nginx's workers would run as nobody and could not read pytest's tmp folder.
            user = "user root;\n" if os.geteuid() == 0 else ""
            f.write(f"""{user}daemon off;
worker_processes 2;
pid {root}/nginx.pid;
error_log {root}/error.log;
events {{ worker_connections 256; }}
http {{
  access_log {self.log};
  client_body_temp_path {t}; proxy_temp_path {t}; fastcgi_temp_path {t};
  uwsgi_temp_path {t}; scgi_temp_path {t};
  sendfile on;
  keepalive_requests 100000;
  server {{ listen 127.0.0.1:{self.port}; root {self.www}; }}
  server {{ listen 127.0.0.1:{self.tls_port} ssl; root {self.www};
           ssl_certificate {self.cert}; ssl_certificate_key {key}; }}
}}
""")
        self.proc = subprocess.Popen([NGINX, "-c", conf, "-p", root, "-e", f"{root}/error.log"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    err = self.proc.stderr.read().decode(errors="replace") if self.proc.poll() is not None else ""
                    self.stop()
                    raise RuntimeError(f"nginx did not start: {err}")
                time.sleep(0.05)

    def url(self, name):
        return f"http://127.0.0.1:{self.port}/{name}"

    def https_url(self, name):
        return f"https://127.0.0.1:{self.tls_port}/{name}"

    def put(self, src, name):
        shutil.copyfile(src, os.path.join(self.www, name))
        return self.url(name)

    def requests(self):
        if not os.path.exists(self.log):
            return 0
        with open(self.log) as f:
            return sum(1 for _ in f)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture(scope="session")
def nginx(tmp_path_factory):
    if not os.path.exists(NGINX):
        pytest.skip("nginx is not installed (Debian package nginx)")
    try:
        n = Nginx(str(tmp_path_factory.mktemp("nginx")))
    except (RuntimeError, OSError) as e:
        pytest.skip(f"nginx cannot run here: {e}")
    yield n
    n.stop()


@pytest.fixture(scope="session")
def model(tmp_path_factory, ckpt):
    """A torch zip, and its safetensors and tensorizer conversions (local paths)."""
    import torch
    d = tmp_path_factory.mktemp("remote-model")
    g = torch.Generator().manual_seed(11)
    sd = {f"layer{i}.weight": torch.randn(64, 33 + i, generator=g) for i in range(40)}
    sd["emb"] = torch.randn(3000, 256, generator=g)  # ~3 MB: several ranges at 1 MiB chunks
    sd["ids"] = torch.arange(1000, dtype=torch.int64)
    sd["half"] = torch.randn(17, 5, generator=g).half()
    pt = str(d / "m.pt")
    torch.save(sd, pt)
    st, tz = str(d / "m.safetensors"), str(d / "m.tensors")
    ckpt.ok("convert", pt, st)
    ckpt.ok("convert", pt, tz)
    return {"pt": pt, "safetensors": st, "tensors": tz, "sd": sd}


def digests(ckpt, *args, timeout=60):
    """`ckpt load --json --digest ...`: {tensor: digest} (the load's bytes, hashed)."""
    import json
    r = ckpt.run("load", "--json", "--digest", *args, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["digests"]


def assert_same(a, b):
    import torch
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("fmt", ["pt", "safetensors", "tensors"])
def test_open_costs_at_most_three_requests(ckpt, nginx, model, fmt):
    url = nginx.put(model[fmt], f"open.{fmt}")
    local = ckpt.json("ls", model[fmt], "--json")
    before = nginx.requests()
    remote = ckpt.json("ls", url, "--json")
    used = nginx.requests() - before
    assert 1 <= used <= 3, f"ls {fmt} over HTTP made {used} requests"
    assert remote == local or [t["name"] for t in remote["tensors"]] == [t["name"] for t in local["tensors"]]


@pytest.mark.parametrize("fmt", ["pt", "safetensors", "tensors"])
def test_load_over_http_matches_torch(ckpt, nginx, model, fmt, tmp_path):
    import torch
    url = nginx.put(model[fmt], f"load.{fmt}")
    out = str(tmp_path / "out.pt")
    ckpt.ok("convert", "--chunk-size", "1", "--connections", "4", url, out)
    assert_same(helpers.torch_load(out), model["sd"])
    # Eager and streaming loads read the same bytes as from the local file.
    local = digests(ckpt, model[fmt])
    for mode in ("eager", "stream"):
        assert digests(ckpt, "--mode", mode, "--chunk-size", "1", url) == local, mode


def test_reading_commands_take_urls(ckpt, nginx, model, tmp_path):
    url = nginx.put(model["pt"], "cmds.pt")
    ckpt.ok("info", url)
    ckpt.ok("verify", url)
    r = ckpt.ok("show", url, "ids")
    assert "999" in r.stdout
    assert ckpt.ok("digest", url).stdout == ckpt.ok("digest", model["pt"]).stdout.replace(model["pt"], url)
    d = str(tmp_path / "x")
    ckpt.ok("extract", url, d)
    assert len(os.listdir(d)) >= len(model["sd"])
    # A remote object against a local manifest.
    manifest = str(tmp_path / "m.sha256")
    ckpt.ok("digest", model["pt"], "-o", manifest)
    assert "OK: " in ckpt.ok("verify", url, "--digests", manifest).stdout
    # bench measures local files against this machine's limits: a URL is a usage error.
    r = ckpt.run("bench", url)
    assert r.returncode == 64 and "ckpt load URL" in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------
# tensorizer over HTTP: the per-tensor headers sit between the tensors' data, so they are read
# lazily, by the first decode or verify that needs them (docs/formats.md, "Over the network").


@pytest.fixture(scope="session")
def spread(tmp_path_factory, ckpt):
    """A tensorizer file whose headers lie 2 MiB apart (24 tensors of 2 MiB, small ones between),
    a copy with one data byte flipped, and the same tensors encrypted with a key and a password."""
    import torch
    d = tmp_path_factory.mktemp("remote-spread")
    g = torch.Generator().manual_seed(24)
    sd = {"embed.bias": torch.randn(10, generator=g)}
    for i in range(24):
        sd[f"block{i}.weight"] = torch.randn(512, 1024, generator=g)  # 2 MiB
        if i % 6 == 0:
            sd[f"block{i}.scale"] = torch.randn(7, generator=g).half()
    sd["ids"] = torch.arange(100, dtype=torch.int64)
    pt = str(d / "spread.pt")
    torch.save(sd, pt)
    tz = str(d / "spread.tensors")
    ckpt.ok("convert", pt, tz)
    # One byte of block5.weight's data flipped: the hashes no longer match.
    bad = str(d / "flipped.tensors")
    shutil.copyfile(tz, bad)
    off = next(t["offset"] for t in ckpt.json("ls", tz, "--json")["tensors"]
               if t["name"] == "block5.weight")
    with open(bad, "r+b") as f:
        f.seek(off + 1000)
        b = f.read(1)
        f.seek(off + 1000)
        f.write(bytes([b[0] ^ 0x10]))
    key = str(d / "spread.key")  # written by convert (a new random key, mode 0600)
    enc_key = str(d / "key.tensors")
    ckpt.ok("convert", pt, enc_key, "--encrypt-key", key)
    pw = d / "spread.password"
    pw.write_text("lazy headers, eager keys\n")
    pw.chmod(0o600)
    enc_pw = str(d / "password.tensors")
    ckpt.ok("convert", pt, enc_pw, "--encrypt-password-file", str(pw))
    return {"pt": pt, "tensors": tz, "flipped": bad, "key": key, "enc_key": enc_key,
            "password": str(pw), "enc_pw": enc_pw, "sd": sd}


def test_tensorizer_open_reads_no_headers(ckpt, nginx, spread):
    url = nginx.put(spread["tensors"], "spread.tensors")
    local = ckpt.json("ls", spread["tensors"], "--json")
    before = nginx.requests()
    remote = ckpt.json("ls", url, "--json")
    used = nginx.requests() - before
    assert 1 <= used <= 3, f"ls of a tensorizer file with spread headers made {used} requests"
    assert remote == local
    before = nginx.requests()
    ckpt.ok("info", url)
    used = nginx.requests() - before
    assert 1 <= used <= 3, f"info made {used} requests"
    # Encrypted: names, dtypes and shapes need neither key nor headers.
    enc = nginx.put(spread["enc_key"], "spread-key.tensors")
    before = nginx.requests()
    assert ckpt.json("ls", enc, "--json") == ckpt.json("ls", spread["enc_key"], "--json")
    assert nginx.requests() - before <= 3


def test_tensorizer_loads_over_http_with_lazy_headers(ckpt, nginx, spread):
    url = nginx.put(spread["tensors"], "spread-load.tensors")
    local = digests(ckpt, spread["tensors"])
    assert local == digests(ckpt, spread["pt"])
    for mode in ("eager", "stream"):
        assert digests(ckpt, "--mode", mode, url) == local, mode
        assert digests(ckpt, "--mode", mode, "--verify", url) == local, mode


def test_tensorizer_verify_over_http(ckpt, nginx, spread):
    url = nginx.put(spread["tensors"], "spread-verify.tensors")
    r = ckpt.ok("verify", url)
    assert r.stdout.startswith("OK"), r.stdout
    bad = nginx.put(spread["flipped"], "spread-flipped.tensors")
    local = ckpt.run("verify", spread["flipped"])
    assert local.returncode == 5 and "block5.weight" in local.stderr, local.stderr
    r = ckpt.run("verify", bad)
    assert r.returncode == 5, r.stderr
    assert "block5.weight" in r.stderr, r.stderr
    # A verified load checks the hashes too (the headers are read at the first tensor); a plain
    # load does not look at them.
    for mode in ("eager", "stream"):
        r = ckpt.run("load", "--mode", mode, "--verify", bad)
        assert r.returncode == 5, f"{mode}: {r.stderr}"
        assert "block5.weight" in r.stderr, r.stderr
    ckpt.ok("load", bad)


@pytest.mark.parametrize("how", ["key", "password"])
def test_encrypted_tensorizer_over_http(ckpt, nginx, spread, how):
    path = spread["enc_key" if how == "key" else "enc_pw"]
    opt = ["--decrypt-key", spread["key"]] if how == "key" else \
        ["--decrypt-password-file", spread["password"]]
    url = nginx.put(path, f"spread-enc-{how}.tensors")
    want = digests(ckpt, spread["pt"])
    assert digests(ckpt, *opt, path) == want
    for mode in ("eager", "stream"):
        assert digests(ckpt, "--mode", mode, *opt, url) == want, mode
    assert ckpt.ok("verify", *opt, url).stdout.startswith("OK")
    # Without the key: listing works, reading the data is an auth error (exit 9).
    r = ckpt.run("load", url)
    assert r.returncode == 9, r.stderr


def test_large_load_uses_few_large_requests(ckpt, nginx, model):
    url = nginx.put(model["pt"], "big.pt")
    size = os.path.getsize(model["pt"])
    before = nginx.requests()
    ckpt.ok("load", "--chunk-size", "1", url)
    used = nginx.requests() - before
    # open (<= 3) + one request per 1 MiB chunk of data
    assert used <= 3 + size // (1 << 20) + 2, used


def test_https_verifies_the_certificate(ckpt, nginx, model):
    nginx.put(model["safetensors"], "tls.safetensors")
    url = nginx.https_url("tls.safetensors")
    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE")}
    # an unknown issuer is refused: never read without verification
    r = subprocess.run([ckpt.path, "ls", url], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 3 and "127.0.0.1" in r.stderr, r.stderr
    # trusted through --ca-bundle, or the environment as curl and the AWS tools take it
    want = digests(ckpt, model["safetensors"])
    assert digests(ckpt, url, "--ca-bundle", nginx.cert) == want
    r = subprocess.run([ckpt.path, "load", "--json", "--digest", url], capture_output=True,
                       text=True, timeout=60, env={**env, "AWS_CA_BUNDLE": nginx.cert})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["digests"] == want


def test_missing_object_is_not_found(ckpt, nginx):
    r = ckpt.run("ls", nginx.url("nope.pt"))
    assert r.returncode == 2, r.stderr
    assert "nope.pt" in r.stderr and "404" in r.stderr


def test_credentials_never_printed(ckpt, nginx):
    r = ckpt.run("ls", f"http://user:hunter2secret@127.0.0.1:{nginx.port}/nope.pt?X-Amz-Signature=abcdef0123")
    assert r.returncode == 2
    assert "hunter2secret" not in r.stderr and "abcdef0123" not in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------
# Faults


@pytest.fixture(scope="session")
def faulty(model):
    s = faulty_http.FaultyServer(os.path.dirname(model["pt"]))
    yield s
    s.stop()


_token = [0]


def fault_url(faulty, fault, k, name="m.pt"):
    _token[0] += 1
    path = f"/t{_token[0]}/{fault}{k}/{name}"
    return faulty.base + path, path


@pytest.mark.parametrize("fault", ["slow", "cut", "reset"])
def test_faults_are_retried(ckpt, faulty, model, fault):
    # Request 1 opens; request 2 is the first range of the load.
    url, path = fault_url(faulty, fault, 2)
    t0 = time.monotonic()
    assert digests(ckpt, "--chunk-size", "1", url) == digests(ckpt, model["pt"])
    reqs = faulty.requests_for(path)
    assert len(reqs) >= 3
    if fault == "slow":
        assert time.monotonic() - t0 >= 1.0  # Retry-After: 1 honoured
    if fault == "cut":
        # The cut range resumed from the byte it reached, not from its start.
        starts = [int(x.split("=")[1].split("-")[0]) for x in reqs[1:] if x and not x.startswith("bytes=-")]
        assert len(set(starts)) == len(starts) or any(s % (1 << 20) for s in starts), reqs


def test_stall_times_out_and_resumes(ckpt, faulty, model):
    url, path = fault_url(faulty, "stall", 2)
    t0 = time.monotonic()
    got = digests(ckpt, "--stall-timeout", "2", url)
    assert 1.5 <= time.monotonic() - t0 < 30
    assert got == digests(ckpt, model["pt"])


def test_server_down_fails_clearly(ckpt, faulty):
    url, path = fault_url(faulty, "down", 2)
    t0 = time.monotonic()
    r = ckpt.run("load", "--retries", "3", url, timeout=60)
    assert r.returncode == 3, r.stderr
    assert time.monotonic() - t0 < 30
    assert path in r.stderr and "HTTP 503" in r.stderr and "bytes " in r.stderr and "4 attempts" in r.stderr, r.stderr
    assert len(faulty.requests_for(path)) == 1 + 4


def test_object_changed_mid_load(ckpt, faulty):
    url, path = fault_url(faulty, "etag", 2)
    r = ckpt.run("load", url, timeout=60)
    assert r.returncode == 3, r.stderr
    assert "changed" in r.stderr and "412" in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------
# S3: a real Ceph RADOS Gateway (SigV4 checked), started once per session (~12 s; the `rgw`
# fixture is in conftest.py and s3_env in helpers.py, shared with the DCP tests).


def run_env(ckpt, env, *args, timeout=60):
    return subprocess.run([ckpt.path, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, errors="replace")


@pytest.mark.parametrize("fmt", ["pt", "safetensors", "tensors"])
def test_s3_load_matches_torch(ckpt, rgw, model, fmt, tmp_path):
    import json
    import torch
    key = f"models/m (1)~+{fmt}.{fmt}"  # a key that needs percent-encoding
    from urllib.parse import quote
    rgw.put_file("/ckpt/" + quote(key, safe="/-._~"), model[fmt])
    url = f"s3://ckpt/{key}"
    env = helpers.s3_env(rgw)
    r = run_env(ckpt, env, "ls", "--json", url)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["tensors"]) == len(model["sd"])
    r = run_env(ckpt, env, "load", "--json", "--digest", "--chunk-size", "1", url)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["digests"] == digests(ckpt, model[fmt])
    out = str(tmp_path / "o.pt")
    r = run_env(ckpt, env, "convert", url, out)
    assert r.returncode == 0, r.stderr
    assert_same(helpers.torch_load(out), model["sd"])
    assert run_env(ckpt, env, "verify", url).returncode in (0, 10)


def test_s3_wrong_secret_is_auth_error(ckpt, rgw, model):
    rgw.put_file("/ckpt/auth.pt", model["pt"])
    env = helpers.s3_env(rgw, AWS_SECRET_ACCESS_KEY="wrong-secret-value-xyz")
    r = run_env(ckpt, env, "ls", "s3://ckpt/auth.pt")
    assert r.returncode == 9, r.stderr
    assert "s3://ckpt/auth.pt" in r.stderr and "403" in r.stderr, r.stderr
    assert "wrong-secret-value-xyz" not in r.stderr + r.stdout


def test_s3_profile_and_anonymous(ckpt, rgw, model, tmp_path):
    rgw.put_file("/ckpt/private.pt", model["pt"])
    rgw.put_file("/ckpt/public.pt", model["pt"], public=True)
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = nobody\naws_secret_access_key = x\n\n"
                     f"[ckpt]\naws_access_key_id = {rgw.access_key}\n"
                     f"aws_secret_access_key = {rgw.secret_key}\n")
    config = tmp_path / "config"
    config.write_text(f"[profile ckpt]\nregion = us-east-1\nendpoint_url = {rgw.endpoint}\n")
    env = helpers.s3_env(rgw, AWS_ACCESS_KEY_ID=None, AWS_SECRET_ACCESS_KEY=None, AWS_ENDPOINT_URL=None,
                 AWS_PROFILE="ckpt", AWS_SHARED_CREDENTIALS_FILE=str(creds),
                 AWS_CONFIG_FILE=str(config), HOME=str(tmp_path))
    r = run_env(ckpt, env, "ls", "s3://ckpt/private.pt")
    assert r.returncode == 0, r.stderr
    # No credentials at all: unsigned requests; a public object reads, a private one is refused.
    anon = helpers.s3_env(rgw, AWS_ACCESS_KEY_ID=None, AWS_SECRET_ACCESS_KEY=None, HOME=str(tmp_path / "none"))
    r = run_env(ckpt, anon, "ls", "s3://ckpt/public.pt")
    assert r.returncode == 0, r.stderr
    r = run_env(ckpt, anon, "ls", "s3://ckpt/private.pt")
    assert r.returncode == 9, r.stderr
    r = run_env(ckpt, env, "ls", "s3://ckpt/missing.pt")
    assert r.returncode == 2, r.stderr


@pytest.fixture(scope="session")
def big_model(tmp_path_factory):
    """~13 MB: three 5 MiB parts."""
    import torch
    d = tmp_path_factory.mktemp("remote-big")
    g = torch.Generator().manual_seed(5)
    sd = {"w": torch.randn(3_200_000, generator=g), "b": torch.randn(100, generator=g),
          "i": torch.arange(10, dtype=torch.int32)}
    pt = str(d / "big.pt")
    torch.save(sd, pt)
    return {"pt": pt, "sd": sd}


@pytest.mark.parametrize("fmt", ["safetensors", "pt", "tensors"])
def test_s3_upload_multipart(ckpt, rgw, big_model, fmt, tmp_path):
    import torch
    url = f"s3://ckpt/up/out.{fmt}"
    env = helpers.s3_env(rgw)
    r = run_env(ckpt, env, "convert", "--chunk-size", "5", "--connections", "2", big_model["pt"], url)
    assert r.returncode == 0, r.stderr
    # The object is there, whole: ckpt reads it back, and so does torch (pt) after a plain GET.
    r = run_env(ckpt, env, "load", "--json", "--digest", url)
    assert r.returncode == 0, r.stderr
    local = str(tmp_path / f"local.{fmt}")
    ckpt.ok("convert", big_model["pt"], local)
    import json
    assert json.loads(r.stdout)["digests"] == digests(ckpt, local)
    status, body = rgw.curl("GET", f"/ckpt/up/out.{fmt}")
    assert status == 200
    if fmt == "pt":
        p = tmp_path / "got.pt"
        p.write_bytes(body)
        assert_same(helpers.torch_load(str(p)), big_model["sd"])
    else:
        assert body == open(local, "rb").read()
    # Multipart: the ETag of a completed multipart upload ends in -<parts>.
    if fmt != "tensors":
        out = subprocess.run(["curl", "-s", "-I", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user",
                              f"{rgw.access_key}:{rgw.secret_key}", "-H",
                              "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                              f"{rgw.endpoint}/ckpt/up/out.{fmt}"], capture_output=True, text=True)
        assert '-3"' in out.stdout or "-3\"" in out.stdout, out.stdout


def test_s3_small_upload_and_failures(ckpt, rgw, model):
    env = helpers.s3_env(rgw)
    r = run_env(ckpt, env, "convert", model["pt"], "s3://ckpt/small.safetensors")
    assert r.returncode == 0, r.stderr
    assert rgw.curl("GET", "/ckpt/small.safetensors")[0] == 200
    # No such bucket: a clean error, nothing written.
    r = run_env(ckpt, env, "convert", model["pt"], "s3://no-such-bucket/x.safetensors")
    assert r.returncode == 2, r.stderr
    assert "s3://no-such-bucket/x.safetensors" in r.stderr
    # A wrong secret: auth error, no object, the secret never printed.
    bad = helpers.s3_env(rgw, AWS_SECRET_ACCESS_KEY="not-the-secret-42")
    r = run_env(ckpt, bad, "convert", model["pt"], "s3://ckpt/denied.safetensors")
    assert r.returncode == 9, r.stderr
    assert "not-the-secret-42" not in r.stderr
    assert rgw.curl("GET", "/ckpt/denied.safetensors", check=False)[0] == 404
    # No multipart upload was left behind by any of these.
    status, body = rgw.curl("GET", "/ckpt?uploads=")
    assert b"<Upload>" not in body, body[:500]


def test_sharded_checkpoint_over_http(ckpt, nginx, model, tmp_path):
    d = tmp_path / "sh"
    d.mkdir()
    ckpt.ok("convert", "--max-shard-size", "1MB", model["pt"], str(d / "model.safetensors"))
    os.makedirs(os.path.join(nginx.www, "sh"), exist_ok=True)
    for f in os.listdir(d):
        shutil.copyfile(d / f, os.path.join(nginx.www, "sh", f))
    url = nginx.url("sh/model.safetensors.index.json")
    assert digests(ckpt, url) == digests(ckpt, str(d / "model.safetensors.index.json"))


def test_s3_upload_interrupted_is_aborted(ckpt, rgw, tmp_path):
    import signal
    import torch
    src = str(tmp_path / "huge.pt")
    torch.save({"w": torch.ones(96 * 1024 * 1024)}, src)  # 384 MiB: a few seconds of upload
    env = helpers.s3_env(rgw)
    p = subprocess.Popen([ckpt.path, "convert", "--chunk-size", "8", "--connections", "2", src,
                          "s3://ckpt/interrupted.safetensors"], env=env, stderr=subprocess.PIPE,
                         text=True)
    # Wait until the multipart upload has started, then interrupt.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and p.poll() is None:
        if b"<Upload>" in rgw.curl("GET", "/ckpt?uploads=")[1]:
            break
        time.sleep(0.05)
    if p.poll() is not None:
        pytest.skip("the upload ended before it could be interrupted")
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "aborting the upload" in err
    assert rgw.curl("GET", "/ckpt/interrupted.safetensors", check=False)[0] == 404
    assert b"<Upload>" not in rgw.curl("GET", "/ckpt?uploads=")[1]
