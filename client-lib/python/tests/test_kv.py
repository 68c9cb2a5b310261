# SPDX-License-Identifier: MIT
"""rdmax.kv against real daemons: handshakes, push/pull of every layer,
heterogeneous TP head slices, failures named within deadlines, and the
two-process prefill/decode example."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import rdmax
import rdmax.kv as kv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))


def collect(agents, done, timeout=20):
    """get_finished() of every agent, accumulated, until done(sent, recv, failed)."""
    sent, recv, failed = set(), set(), {}
    end = time.monotonic() + timeout
    while not done(sent, recv, failed) and time.monotonic() < end:
        for a in agents:
            s, r, f = a.get_finished()
            sent |= s
            recv |= r
            failed.update(f)
        if not done(sent, recv, failed):
            agents[0].wait(0.05)
    return sent, recv, failed


def test_handshake_round_trip_and_validation(daemon):
    with rdmax.Client(daemon.socket) as c:
        a = kv.Agent(c, kv.Layout(2, 8, 4096, num_heads=4, tp_rank=1, tp_size=2), "p")
        a.alloc_caches()
        hs = a.handshake()
        peer = a.add_peer(hs)
        assert peer.layout.num_layers == 2 and peer.layout.tp_rank == 1
        assert bytes(peer.mailbox) == a.mailbox_addr and len(peer.descs) == 4
        for bad in (b"", hs[:10], b"KVDR" + hs[4:], hs[:4] + b"\x09\x00" + hs[6:], hs + b"x",
                    hs[:-3]):
            with pytest.raises(rdmax.InvalidArgument):
                a.add_peer(bad)
        with pytest.raises(ValueError):
            kv.Layout(1, 8, 1000, num_heads=3)


def fill_all(agent, seed):
    arrays = []
    for i, r in enumerate(agent.regions):
        x = np.frombuffer(r, dtype=np.uint8)
        x[:] = np.random.default_rng([seed, i]).integers(0, 256, x.size, dtype=np.uint8)
        arrays.append(x)
    return arrays


def test_push_and_pull_all_layers(daemons):
    a, b = daemons
    lay = kv.Layout(3, 64, 8192, kv_per_layer=2)
    with rdmax.Client(a.socket) as ca, rdmax.Client(b.socket) as cb:
        pre, dec = kv.Agent(ca, lay, "prefill"), kv.Agent(cb, lay, "decode")
        pre.alloc_caches()
        dec.alloc_caches()
        src = fill_all(pre, 1)
        dst = [np.frombuffer(r, dtype=np.uint8) for r in dec.regions]
        to_dec, to_pre = pre.add_peer(dec.handshake()), dec.add_peer(pre.handshake())
        reqs = {}
        rng = np.random.default_rng(5)
        pb = rng.permutation(64).astype(np.uint32)
        db = rng.permutation(64).astype(np.uint32)
        for k in range(8):
            reqs["r%d" % k] = (pb[k * 8:(k + 1) * 8], db[k * 8:(k + 1) * 8])
        for k in range(0, 8, 2):
            dec.expect("r%d" % k, 20)
            pre.push("r%d" % k, reqs["r%d" % k][0], to_dec, reqs["r%d" % k][1], deadline=10)
        for k in range(1, 8, 2):
            dec.pull("r%d" % k, reqs["r%d" % k][1], to_pre, reqs["r%d" % k][0], deadline=10)
        want = set(reqs)
        sent, recv, failed = collect([dec, pre], lambda s, r, f: f or (s == want and r == want))
        assert not failed and recv == want and sent == want
        for i in range(lay.regions):
            s = src[i].reshape(64, 8192)
            d = dst[i].reshape(64, 8192)
            for p_blocks, d_blocks in reqs.values():
                assert np.array_equal(d[d_blocks], s[p_blocks])
        assert pre.pending() == 0 and dec.pending() == 0
        del src, dst, s, d


@pytest.mark.parametrize("pre_tp,dec_tp", [(1, 2), (2, 1), (1, 4)])
def test_heterogeneous_tp_head_slices(daemons, pre_tp, dec_tp):
    """Decode ranks pull from prefill ranks of another TP size; every head lands."""
    a, b = daemons
    heads_total, head_bytes, blocks, layers = 8, 512, 16, 2
    with rdmax.Client(a.socket) as ca, rdmax.Client(b.socket) as cb:
        pres = []
        for r in range(pre_tp):
            lay = kv.Layout(layers, blocks, heads_total // pre_tp * head_bytes, kv_per_layer=1,
                            num_heads=heads_total // pre_tp, tp_rank=r, tp_size=pre_tp)
            ag = kv.Agent(ca, lay, "pre")
            ag.alloc_caches()
            pres.append(ag)
        decs = []
        for r in range(dec_tp):
            lay = kv.Layout(layers, blocks, heads_total // dec_tp * head_bytes, kv_per_layer=1,
                            num_heads=heads_total // dec_tp, tp_rank=r, tp_size=dec_tp)
            ag = kv.Agent(cb, lay, "dec")
            ag.alloc_caches()
            decs.append(ag)
        # A full block's heads across the prefill ranks: head h of rank r is global
        # head r * per + h. Fill each head slice with its global head number and block.
        for r, ag in enumerate(pres):
            per = heads_total // pre_tp
            for li, reg in enumerate(ag.regions):
                x = np.frombuffer(reg, dtype=np.uint8).reshape(blocks, per, head_bytes)
                for blk in range(blocks):
                    for h in range(per):
                        x[blk, h, :] = (li * 64 + blk * 8 + r * per + h) % 251
                del x
        peers = [None] * pre_tp
        for ag in decs:
            peers = [ag.add_peer(p.handshake()) for p in pres]
        pblk, dblk = [3, 9, 4], [0, 7, 12]
        for r, ag in enumerate(decs):
            ag.pull("q%d" % r, dblk, peers if dec_tp < pre_tp else peers[ag.layout.tp_rank *
                                                                          pre_tp // dec_tp],
                    pblk, deadline=10)
        want = {"q%d" % r for r in range(dec_tp)}
        sent, recv, failed = collect(decs + pres, lambda s, r, f: f or (r == want and s == want))
        assert not failed and recv == want and sent == want
        for r, ag in enumerate(decs):
            per = heads_total // dec_tp
            for li, reg in enumerate(ag.regions):
                x = np.frombuffer(reg, dtype=np.uint8).reshape(blocks, per, head_bytes)
                for pb, db in zip(pblk, dblk):
                    for h in range(per):
                        want = (li * 64 + pb * 8 + r * per + h) % 251
                        assert (x[db, h] == want).all(), (r, li, db, h)
                del x


def test_tp_ratio_must_be_integer():
    with pytest.raises(ValueError):
        kv.head_slices(kv.Layout(1, 4, 2048, num_heads=2, tp_rank=0, tp_size=3),
                       kv.Layout(1, 4, 3072, num_heads=3, tp_rank=0, tp_size=2))


def test_failures_are_named(daemons):
    a, b = daemons
    lay = kv.Layout(1, 16, 4096)
    with rdmax.Client(a.socket) as ca, rdmax.Client(b.socket) as cb:
        pre, dec = kv.Agent(ca, lay, "prefill"), kv.Agent(cb, lay, "decode")
        pre.alloc_caches()
        dec.alloc_caches()
        to_dec = pre.add_peer(dec.handshake())
        to_pre = dec.add_peer(pre.handshake())
        # A block past the end: OutOfRange for that request only.
        pre.push("bad", [0], to_dec, [99], deadline=5)
        pre.push("good", [1], to_dec, [2], deadline=5)
        end = time.monotonic() + 10
        failed, sent = {}, set()
        while ("bad" not in failed or "good" not in sent) and time.monotonic() < end:
            s, _, f = pre.get_finished()
            sent |= s
            failed.update(f)
            pre.wait(0.2)
        assert isinstance(failed["bad"], rdmax.OutOfRange) and "good" in sent
        # Nothing pushed for an expected request: Timeout at its deadline.
        dec.expect("never", 0.3)
        t0 = time.monotonic()
        failed = {}
        while "never" not in failed and time.monotonic() - t0 < 5:
            failed.update(dec.get_finished()[2])
            dec.wait(0.1)
        assert isinstance(failed["never"], rdmax.Timeout)
        # The peer dies: the pull fails with a named error within its deadline.
        ca.write(pre.regions[0], to_dec.descs[0], 1).wait(10)
        a.kill()
        t0 = time.monotonic()
        dec.pull("orphan", [0, 1], to_pre, [2, 3], deadline=2)
        failed = {}
        while "orphan" not in failed and time.monotonic() - t0 < 10:
            failed.update(dec.get_finished()[2])
            dec.wait(0.2)
        assert isinstance(failed.get("orphan"),
                          (rdmax.Timeout, rdmax.TransportError, rdmax.Unreachable)), failed
        assert time.monotonic() - t0 < 2 + 3


def test_two_process_example(daemons):
    """docs/examples/kv_prefill_decode.py: 24 requests, push and pull, every byte checked."""
    a, b = daemons
    d = a.dir
    env = dict(os.environ)
    ex = os.path.join(ROOT, "docs", "examples", "kv_prefill_decode.py")
    dec = subprocess.Popen([sys.executable, ex, "decode", "--socket", b.socket, "--dir", d],
                           stdout=subprocess.PIPE, env=env)
    pre = subprocess.run([sys.executable, ex, "prefill", "--socket", a.socket, "--dir", d],
                         stdout=subprocess.PIPE, env=env, timeout=120)
    out, _ = dec.communicate(timeout=120)
    assert pre.returncode == 0 and dec.returncode == 0
    assert b"verified" in out
    sums = {line.split()[-1] for line in (pre.stdout + out).splitlines() if b"checksum" in line}
    assert len(sums) == 1


def test_request_is_one_job_of_region_pairs(daemons):
    """Every layer's K and V move as one job of region pairs; against a daemon that
    predates pairs (max_paged_pairs 1) the agent falls back to one job per region."""
    a, b = daemons
    lay = kv.Layout(2, 16, 4096, kv_per_layer=2)
    with rdmax.Client(a.socket) as ca, rdmax.Client(b.socket) as cb:
        assert ca.info()["max_paged_pairs"] == 256
        pre, dec = kv.Agent(ca, lay, "prefill"), kv.Agent(cb, lay, "decode")
        pre.alloc_caches()
        dec.alloc_caches()
        src = fill_all(pre, 9)
        dst = [np.frombuffer(r, dtype=np.uint8) for r in dec.regions]
        to_dec = pre.add_peer(dec.handshake())
        jobs = pre._jobs(rdmax.OP_PAGED_WRITE, [1, 5, 6], [to_dec], [2, 9, 3], None)
        assert len(jobs) == 1 and len(jobs[0].pairs) == lay.regions - 1
        # One completion carrying the bytes of every region.
        ca.submit(jobs)
        for j in jobs:
            j.wait(10)
        assert jobs[0].bytes == lay.regions * 3 * 4096
        for i in range(lay.regions):
            s, d = src[i].reshape(16, 4096), dst[i].reshape(16, 4096)
            assert np.array_equal(d[[2, 9, 3]], s[[1, 5, 6]])
        pre._max_pairs = 1
        jobs = pre._jobs(rdmax.OP_PAGED_WRITE, [7], [to_dec], [11], None)
        assert len(jobs) == lay.regions and all(j.pairs is None for j in jobs)
        ca.submit(jobs)
        for j in jobs:
            j.wait(10)
        for i in range(lay.regions):
            assert np.array_equal(dst[i].reshape(16, 4096)[11], src[i].reshape(16, 4096)[7])
        # A pair whose region is too short is refused by its index, nothing moved.
        small = cb.alloc_host(4096, rdmax.ACCESS_REMOTE_WRITE)
        bad = rdmax.Job(rdmax.OP_PAGED_WRITE, pre.regions[0], to_dec.descs[0], page_len=4096,
                        local_pages=[0], remote_pages=[12],
                        pairs=[(pre.regions[1], to_dec.descs[1]), (pre.regions[2], small.desc())])
        ca.submit([bad])
        with pytest.raises(rdmax.OutOfRange, match="pair 2: the pages reach byte"):
            bad.wait(10)
        assert not dst[0].reshape(16, 4096)[12].any()
        with pytest.raises(ValueError, match="region pairs"):
            rdmax.Job(rdmax.OP_WRITE, pre.regions[0], to_dec.descs[0], length=8,
                      pairs=[(pre.regions[1], to_dec.descs[1])])
        del src, dst, s, d
