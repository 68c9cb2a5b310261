# SPDX-License-Identifier: MIT
"""SCATTER, BARRIER and peer groups from Python against three real daemons
over TCP: bytes compared, imm landings counted, errors named."""
import asyncio

import numpy as np
import pytest

import conftest
import rdmax

KiB = 1024
IMM_SCATTER = 0x5CA77E00
IMM_BARRIER = 0xBA221E00


@pytest.fixture
def three():
    """Three daemons: n0 (the sender's node), n1, n2."""
    ds = []
    try:
        for name in ("n0", "n1", "n2"):
            ds.append(conftest.Daemon(name, ["engine.chunk_bytes=16384"]))
        yield ds
    finally:
        for d in ds:
            d.stop()


def fill(region, seed):
    a = np.frombuffer(region, dtype=np.uint8)
    a[:] = np.random.default_rng(seed).integers(0, 256, a.size, dtype=np.uint8)
    return a


def test_scatter_by_descriptor_and_by_group(three):
    size = 256 * KiB
    recv = [rdmax.Client(d.socket, "receiver") for d in three]
    sender = rdmax.Client(three[0].socket, "sender")
    try:
        dst = [c.alloc_host(size, rdmax.ACCESS_REMOTE_WRITE) for c in recv]
        view = [np.frombuffer(r, dtype=np.uint8) for r in dst]
        desc = [r.desc() for r in dst]
        for c in recv:
            # Each node counts each scatter once, whatever its number of destinations there.
            c.expect_imm(IMM_SCATTER, 2)
        src = sender.alloc_host(size)
        s = fill(src, 1)

        # By descriptors: node 1 twice (two ranges), node 2 once, node 0 (local) once.
        dests = [rdmax.Dest(desc[1], length=100 * KiB),
                 rdmax.Dest(desc[2], remote_offset=1, local_offset=100 * KiB, length=50 * KiB),
                 (desc[1], 0, 128 * KiB, 150 * KiB, 77),
                 rdmax.Dest(rdmax.Desc(desc[0]), remote_offset=5, local_offset=200 * KiB,
                            length=56 * KiB)]
        job = sender.scatter(src, dests, imm=IMM_SCATTER)
        assert job.wait(10) is job
        assert job.status == 0 and job.bytes == 100 * KiB + 50 * KiB + 77 + 56 * KiB
        assert np.array_equal(view[1][:100 * KiB], s[:100 * KiB])
        assert np.array_equal(view[1][128 * KiB:128 * KiB + 77], s[150 * KiB:150 * KiB + 77])
        assert np.array_equal(view[2][1:1 + 50 * KiB], s[100 * KiB:150 * KiB])
        assert np.array_equal(view[0][5:5 + 56 * KiB], s[200 * KiB:256 * KiB])
        for c in recv:
            with pytest.raises(rdmax.Timeout):
                c.wait_imm(IMM_SCATTER, 0.05)  # one of two scatters so far

        # Through a peer group, members in another order, destinations by index.
        group = sender.peer_group([desc[2], desc[0], rdmax.Desc(desc[1])])
        assert len(group) == 3 and group.alive
        assert [bytes(m) for m in group.members] == [desc[2], desc[0], desc[1]]
        s = fill(src, 2)
        job = sender.scatter(src, [rdmax.Dest(None, i, 64 * KiB, i * 64 * KiB, 64 * KiB)
                                   for i in range(3)], group=group, imm=IMM_SCATTER)
        job.wait(10)
        assert job.bytes == 3 * 64 * KiB
        for c in recv:
            assert c.wait_imm(IMM_SCATTER, 10) == 2
        assert np.array_equal(view[2][64 * KiB:128 * KiB], s[:64 * KiB])
        assert np.array_equal(view[0][64 * KiB:128 * KiB], s[64 * KiB:128 * KiB])
        assert np.array_equal(view[1][64 * KiB:128 * KiB], s[128 * KiB:192 * KiB])

        # A member index past the group is named in the completion.
        bad = sender.scatter(src, [rdmax.Dest(None, 3, 0, 0, 16)], group=group)
        with pytest.raises(rdmax.OutOfRange):
            bad.wait(10)
        assert bad.status == rdmax.OutOfRange.code and bad.reason
        # A range outside the destination region, likewise.
        with pytest.raises(rdmax.OutOfRange):
            sender.scatter(src, [rdmax.Dest(desc[1], remote_offset=size, length=1)]).wait(10)

        # A destroyed group can no longer be named; destroying twice is harmless.
        group.destroy()
        assert not group.alive
        group.destroy()
        with pytest.raises(ValueError):
            sender.scatter(src, [rdmax.Dest(None, 0, 0, 0, 16)], group=group)
        del s, view
    finally:
        sender.close()
        for c in recv:
            c.close()


