#!/usr/bin/env python3
"""A fault-injecting HTTP proxy for zcc's object-store tests: forwards every
request to an S3 server unchanged (headers included, so signatures still
verify there), except that it first answers a given number of requests
itself with S3's 503 SlowDown, as a throttling store does, and cuts the
connection of a given number of large uploads (a part's body of 1 MiB or
more) halfway through their bodies, as a failing network does.

Prints "endpoint=http://127.0.0.1:PORT" and "ready", then serves until
SIGTERM. Each failure it injects is counted in its log ("injected N").

Usage: fault_proxy.py --upstream http://127.0.0.1:PORT [--slowdown N] [--cut N]
"""
import argparse
import http.client
import http.server
import signal
import socket
import sys
import threading
import urllib.parse

SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            b'<Message>Please reduce your request rate.</Message></Error>')


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--slowdown", type=int, default=0,
                    help="answer this many requests with 503 SlowDown first")
    ap.add_argument("--cut", type=int, default=0,
                    help="cut this many large uploads halfway through their bodies")
    args = ap.parse_args()
    up = urllib.parse.urlsplit(args.upstream)
    state = {"left": args.slowdown, "injected": 0, "cuts": args.cut}
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_):
            pass

        def handle_any(self):
            length = int(self.headers.get("Content-Length") or 0)
            with lock:
                cut = length >= (1 << 20) and state["cuts"] > 0
                if cut:
                    state["cuts"] -= 1
                    state["injected"] += 1
                    print(f"injected {state['injected']} (cut)", flush=True)
            if cut:
                # Half the body, then the connection goes away unanswered.
                self.rfile.read(length // 2)
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            body = self.rfile.read(length) if length else b""
            with lock:
                inject = state["left"] > 0
                if inject:
                    state["left"] -= 1
                    state["injected"] += 1
                    print(f"injected {state['injected']}", flush=True)
            if inject:
                self.send_response(503)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(SLOWDOWN)))
                self.end_headers()
                if self.command != "HEAD":  # a HEAD's answer has no body
                    self.wfile.write(SLOWDOWN)
                return
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                conn.putheader(name, value)
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
            self.send_response(resp.status, resp.reason)
            for name, value in resp.getheaders():
                if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(name, value)
            # A HEAD's length is the object's, not that of its (empty) body.
            length = resp.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            conn.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"endpoint=http://127.0.0.1:{server.server_address[1]}")
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
