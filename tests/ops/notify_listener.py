#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Stand-in for the service manager's notify socket (sd_notify(3)).

Binds an AF_UNIX SOCK_DGRAM socket at PATH and appends one line per
datagram to LOG: "<monotonic seconds> <fields joined by '|'>". Runs until
killed. Tests read LOG to check READY/STATUS/WATCHDOG/RELOADING/STOPPING.
"""
import os
import socket
import sys
import time


def main():
    path, log = sys.argv[1], sys.argv[2]
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    os.chmod(path, 0o777)
    with open(log, "a", buffering=1) as out:
        out.write("%.6f LISTENING\n" % time.monotonic())
        while True:
            data = sock.recv(65536)
            text = data.decode("utf-8", "replace").strip("\n").replace("\n", "|")
            out.write("%.6f %s\n" % (time.monotonic(), text))


if __name__ == "__main__":
    main()
