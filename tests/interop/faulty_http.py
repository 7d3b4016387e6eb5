"""A small HTTP server that serves files from a folder with ranges and injects faults.

The path says what goes wrong: /<token>/<fault><k>/<name> serves <folder>/<name>, and the k-th
request for that path (counted from 1; the opening suffix range is request 1) gets <fault>:

  ok        nothing
  slow      503 SlowDown with Retry-After: 1
  down      503 on every request from the k-th on (a server that stays down)
  cut       the headers promise the range, half the body comes, the connection closes
  reset     the headers come, then a TCP reset
  stall     the headers and 1 KiB come, then nothing (for up to 60 s)
  etag      from the k-th request on the object has a new ETag (If-Match then fails: 412)

Every request (path, Range) is recorded in `server.log`. Threaded, HTTP/1.1 keep-alive,
127.0.0.1 only.
"""

import http.server
import os
import re
import socket
import struct
import time

import http_util


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        srv = self.server
        m = re.match(r"^/([^/]+)/([a-z0-9]+?)(\d+)/(.+)$", self.path)
        if not m:
            return self._plain(404, b"no")
        token, fault, k, name = m.group(1), m.group(2), int(m.group(3)), m.group(4)
        key = (token, fault, k, name)
        with srv.lock:
            srv.counts[key] = srv.counts.get(key, 0) + 1
            n = srv.counts[key]
            srv.log.append((self.path, self.headers.get("Range")))
        path = os.path.join(srv.folder, name)
        if not os.path.isfile(path):
            return self._plain(404, b"<Error><Code>NoSuchKey</Code></Error>")
        with open(path, "rb") as f:
            data = f.read()
        etag = '"v1-%d"' % len(data)
        if fault == "etag" and n >= k:
            etag = '"v2-%d"' % len(data)
        im = self.headers.get("If-Match")
        if im is not None and im != etag:
            return self._plain(412, b"<Error><Code>PreconditionFailed</Code></Error>")
        if (fault == "slow" and n == k) or (fault == "down" and n >= k):
            return self._plain(503, b"<Error><Code>SlowDown</Code></Error>", {"Retry-After": "1"})
        r = http_util.send_range_or_error(self, self.headers.get("Range"), data)
        if r is None:
            return
        status, a, b = r
        body = data[a:b + 1]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, len(data)))
        self.end_headers()
        if n == k and fault == "cut":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if n == k and fault == "reset":
            self.wfile.flush()
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return
        if n == k and fault == "stall":
            self.wfile.write(body[:1024])
            self.wfile.flush()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not srv.stopping:
                time.sleep(0.2)
            self.close_connection = True
            return
        self.wfile.write(body)

    def _plain(self, status, body, headers=None):
        http_util.send_plain(self, status, body, headers)


class FaultyServer(http_util.FolderServer):
    def __init__(self, folder):
        super().__init__(folder, Handler)

    def requests_for(self, path):
        with self.lock:
            return [r for p, r in self.log if p == path]
