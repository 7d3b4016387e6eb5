"""A single-node Ceph RADOS Gateway (S3) on 127.0.0.1 for the tests: one monitor, one memstore
OSD, one radosgw, all in a folder of their own (facts: ../shared/remote.md). Start ~12 s.

    g = Rgw(folder); g.endpoint; g.access_key; g.secret_key; g.stop()
"""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid


# The gateway, its daemons and the tools that talk to them are not what is tested: a sanitizer
# runtime preloaded into the test process (make python-asan's LD_PRELOAD) is not passed on to
# them (Ceph's daemons with ASan preloaded did not answer a bucket PUT within 120 s).
SERVER_ENV = {k: v for k, v in os.environ.items()
              if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rgw:
    access_key = "CKPTTESTACCESSKEY01"
    secret_key = "ckpt/test+Secret/Key/0123456789abcdefghij"

    def __init__(self, root):
        for tool in ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph-authtool",
                     "monmaptool", "ceph"):
            if not shutil.which(tool):
                raise RuntimeError(f"{tool} is not installed (Debian radosgw ceph-mon ceph-osd)")
        self.root = root
        self.procs = []
        self.mon_port, self.rgw_port = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{self.rgw_port}"
        # The gateway's log: the beast frontend writes a line per request at debug level 1
        # ("GET /bucket/key HTTP/1.1" STATUS BYTES ... bytes=RANGE), asynchronously: flush_log().
        self.log = os.path.join(root, "log", "client.rgw.a.log")
        fsid = str(uuid.uuid4())
        for d in ("mon/ceph-a", "osd/ceph-0", "run", "log"):
            os.makedirs(os.path.join(root, d), exist_ok=True)
        self.conf = os.path.join(root, "ceph.conf")
        with open(self.conf, "w") as f:
            f.write(f"""[global]
fsid = {fsid}
mon host = v1:127.0.0.1:{self.mon_port}
auth cluster required = none
auth service required = none
auth client required = none
ms bind msgr2 = false
osd objectstore = memstore
memstore device bytes = 4294967296
osd pool default size = 1
mon allow pool size one = true
osd pool default pg num = 8
mon max pg per osd = 1000
osd crush chooseleaf type = 0
run dir = {root}/run
log file = {root}/log/$name.log
admin socket = {root}/run/$name.asok
mon data = {root}/mon/$cluster-$id
osd data = {root}/osd/$cluster-$id
keyring = {root}/keyring
rgw data = {root}/rgw
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:{self.rgw_port}
debug rgw = 1/5
""")
        c = ["-c", self.conf]
        try:
            self._run(["ceph-authtool", "--create-keyring", f"{root}/keyring", "--gen-key", "-n", "mon.",
                       "--cap", "mon", "allow *"])
            self._run(["monmaptool", "--create", "--addv", "a", f"v1:127.0.0.1:{self.mon_port}",
                       "--fsid", fsid, f"{root}/monmap"])
            self._run(["ceph-mon", *c, "--mkfs", "-i", "a", "--monmap", f"{root}/monmap",
                       "--keyring", f"{root}/keyring"])
            self._spawn(["ceph-mon", *c, "-i", "a", "-f"])
            # The monitor takes a moment to answer: retry for up to 30 s.
            deadline = time.monotonic() + 30
            while True:
                try:
                    self._run(["ceph", *c, "osd", "create"], timeout=30)
                    break
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            self._run(["ceph-osd", *c, "-i", "0", "--mkfs"], timeout=60)
            self._spawn(["ceph-osd", *c, "-i", "0", "-f"])
            self._run(["ceph", *c, "osd", "crush", "add", "osd.0", "1.0", "host=localhost",
                       "root=default"], timeout=60)
            self._spawn(["radosgw", *c, "-n", "client.rgw.a", "-f"])
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(self.endpoint, timeout=2).read()
                    break
                except urllib.error.HTTPError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("radosgw did not answer within 60 s")
                    for p in self.procs:
                        if p.poll() is not None:
                            raise RuntimeError(f"{p.args[0]} exited {p.returncode}")
                    time.sleep(0.3)
            self._run(["radosgw-admin", *c, "-n", "client.rgw.a", "user", "create", "--uid=ckpt",
                       "--display-name=ckpt", f"--access-key={self.access_key}",
                       f"--secret={self.secret_key}"], timeout=60)
        except BaseException:
            self.stop()
            raise

    def curl(self, method, path, *args, check=True):
        """A signed request with the curl tool: (status, body)."""
        cmd = ["curl", "-s", "-S", "-X", method, "--aws-sigv4", "aws:amz:us-east-1:s3",
               "--user", f"{self.access_key}:{self.secret_key}",
               "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-o", "-", "-w", "\n%{http_code}",
               *args, self.endpoint + path]
        r = subprocess.run(cmd, capture_output=True, timeout=120, env=SERVER_ENV)
        body, _, code = r.stdout.rpartition(b"\n")
        status = int(code or 0)
        if check and not 200 <= status < 300:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {body[:300]!r}")
        return status, body

    def flush_log(self):
        """Writes out what the gateway logged so far (its admin socket's `log flush`)."""
        self._run(["ceph", "--admin-daemon", f"{self.root}/run/client.rgw.a.asok", "log", "flush"])

    def put_file(self, path, local, public=False):
        extra = ["-H", "x-amz-acl: public-read"] if public else []
        return self.curl("PUT", path, "-T", local, *extra)

    def _run(self, cmd, timeout=30):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=SERVER_ENV)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:3])}... exited {r.returncode}: {r.stderr[-500:]}")
        return r

    def _spawn(self, cmd):
        self.procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           env=SERVER_ENV))

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(3)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.procs = []
