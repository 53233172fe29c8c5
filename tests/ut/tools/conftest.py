"""A tiny HTTP server on 127.0.0.1 for the tools' server paths: it records each POST and answers from a
script of (status, JSON body or raw bytes, delay seconds) replies; with the script used up it answers 200 {}."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class HttpStub:
    def __init__(self):
        self.requests, self.replies = [], []
        self.lock = threading.Lock()
        self.url = ""


def _handler(stub: HttpStub):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with stub.lock:
                stub.requests.append({"path": self.path, "headers": dict(self.headers), "json": json.loads(body)})
                status, reply, delay = stub.replies.pop(0) if stub.replies else (200, {}, 0)
            time.sleep(delay)
            data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a time-out test)

        def log_message(self, *args):
            pass
    return Handler


@pytest.fixture
def http_stub():
    stub = HttpStub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(stub))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    stub.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield stub
    server.shutdown()
    server.server_close()
    thread.join(timeout=30)
