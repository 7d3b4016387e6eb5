"""Small hostile HTTP servers for the remote hardening tests: threads in the pytest process.

A HostileServer serves the files of one folder. The path says how: /<token>/<mode>/<name>
(a query string is ignored; the token keeps each test's request counts apart). The k-th request
for a path is counted from 1 (the opening suffix range is request 1).

  plain     ranges, a strong ETag and a Last-Modified (and If-Match honoured)
  norange   every request gets 200 and the whole object, Last-Modified only (python's http.server)
  trickle   ranges, but every body at 2 KiB/s
  endless   200 to every request, no Content-Length, and a body that never ends
  nopin     ranges, neither ETag nor Last-Modified; from request 2 on the object's bytes change
            (same length)
  lmchange  ranges, no ETag; from request 2 on the Last-Modified and the bytes change (the
            conditions are ignored)
  dropetag  ranges; request 1 has an ETag, later ones none, with changed bytes (If-Match ignored)
  redirect  302 to `redirect_to`

Every request is recorded (path, Range) in `log`; `sent` counts the body bytes written per path.
A FtpTrap is a listening socket that counts the connections made to it (a redirect target).
"""

import email.utils
import http.server
import os
import re
import socket
import threading
import time

import http_util

LM1 = email.utils.formatdate(1700000000, usegmt=True)
LM2 = email.utils.formatdate(1700086400, usegmt=True)


def changed(data):
    """The object's second version: the same length, 4 KiB in its middle flipped."""
    b = bytearray(data)
    mid = len(b) // 2
    for i in range(mid, min(len(b), mid + 4096)):
        b[i] ^= 0x5A
    return bytes(b)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        srv = self.server
        path = self.path.split("?", 1)[0]
        m = re.match(r"^/([^/]+)/([a-z]+)/(.+)$", path)
        if not m:
            return self._plain(404, b"no")
        mode, name = m.group(2), m.group(3)
        with srv.lock:
            srv.counts[path] = srv.counts.get(path, 0) + 1
            n = srv.counts[path]
            srv.log.append((path, self.headers.get("Range")))
        if mode == "redirect":
            return self._plain(302, b"", {"Location": srv.redirect_to})
        file = os.path.join(srv.folder, name)
        if "/" in name or not os.path.isfile(file):
            return self._plain(404, b"<Error><Code>NoSuchKey</Code></Error>")
        with open(file, "rb") as f:
            data = f.read()
        headers = {}
        if mode in ("plain", "trickle", "dropetag"):
            headers["ETag"] = '"v1-%d"' % len(data)
        if mode in ("plain", "trickle", "dropetag", "norange"):
            headers["Last-Modified"] = LM1
        if mode == "nopin" and n >= 2:
            data = changed(data)
        if mode == "lmchange":
            headers["Last-Modified"] = LM1 if n == 1 else LM2
            if n >= 2:
                data = changed(data)
        if mode == "dropetag" and n >= 2:
            del headers["ETag"]
            data = changed(data)
        if mode == "plain":
            im = self.headers.get("If-Match")
            if im is not None and im != headers["ETag"]:
                return self._plain(412, b"<Error><Code>PreconditionFailed</Code></Error>")
        if mode == "endless":
            return self._endless(path)
        status, a, b = 200, 0, len(data) - 1
        if mode != "norange":
            r = http_util.send_range_or_error(self, self.headers.get("Range"), data)
            if r is None:
                return
            status, a, b = r
        body = data[a:b + 1]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, len(data)))
        self.end_headers()
        if mode == "trickle":
            return self._trickle(path, body)
        self.wfile.write(body)
        self._sent(path, len(body))

    def _sent(self, path, n):
        with self.server.lock:
            self.server.sent[path] = self.server.sent.get(path, 0) + n

    def _trickle(self, path, body):
        deadline = time.monotonic() + 120
        try:
            for i in range(0, len(body), 1024):
                if time.monotonic() > deadline or self.server.stopping:
                    break
                self.wfile.write(body[i:i + 1024])
                self.wfile.flush()
                self._sent(path, len(body[i:i + 1024]))
                time.sleep(0.5)
        except OSError:
            pass
        self.close_connection = True

    def _endless(self, path):
        self.send_response(200)
        self.send_header("Connection", "close")
        self.end_headers()
        chunk = b"\0" * 65536
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline and not self.server.stopping:
                self.wfile.write(chunk)
                self._sent(path, len(chunk))
        except OSError:
            pass
        self.close_connection = True

    def _plain(self, status, body, headers=None):
        http_util.send_plain(self, status, body, headers)


class HostileServer(http_util.FolderServer):
    def __init__(self, folder):
        self.sent = {}
        self.redirect_to = ""
        super().__init__(folder, Handler)

    def handle_error(self, request, client_address):
        pass  # a client that hangs up early is what these tests make ckpt do

    def url(self, token, mode, name):
        return f"{self.base}/{token}/{mode}/{name}"

    def requests_under(self, prefix):
        """Requests whose path starts with `prefix` (a token: "/<token>/")."""
        with self.lock:
            return [p for p, _ in self.log if p.startswith(prefix)]

    def sent_to(self, path):
        with self.lock:
            return self.sent.get(path, 0)


class FtpTrap:
    """A listening socket that counts connections (and greets like an FTP server)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopping:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            try:
                c.sendall(b"220 trap\r\n")
                c.close()
            except OSError:
                pass

    def stop(self):
        self.stopping = True
        self.thread.join(2)
        self.sock.close()
