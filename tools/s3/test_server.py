#!/usr/bin/env python3
"""An S3-compatible server for zcc's tests: moto's standalone server on
127.0.0.1, with every request's AWS Signature Version 4 checked.

moto checks signatures against the access keys of its own IAM: the first
requests (INITIAL_NO_AUTH_ACTION_COUNT of them) are let through unchecked,
which is how this script makes a user with a policy allowing everything and
an access key for it; every request after that, the bucket's creation
included, must be signed with that key (a wrong secret gets
SignatureDoesNotMatch).

Prints one "key=value" line each for endpoint, access_key, secret_key and
bucket, then "ready", and serves until it is sent SIGTERM or SIGINT; the
server goes with it (also when this script is killed: the server gets
SIGTERM when its parent dies).

Usage: test_server.py [--bucket NAME] [--port N]
"""
import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import boto3

# The IAM requests made before authentication is enforced.
BOOTSTRAP_REQUESTS = 3


def die_with_parent():
    """In the server's process: SIGTERM when this script dies (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


def free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_listening(host, port, server, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"moto's server exited with {server.returncode} before it listened")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(delay)  # a starting process: nothing to wait on but its port
            delay = min(delay * 2, 0.5)
    sys.exit(f"moto's server did not listen on port {port} within {timeout_s} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bucket", default="zcc-test")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1",
                    help="the address to serve on (a test node's, in a network namespace)")
    args = ap.parse_args()
    port = args.port or free_port(args.host)
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT=str(BOOTSTRAP_REQUESTS))
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", args.host, "-p", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent)
    stop = threading.Event()

    def shutdown(*_):
        stop.set()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    try:
        wait_listening(args.host, port, server)
        endpoint = f"http://{args.host}:{port}"
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
        iam.create_user(UserName="zcc")
        iam.put_user_policy(UserName="zcc", PolicyName="everything", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="zcc")["AccessKey"]
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=key["AccessKeyId"],
                          aws_secret_access_key=key["SecretAccessKey"])
        s3.create_bucket(Bucket=args.bucket)
        print(f"endpoint={endpoint}")
        print(f"access_key={key['AccessKeyId']}")
        print(f"secret_key={key['SecretAccessKey']}")
        print(f"bucket={args.bucket}")
        print("ready", flush=True)
        stop.wait()
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
