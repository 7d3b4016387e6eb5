"""What the test HTTP servers (faulty_http.py, hostile_http.py) share: a threaded server on a
free port of 127.0.0.1 serving one folder, the `Range: bytes=` rule of a file's bytes, and
plain answers. Threads in the pytest process; stdlib only."""

import http.server
import re
import threading


class FolderServer(http.server.ThreadingHTTPServer):
    """Serves `folder` with `handler` on a thread of its own from construction to stop(). Keeps a
    lock, per-key request counts and a log of (path, Range) for the handler to fill."""

    daemon_threads = True

    def __init__(self, folder, handler):
        super().__init__(("127.0.0.1", 0), handler)
        self.folder = folder
        self.lock = threading.Lock()
        self.counts, self.log = {}, []
        self.stopping = False
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self):
        return "http://127.0.0.1:%d" % self.server_address[1]

    def stop(self):
        self.stopping = True
        self.shutdown()
        self.server_close()


def byte_range(header, size):
    """The (first, last) byte a `Range` header asks of `size` bytes (the whole object when
    `header` is empty or None), or None for a header that is no `bytes=a-b` / `bytes=-n`, or
    "unsatisfiable" for a range that starts past the end."""
    first, last = 0, size - 1
    if not header:
        return first, last
    m = re.match(r"bytes=(\d*)-(\d*)$", header)
    if not m:
        return None
    if m.group(1) == "":
        first = max(0, size - int(m.group(2)))
    else:
        first = int(m.group(1))
        if m.group(2):
            last = min(last, int(m.group(2)))
    if first >= size:
        return "unsatisfiable"
    return first, last


def send_plain(handler, status, body, headers=None):
    """A complete answer: status, Content-Length, `headers`, `body`."""
    handler.send_response(status)
    handler.send_header("Content-Length", str(len(body)))
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(body)


def send_range_or_error(handler, header, data):
    """Answers a bad or unsatisfiable `Range` with 416 and returns None; else returns
    (status, first, last): 200 for the whole of `data`, 206 for a range."""
    r = byte_range(header, len(data))
    if r is None:
        send_plain(handler, 416, b"bad range")
        return None
    if r == "unsatisfiable":
        send_plain(handler, 416, b"", {"Content-Range": "bytes */%d" % len(data)})
        return None
    return (206 if header else 200), r[0], r[1]
