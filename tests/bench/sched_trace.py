#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Where a latency-class round trip waits: read a tracefs text trace of
sched_switch, sched_wakeup and raw_syscalls events (tests/bench/qos-trace.sh
records one) and print run-queue waits per thread, the loop threads' socket
calls, the client's round trips with the CPU waits inside the slow ones, and
what ran while a loop waited for a CPU."""

import argparse
import collections
import json
import re

EVENT = re.compile(r"^\s*(.+?)-(\d+)\s+\[(\d+)\]\s+\S+\s+([\d.]+): (\w+): (.*)$")
FIELD = re.compile(r"(\w+)=(\S+)")
SYSCALLS = {46: "sendmsg", 47: "recvmsg", 232: "epoll_wait", 233: "epoll_ctl", 0: "read",
            1: "write", 44: "sendto", 202: "futex", 24: "sched_yield", 7: "poll"}


SETUP_WAIT = 0.1  # seconds: a client sleep this long is the connection's set-up


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def us(seconds):
    return seconds * 1e6


def parse(path):
    events = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = EVENT.match(line)
            if not m:
                continue
            _, pid, cpu, ts, name, rest = m.groups()
            events.append((float(ts), int(cpu), name, int(pid), rest))
    return events


def pairs(spec):
    name, _, value = spec.partition("=")
    return name, value


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("trace")
    ap.add_argument("--client", type=int, required=True, help="the latency client's thread id")
    ap.add_argument("--loop", action="append", default=[], type=pairs,
                    help="NAME=TID of a daemon's loop thread")
    ap.add_argument("--threads", action="append", default=[], type=pairs,
                    help="NAME=TID,TID,...: all of that daemon's threads")
    ap.add_argument("--bench", action="append", default=[], help="rdmax-bench --json results")
    ap.add_argument("--slow-us", type=float, default=400.0,
                    help="a round trip slower than this is a slow one (400)")
    args = ap.parse_args()

    label = {0: "idle", args.client: "client"}
    loops = {}
    for name, tids in args.threads:
        for i, tid in enumerate(t for t in tids.split(",") if t):
            label[int(tid)] = "%s:io%d" % (name, i)
    for name, tid in args.loop:
        loops[int(tid)] = name
        label[int(tid)] = "%s:loop" % name

    events = parse(args.trace)
    sched = [(t, c, n, p, dict(FIELD.findall(r))) for t, c, n, p, r in events
             if n in ("sched_switch", "sched_wakeup")]
    if not sched:
        raise SystemExit("sched_trace: no scheduler events in %s" % args.trace)
    span = sched[-1][0] - sched[0][0]
    print("trace: %.2f s, %d scheduler events, %d system-call events"
          % (span, len(sched), len(events) - len(sched)))
    for path in args.bench:
        r = json.load(open(path))["results"][0]
        print("  %s: p50 %.1f us, p99 %.1f us, %.0f MB/s"
              % (path.rsplit("/", 1)[-1], r["lat_us"]["p50"], r["lat_us"]["p99"],
                 1000 * r.get("GBps", 0)))

    # Run-queue waits (wakeup or preemption until switched in) and runs, per thread.
    runnable, on_cpu = {}, {}
    waits, runs = collections.defaultdict(list), collections.defaultdict(list)
    segments = collections.defaultdict(list)  # cpu -> (start, end, pid)
    seg_start = {}
    woken_by = {}  # pid -> (waker, whether onto the waker's own CPU)
    wakeups = collections.defaultdict(list)
    for t, cpu, name, waker, f in sched:
        if name == "sched_wakeup":
            runnable[int(f["pid"])] = (t, int(f["target_cpu"]))
            woken_by[int(f["pid"])] = (waker, cpu == int(f["target_cpu"]))
            continue
        prev, nxt = int(f["prev_pid"]), int(f["next_pid"])
        for pid, comm in ((prev, f["prev_comm"]), (nxt, f["next_comm"])):
            label.setdefault(pid, "%s/%d" % (comm[:12], pid))
        if cpu in seg_start:
            segments[cpu].append((seg_start[cpu], t, seg_start[cpu][1]))
        seg_start[cpu] = (t, nxt)
        if prev in on_cpu:
            runs[prev].append(t - on_cpu.pop(prev))
        if f["prev_state"].startswith("R"):
            runnable[prev] = (t, cpu)
        on_cpu[nxt] = t
        if nxt in runnable:
            since, target = runnable.pop(nxt)
            waits[nxt].append((t - since, since, t, target))
            if nxt in woken_by:
                wakeups[(nxt,) + woken_by.pop(nxt)].append(t - since)
        woken_by.pop(nxt, None)
    segments = {c: [(s[0], e, s[1]) for s, e, _ in v] for c, v in segments.items()}

    print("\nrun-queue waits and runs per thread (us)")
    print("  %-10s %7s %7s %7s %8s | %7s %7s %8s %8s" % (
        "thread", "waits", "p50", "p99", "max", "runs", "p99", "max", "cpu ms"))
    for pid in sorted(label, key=lambda p: -sum(runs.get(p, []))):
        if pid == 0 or (not waits.get(pid) and not runs.get(pid)) or "/" in label[pid]:
            continue
        w = [x[0] for x in waits[pid]]
        r = runs[pid]
        print("  %-10s %7d %7.0f %7.0f %8.0f | %7d %7.0f %8.0f %8.1f" % (
            label[pid], len(w), us(pct(w, .5)), us(pct(w, .99)), us(max(w or [0])), len(r),
            us(pct(r, .99)), us(max(r or [0])), 1e3 * sum(r)))

    # Wake-up to running, by who woke the thread and onto which CPU (an idle
    # vCPU of a VM may have to be scheduled by the host first).
    print("\nwake-up to running, for the round trip's threads (us)")
    path = [args.client] + list(loops)
    for (pid, waker, same), d in sorted(wakeups.items(), key=lambda x: -sum(x[1])):
        if pid not in path or len(d) < 20:
            continue
        print("  %-8s woken by %-18s onto %-9s %6d  mean %5.0f p99 %6.0f" % (
            label[pid], label.get(waker, str(waker)) if waker else "irq/idle",
            "its CPU" if same else "another", len(d), us(sum(d) / len(d)), us(pct(d, .99))))

    # The loops' socket calls: duration per call, per socket.
    print("\nloop threads' socket calls (us per call)")
    entered = {}
    calls = collections.defaultdict(list)
    for t, _, name, pid, rest in events:
        if pid not in loops:
            continue
        if name == "sys_enter":
            a = rest.split()
            entered[pid] = (int(a[1]), int(a[2].strip("(,"), 16), t)
        elif name == "sys_exit" and pid in entered:
            nr, fd, t0 = entered.pop(pid)
            calls[(pid, nr, fd)].append((t - t0, int(rest.rsplit("=", 1)[1])))
    for (pid, nr, fd), c in sorted(calls.items()):
        if nr not in (46, 47) or len(c) < 10:
            continue
        d = [x for x, _ in c]
        ok = [n for _, n in c if n >= 0]
        print("  %-7s %-8s fd %-3d calls %6d  p50 %5.0f p99 %6.0f max %6.0f  total %6.1f ms"
              "  bytes/call p50 %d max %d" % (
                  loops[pid], SYSCALLS[nr], fd, len(c), us(pct(d, .5)), us(pct(d, .99)),
                  us(max(d)), 1e3 * sum(d), pct(ok, .5), max(ok or [0])))

    # The client's round trips: from going to sleep to running again.
    trips = []
    asleep = None
    for t, cpu, name, _, f in sched:
        if name != "sched_switch":
            continue
        prev, nxt = int(f["prev_pid"]), int(f["next_pid"])
        if prev == args.client and f["prev_state"].startswith(("S", "D")):
            asleep = t
        if nxt == args.client and asleep is not None:
            # Not a round trip: the wait for the first connection, before the warm-up.
            if t - asleep < SETUP_WAIT:
                trips.append((t - asleep, asleep, t))
            asleep = None
    wait_index = {pid: [(s, e) for _, s, e, _ in w] for pid, w in waits.items()}

    def waited_in(pid, a, b):
        return sum(min(e, b) - max(s, a) for s, e in wait_index.get(pid, []) if e > a and s < b)

    d = [x for x, _, _ in trips]
    print("\nclient round trips (sleep to running again): %d, p50 %.0f p90 %.0f p99 %.0f "
          "max %.0f us" % (len(d), us(pct(d, .5)), us(pct(d, .9)), us(pct(d, .99)),
                           us(max(d or [0]))))
    slow = [x for x in trips if us(x[0]) > args.slow_us]
    if slow:
        share = {"client": 0.0}
        for pid in loops:
            share[label[pid]] = 0.0
        total = sum(x[0] for x in slow)
        for _, a, b in slow:
            # The client's own wait ends its trip: it counts from its wakeup.
            share["client"] += waited_in(args.client, a, b + 1e-9)
            for pid in loops:
                share[label[pid]] += waited_in(pid, a, b)
        print("  %d slower than %.0f us, %.1f ms in all; waiting for a CPU in them:"
              % (len(slow), args.slow_us, 1e3 * total))
        for who, s in share.items():
            print("    %-8s %6.1f ms (%4.1f %%)" % (who, 1e3 * s, 100 * s / total))

    # What ran while a loop waited for a CPU (waits over 200 us).
    print("\nwhile a loop thread waited over 200 us for a CPU, what ran (ms)")
    for pid in loops:
        blame = collections.Counter()
        long_waits = [w for w in waits.get(pid, []) if w[0] > 200e-6]
        for _, a, b, target in long_waits:
            for cpu, segs in segments.items():
                where = "its cpu" if cpu == target else "other cpu"
                for s, e, who in segs:
                    if e > a and s < b:
                        blame[(label.get(who, str(who)), where)] += min(e, b) - max(s, a)
        print("  %s: %d waits, %.1f ms" % (label[pid], len(long_waits),
                                           1e3 * sum(w[0] for w in long_waits)))
        for (who, where), v in blame.most_common(8):
            print("    %-18s on %-9s %6.1f" % (who, where, 1e3 * v))


if __name__ == "__main__":
    main()
