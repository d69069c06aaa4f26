"""A private zccd for Python tests: its own socket, checkpoint root and shm
prefix under a fresh /tmp directory (short enough for a unix socket path),
started from $ZCCD (set by run_python.sh to the built //daemon:zccd)."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time


class Zccd:
    def __init__(self, tag="py", extra_flags=(), binary=None):
        self.binary = binary or os.environ["ZCCD"]
        self.dir = tempfile.mkdtemp(prefix="zcc%s." % tag, dir="/tmp")
        self.socket = os.path.join(self.dir, "zccd.sock")
        self.root = os.path.join(self.dir, "ckpt")
        # Unique per instance: tests in PID namespaces share pids, and a zccd
        # removes segments with its prefix at start as stale.
        self.shm_prefix = "zcc%s%s" % (tag, os.path.basename(self.dir).split(".")[-1].replace("_", ""))
        self.log_path = os.path.join(self.dir, "zccd.log")
        self.extra_flags = list(extra_flags)
        self.proc = None

    def start(self, timeout=30.0):
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.binary, "--socket=" + self.socket, "--root=" + self.root,
             "--shm_prefix=" + self.shm_prefix] + self.extra_flags,
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        # Until the socket takes connections: it exists from zccd's bind(),
        # a moment before its listen() (a connection then is refused).
        while not self._accepts():
            if self.proc.poll() is not None:
                raise RuntimeError("zccd exited with %d:\n%s" % (self.proc.returncode, self.log()))
            if time.monotonic() > deadline:
                raise RuntimeError("zccd did not listen on its socket:\n" + self.log())
            time.sleep(0.02)
        return self

    def _accepts(self):
        if not os.path.exists(self.socket):
            return False
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def stop(self, timeout=30.0):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def job_dir(self, job):
        return os.path.join(self.root, job)

    def latest(self, job):
        """The step named by <root>/<job>/latest, or None."""
        try:
            with open(os.path.join(self.job_dir(job), "latest")) as f:
                return int(f.read().strip().split("-")[-1])
        except (OSError, ValueError):
            return None

    def wait_latest(self, job, step, timeout=60.0):
        deadline = time.monotonic() + timeout
        while (self.latest(job) or -1) < step:
            if time.monotonic() > deadline:
                raise AssertionError("step %d of job %s was not committed in %.0f s (latest %s):\n%s"
                                     % (step, job, timeout, self.latest(job), self.log()))
            time.sleep(0.05)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Stops zccd and removes everything this object made: its
        directory, and what a zccd that had to be killed left under its own
        prefix in /dev/shm."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        # What a zccd that had to be killed left under this object's own
        # prefix: staging segments and its (unlocked) lock file.
        for name in os.listdir("/dev/shm"):
            if name.startswith(self.shm_prefix + ".") or name == ".zccd.%s.lock" % self.shm_prefix:
                try:
                    os.unlink(os.path.join("/dev/shm", name))
                except OSError:
                    pass
        return False