def test_barrier_across_a_group(three):
    cs = [rdmax.Client(d.socket, d.name) for d in three]
    try:
        rs = [c.alloc_host(4096, rdmax.ACCESS_REMOTE_WRITE) for c in cs]
        desc = [r.desc() for r in rs]
        groups = [c.peer_group(desc) for c in cs]
        for rnd in range(2):
            imm = IMM_BARRIER + rnd
            for c in cs:
                c.expect_imm(imm, 3)  # every group holds all three nodes, itself included
            for i, c in enumerate(cs):
                if rnd == 0:
                    job = c.barrier(imm, group=groups[i])
                else:
                    job = c.barrier(imm, remotes=desc)
                job.wait(10)
                assert job.status == 0 and job.bytes == 0
                if i < 2:
                    # Not everybody arrived yet: the last node's barrier stays closed.
                    with pytest.raises(rdmax.Timeout):
                        cs[2].wait_imm(imm, 0.1)
            for c in cs:
                assert c.wait_imm(imm, 10) == 3
                assert c.poll(0.05) == []  # nothing counted twice
        for g in groups:
            g.destroy()

        # The receiving node checks the region: no remote write access is refused by name.
        ro = cs[1].alloc_host(4096, rdmax.ACCESS_REMOTE_READ)
        with pytest.raises(rdmax.RemoteAccess):
            cs[0].barrier(IMM_BARRIER + 9, remotes=[ro.desc()]).wait(10)
        with pytest.raises(ValueError):
            rdmax.Job(rdmax.OP_BARRIER, remotes=desc)  # no imm
        with pytest.raises(rdmax.InvalidArgument):
            cs[0].barrier(1, remotes=[])  # neither a group nor descriptors
    finally:
        for c in cs:
            c.close()


def test_mixed_batch_and_asyncio(three):
    """SCATTER and BARRIER in one batch with a WRITE, awaited with asyncio."""
    a, b, c = three
    with rdmax.Client(a.socket) as ca, rdmax.Client(b.socket) as cb, \
            rdmax.Client(c.socket) as cc:
        src = ca.alloc_host(64 * KiB)
        s = fill(src, 3)
        rb = cb.alloc_host(64 * KiB, rdmax.ACCESS_REMOTE_WRITE)
        rc = cc.alloc_host(64 * KiB, rdmax.ACCESS_REMOTE_WRITE)
        group = ca.peer_group([rb.desc(), rc.desc()])
        imm = 0x4D1C
        cb.expect_imm(imm, 3)  # WRITE, SCATTER and BARRIER each land once on node b
        cc.expect_imm(imm, 2)  # SCATTER and BARRIER

        async def main():
            jobs = ca.submit([
                rdmax.Job(rdmax.OP_WRITE, src, rb.desc(), length=1000, imm=imm),
                rdmax.Job(rdmax.OP_SCATTER, src, group=group, imm=imm,
                          dests=[rdmax.Dest(None, 0, 4096, 0, 4096),
                                 rdmax.Dest(None, 1, 8192, 4096, 8192)]),
                rdmax.Job(rdmax.OP_BARRIER, group=group, imm=imm, deadline=10),
            ])
            await asyncio.wait_for(asyncio.gather(*jobs), 10)
            return jobs

        jobs = asyncio.run(main())
        assert [j.status for j in jobs] == [0, 0, 0]
        assert [j.bytes for j in jobs] == [1000, 4096 + 8192, 0]
        assert all(j.progress() is None for j in jobs)
        assert cb.wait_imm(imm, 10) == 3 and cc.wait_imm(imm, 10) == 2
        vb, vc = np.frombuffer(rb, dtype=np.uint8), np.frombuffer(rc, dtype=np.uint8)
        assert np.array_equal(vb[:1000], s[:1000])
        assert np.array_equal(vb[4096:8192], s[:4096])
        assert np.array_equal(vc[8192:16384], s[4096:12288])
        del vb, vc, s


def test_group_membership_and_limits(daemons):
    a, b = daemons
    with rdmax.Client(a.socket) as ca, rdmax.Client(b.socket) as cb:
        r = cb.alloc_host(4096, rdmax.ACCESS_REMOTE_WRITE)
        d = r.desc()
        with pytest.raises(rdmax.InvalidArgument):
            ca.peer_group([])
        with pytest.raises(TypeError):
            ca.peer_group([object()])
        with pytest.raises(rdmax.InvalidArgument):
            ca.peer_group([b"\x00garbage"])
        # The same node twice is one node: a barrier counts once there.
        g = ca.peer_group([d, d])
        assert len(g) == 2
        cb.expect_imm(0x99, 1)
        ca.barrier(0x99, group=g).wait(10)
        assert cb.wait_imm(0x99, 10) == 1
        with pytest.raises(rdmax.Timeout):
            cb.wait_imm(0x99, 0.1)
        # A group belongs to its client.
        src = cb.alloc_host(4096)
        with pytest.raises(ValueError):
            cb.scatter(src, [rdmax.Dest(None, 0, 0, 0, 8)], group=g)
        # A peer_index destination needs a group: refused before anything is sent.
        with pytest.raises(rdmax.InvalidArgument):
            cb.scatter(src, [rdmax.Dest(None, 0, 0, 0, 8)])
        # Groups are bounded per client.
        more = []
        with pytest.raises(rdmax.ResourceExhausted):
            for _ in range(200):
                more.append(ca.peer_group([d]))
        assert 1 <= len(more) < 200
        for x in more:
            x.destroy()
        ca.peer_group([d]).destroy()  # room again
    # Closing the client ends its groups with it.
    assert not g.alive
    g.destroy()
