# SPDX-License-Identifier: MIT
"""Fixtures: real rdmaxd processes (TCP transport, 127.0.0.1, any free port),
each in its own temporary directory, stopped with SIGTERM after the test."""
import os
import signal
import socket
import subprocess
import tempfile
import time

import pytest

BUILD = os.environ.get("RDMAX_BUILD", "build")


def accepts(path):
    """Whether a daemon listens at path (the socket file exists before listen())."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Daemon:
    def __init__(self, name, extra=()):
        self.name = name
        self.dir = tempfile.mkdtemp(prefix="rdmax-py-%s-" % name)
        self.socket = os.path.join(self.dir, "d.sock")
        self.log = os.path.join(self.dir, "d.log")
        cmd = [os.path.join(BUILD, "rdmaxd"), "--node-name", name, "--socket", self.socket,
               "--transport", "tcp", "--listen", "127.0.0.1", "--port", "0",
               "--log-level", "notice", "--config", "/dev/null",
               "--set", "daemon.admin_socket=%s" % os.path.join(self.dir, "admin.sock")]
        for kv in extra:
            cmd += ["--set", kv]
        self.proc = subprocess.Popen(cmd, stderr=open(self.log, "w"))
        deadline = time.monotonic() + 10
        while not accepts(self.socket):
            if self.proc.poll() is not None:
                raise RuntimeError("rdmaxd %s exited: %s" % (name, open(self.log).read()))
            if time.monotonic() > deadline:
                raise RuntimeError("rdmaxd %s did not open its socket" % name)
            time.sleep(0.02)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def daemons():
    """Two daemons, 'prefill' and 'decode'."""
    ds = [Daemon("prefill"), Daemon("decode")]
    yield ds
    for d in ds:
        d.stop()


@pytest.fixture
def daemon():
    d = Daemon("solo")
    yield d
    d.stop()
