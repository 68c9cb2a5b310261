# SPDX-License-Identifier: MIT
"""GPU tensors end to end without a GPU: Python -> rdmax._rdmax -> librdmax ->
the fake CUDA driver (build/tests/fakecuda/libcuda.so.1, found by dlopen
through LD_LIBRARY_PATH) -> the protocol -> the daemon's GPU module over the
same fake (build/tests/gpu/fake-gpu-daemon). The registrations run in a
child process (gpu_fake_child.py), since the loader reads LD_LIBRARY_PATH
at start-up; this side compares what the daemon registered."""
import os
import re
import subprocess
import sys

import conftest

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))


def test_gpu_tensors_end_to_end_with_the_fake_driver():
    fake_dir = os.path.abspath(os.path.join(conftest.BUILD, "tests", "fakecuda"))
    daemon_bin = os.path.join(conftest.BUILD, "tests", "gpu", "fake-gpu-daemon")
    assert os.path.exists(os.path.join(fake_dir, "libcuda.so.1")), "make builds the fake"
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = fake_dir + (":" + env["LD_LIBRARY_PATH"]
                                         if env.get("LD_LIBRARY_PATH") else "")
    daemon = subprocess.Popen([daemon_bin], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        first = daemon.stdout.readline()
        assert first.startswith("socket "), first
        child = subprocess.run([sys.executable, os.path.join(HERE, "gpu_fake_child.py"),
                                first.split()[1]], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=60)
        assert child.returncode == 0 and child.stdout.strip().endswith("ok"), child.stdout
        out, _ = daemon.communicate(timeout=20)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == 0, out
    regs = [dict(kv.split("=", 1) for kv in line.split()[1:])
            for line in out.splitlines() if line.startswith("register ")]
    assert not [line for line in out.splitlines() if line.startswith("refused")], out
    # (offset in the exported dma-buf, length, GPU, fds carried) of each registration.
    got = [(int(r["offset"]), int(r["length"]), r["bus"], int(r["fds"])) for r in regs]
    assert got == [(4096, 4096, "0000:3B:00.0", 1),   # CAI: the allocation's dma-buf sent
                   (3 * MiB, 1024, "0000:3B:00.0", 0),  # data_ptr(): the daemon's copy reused
                   (65536, 512, "0000:3B:00.0", 0),   # DLPack, byte_offset included
                   (0, 1024, "0000:86:00.0", 1)], out  # DLPack on the second GPU
    for r in regs:
        assert r["plan"] == "dmabuf" and r["check"] == "0", out
        assert int(r["plan_offset"]) == int(r["offset"]), out
    assert [int(r["dmabuf_size"]) for r in regs if r["fds"] == "1"] == [4 * MiB, 2 * MiB], out
    ids = {r["id"] for r in regs}
    freed = re.findall(r"^deregister id=(\d+) ok$", out, re.M)
    assert sorted(freed) == sorted(ids), out  # every region deregistered
