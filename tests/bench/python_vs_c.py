#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Python against C on the same daemons, in one run (a benchmark, not a test).

Starts two rdmaxd (TCP, 127.0.0.1) in a temporary directory, then measures
1. a 64-block x 32-layer push at 16 KiB blocks (32 PAGED_WRITE jobs, 32 MiB per
   batch), best of N, from C (tests/bench/kv-batch) and from Python
   (rdmax.Client.submit of 32 rdmax.Job with numpy block ids, then Job.wait),
   and from C the same 2048 pages as one job (what one job over every
   layer's region pair would carry);
2. small jobs: 64-byte WRITEs, 64 in flight, jobs/s from C and from Python.
Prints a table (and JSON with --json). RDMAX_BUILD names the build folder.
--rounds N repeats every measurement N times, interleaved: C then Python in
even rounds, Python then C in odd ones, so that drift in the machine's load
falls on both sides; it prints each round, the median and the spread, and
the load average before and after.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

BUILD = os.environ.get("RDMAX_BUILD", "build")
sys.path.insert(0, os.path.join(BUILD, "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "client-lib", "python", "tests"))
from conftest import accepts  # noqa: E402  (the tests' readiness probe)
import numpy as np  # noqa: E402

import rdmax  # noqa: E402

LAYERS, BLOCKS, BB = 32, 64, 16384


def daemon(d, name):
    sock = os.path.join(d, name + ".sock")
    p = subprocess.Popen([os.path.join(BUILD, "rdmaxd"), "--node-name", name, "--socket", sock,
                          "--transport", "tcp", "--listen", "127.0.0.1", "--port", "0",
                          "--config", "/dev/null", "--log-level", "warning", "--set",
                          "daemon.admin_socket=%s" % os.path.join(d, name + ".admin")],
                         stderr=subprocess.DEVNULL)
    while not accepts(sock):
        if p.poll() is not None:
            sys.exit("python_vs_c: rdmaxd %s exited" % name)
        time.sleep(0.02)
    return p, sock


def py_push(c, src, desc, iters):
    idx = np.arange(0, 2 * BLOCKS, 2, dtype=np.uint32)
    best = 1e9
    for _ in range(iters):
        t0 = time.perf_counter()
        jobs = c.submit([rdmax.Job(rdmax.OP_PAGED_WRITE, src, desc, page_len=BB,
                                   local_pages=idx, remote_pages=idx,
                                   remote_pages_offset=layer * 2 * BLOCKS * BB)
                         for layer in range(LAYERS)])
        for j in jobs:
            j.wait(10)
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def py_small(c, src, desc, n, window=64):
    sent = done = 0
    t0 = time.perf_counter()
    while done < n:
        while sent < n and sent - done < window:
            c.submit(rdmax.Job(rdmax.OP_WRITE, src, desc, length=64))
            sent += 1
        done += len(c.poll(timeout=10))
    return n / (time.perf_counter() - t0)


def rounds_arg():
    if "--rounds" in sys.argv:
        return int(sys.argv[sys.argv.index("--rounds") + 1])
    return 1


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def main():
    iters = int(os.environ.get("RDMAX_BENCH_ITERS", "20"))
    small = int(os.environ.get("RDMAX_BENCH_SMALL_JOBS", "20000"))
    n_rounds = rounds_arg()
    load_before = os.getloadavg()
    d = tempfile.mkdtemp(prefix="rdmax-pyvc-")
    procs = []
    try:
        pa, sa = daemon(d, "a")
        pb, sb = daemon(d, "b")
        procs = [pa, pb]
        with rdmax.Client(sb, "target") as cb, rdmax.Client(sa, "bench") as ca:
            dst = cb.alloc_host(LAYERS * 2 * BLOCKS * BB, rdmax.ACCESS_REMOTE_WRITE)
            desc_file = os.path.join(d, "dst.desc")
            open(desc_file, "wb").write(dst.desc())
            kvb = os.path.join(BUILD, "tests", "bench", "kv-batch")

            def c_run(*args):
                # The Python package never busy-polls (it sleeps in poll() on the
                # daemon's fd); the C side waits the same way, so the two compare the
                # submission paths rather than spinning against sleeping.
                env = dict(os.environ, RDMAX_SPIN_US="0")
                out = subprocess.run([kvb, args[0], sa, desc_file] + [str(a) for a in args[1:]],
                                     check=True, stdout=subprocess.PIPE, env=env).stdout
                return json.loads(out)

            src = ca.alloc_host(2 * BLOCKS * BB)
            desc = rdmax.Desc(dst.desc())
            py_push(ca, src, desc, 2)  # warm the connection
            steps = {
                "push_c_us": lambda: c_run("push", LAYERS, BLOCKS, BB, iters)["best_us"],
                "push_one_job_c_us": lambda: c_run("push1", LAYERS, BLOCKS, BB,
                                                   iters)["best_us"],
                "push_py_us": lambda: py_push(ca, src, desc, iters),
                "small_c_jobs_s": lambda: c_run("small", small, 64)["jobs_per_s"],
                "small_py_jobs_s": lambda: py_small(ca, src, desc, small),
            }
            c_first = ["push_c_us", "push_one_job_c_us", "push_py_us", "small_c_jobs_s",
                       "small_py_jobs_s"]
            py_first = ["push_py_us", "push_c_us", "push_one_job_c_us", "small_py_jobs_s",
                        "small_c_jobs_s"]
            runs = []
            for r in range(n_rounds):
                row = {k: steps[k]() for k in (c_first if r % 2 == 0 else py_first)}
                row["push_ratio"] = row["push_py_us"] / row["push_c_us"]
                row["small_ratio"] = row["small_py_jobs_s"] / row["small_c_jobs_s"]
                row["one_job_ratio"] = row["push_one_job_c_us"] / row["push_c_us"]
                runs.append(row)
            src.free()
    finally:
        for p in procs:
            p.terminate()
            p.wait()
    load_after = os.getloadavg()
    if n_rounds > 1:
        keys = list(runs[0])
        summary = {k: {"median": median([r[k] for r in runs]), "min": min(r[k] for r in runs),
                       "max": max(r[k] for r in runs)} for k in keys}
        if "--json" in sys.argv:
            print(json.dumps({"rounds": runs, "summary": summary, "load_before": load_before,
                              "load_after": load_after}))
            return
        print("load average before %.2f %.2f %.2f, after %.2f %.2f %.2f" % (load_before +
                                                                             load_after))
        print("round  push C us  push Py us  Py/C  one-job C us  1job/32  small C/s  "
              "small Py/s  Py/C")
        for i, r in enumerate(runs):
            print("%5d %10.0f %11.0f %5.2f %13.0f %8.2f %10.0f %11.0f %5.3f" % (
                i, r["push_c_us"], r["push_py_us"], r["push_ratio"], r["push_one_job_c_us"],
                r["one_job_ratio"], r["small_c_jobs_s"], r["small_py_jobs_s"],
                r["small_ratio"]))
        for k in keys:
            print("%-18s median %12.3f  min %12.3f  max %12.3f" % (
                k, summary[k]["median"], summary[k]["min"], summary[k]["max"]))
        return
    rows = runs[0]
    if "--json" in sys.argv:
        print(json.dumps(rows))
        return
    print("%-44s %12s %12s %8s" % ("measurement (TCP, 127.0.0.1)", "C", "Python", "Py/C"))
    print("%-44s %10.0f us %9.0f us %8.3f" % (
        "push: 32 layers x 64 blocks x 16 KiB, best", rows["push_c_us"], rows["push_py_us"],
        rows["push_ratio"]))
    print("%-44s %10.0f us %12s %8s" % (
        "the same 2048 pages as one job, C", rows["push_one_job_c_us"], "", ""))
    print("%-44s %10.0f/s %10.0f/s %8.3f" % (
        "small: 64 B WRITE, 64 in flight, jobs/s", rows["small_c_jobs_s"],
        rows["small_py_jobs_s"], rows["small_ratio"]))


if __name__ == "__main__":
    main()
