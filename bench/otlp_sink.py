#!/usr/bin/env python3
"""bench/otlp_sink.py PORTFILE: a minimal OTLP/HTTP receiver for bench/overhead.sh.

Listens on 127.0.0.1 (a free port, written to PORTFILE), answers every POST with 200 and an empty
protobuf body (an empty ExportProfilesServiceResponse: full success), and counts what it got. On
SIGTERM it prints one line: requests, body bytes and the paths seen. It decodes nothing: the bench
measures the relay's cost of exporting, and the tests check what is sent.
"""
import http.server
import signal
import sys
import threading

stats = {"requests": 0, "bytes": 0, "paths": set()}
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        remaining = length
        while remaining > 0:
            chunk = self.rfile.read(min(remaining, 1 << 16))
            if not chunk:
                break
            remaining -= len(chunk)
        with lock:
            stats["requests"] += 1
            stats["bytes"] += length - remaining
            stats["paths"].add(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: otlp_sink.py PORTFILE")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def stop(*_):
        with lock:
            paths = ",".join(sorted(stats["paths"])) or "-"
            print(f"{stats['requests']} requests, {stats['bytes']} bytes, paths {paths}", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    with open(sys.argv[1], "w") as f:
        f.write(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()
