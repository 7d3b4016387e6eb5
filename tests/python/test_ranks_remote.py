"""Loading across ranks from a server (ckpt.load(url, plan=..., group=...)) under torchrun with
gloo: the bytes nginx (HTTP) and Ceph RGW (S3) send, summed from their own access logs, are the
model's tensor bytes once across the group plus each rank's open (its header reads, counted from
one process's open and bounded apart): not n times the model, with a Replicate plan (each rank
reads 1/n and the group all-gathers) and with a Shard plan (each rank reads its part)."""

import json
import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("torch.distributed.tensor")

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
# "GET /path HTTP/1.1" STATUS BYTES: nginx's combined format (body bytes) and RGW's beast
# frontend line (bytes sent and received; a GET receives none).
LINE = re.compile(r'"(?:GET|HEAD) (\S+) HTTP/[\d.]+" (\d{3}) (\d+)')


def model():
    g = torch.Generator().manual_seed(3)
    sd = {f"layers.{i}.weight": torch.randn(256, 4096, generator=g) for i in range(5)}
    sd["emb.weight"] = torch.randn(512, 1024, generator=g).to(torch.bfloat16)
    sd["norm.bias"] = torch.randn(4096, generator=g)
    return sd


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    from safetensors.torch import save_file
    p = tmp_path_factory.mktemp("ranks_remote") / "m.safetensors"
    save_file(model(), str(p))
    return str(p)


def s3_env(rgw):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=rgw.endpoint, AWS_ACCESS_KEY_ID=rgw.access_key,
               AWS_SECRET_ACCESS_KEY=rgw.secret_key, AWS_REGION="us-east-1")
    return env


def sent(log, key):
    """Bytes the server's log says it sent for requests of paths that end with `key`."""
    total = 0
    with open(log, errors="replace") as f:
        for line in f:
            m = LINE.search(line)
            if m and m.group(1).endswith("/" + key):
                total += int(m.group(3))
    return total


def run(tmp_path, n, spec, built_path, env):
    (tmp_path / "cases.json").write_text(json.dumps(spec))
    env = dict(env, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([built_path, os.environ.get("PYTHONPATH", "")]))
    cmd = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone",
           "--nproc-per-node", str(n), os.path.join(HERE, "ranks_remote_worker.py"), str(tmp_path)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    for rank in range(n):
        p = tmp_path / f"remote.{rank}.json"
        assert p.exists(), f"rank {rank} wrote nothing ({r.returncode}):\n{r.stderr[-4000:]}"
        for url, bad in json.loads(p.read_text()).items():
            assert bad == [], (rank, url, bad)


def check(log_path, keys, n, tag):
    model_bytes = sum(t.numel() * t.element_size() for t in model().values())
    opened = sent(log_path(), f"open-{tag}.safetensors")
    # One process's open: the header and the first block (1 MiB) of the file, not its data.
    assert 0 < opened <= 2 * MIB, opened
    for plan, key in keys.items():
        total = sent(log_path(), key)
        print(f"{key}: sent {total} for a model of {model_bytes} ({total / model_bytes:.3f}x), "
              f"one open {opened}")
        # Every tensor byte reached some rank once; beyond that only the n opens.
        assert model_bytes <= total <= model_bytes + n * opened, (plan, total, model_bytes, opened)


@pytest.mark.parametrize("n", [2, 4])
def test_nginx_sends_each_byte_once(nginx, ref, n, tmp_path, built_path):
    keys = {plan: f"{plan}-{n}.safetensors" for plan in ("replicate", "shard")}
    for key in list(keys.values()) + [f"open-{n}.safetensors"]:
        nginx.put(ref, key)
    spec = {"ref": ref, "open": nginx.url(f"open-{n}.safetensors"),
            "cases": [{"url": nginx.url(k), "plan": p} for p, k in keys.items()]}
    run(tmp_path, n, spec, built_path, os.environ)
    check(lambda: nginx.log, keys, n, n)


@pytest.mark.parametrize("n", [2, 4])
def test_rgw_sends_each_byte_once(rgw, ref, n, tmp_path, built_path):
    keys = {plan: f"{plan}-{n}.safetensors" for plan in ("replicate", "shard")}
    for key in list(keys.values()) + [f"open-{n}.safetensors"]:
        rgw.put_file(f"/ckpt/ranks/{key}", ref)
    spec = {"ref": ref, "open": f"s3://ckpt/ranks/open-{n}.safetensors",
            "cases": [{"url": f"s3://ckpt/ranks/{k}", "plan": p} for p, k in keys.items()]}
    run(tmp_path, n, spec, built_path, s3_env(rgw))
    rgw.flush_log()
    check(lambda: rgw.log, keys, n, n)
