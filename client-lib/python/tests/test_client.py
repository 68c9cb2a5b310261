# SPDX-License-Identifier: MIT
"""The rdmax Client against real daemons over TCP: every call, bytes compared."""
import array
import asyncio
import os
import subprocess
import threading

import numpy as np
import pytest

import conftest
import rdmax


def fill(region, seed):
    a = np.frombuffer(region, dtype=np.uint8)
    a[:] = np.random.default_rng(seed).integers(0, 256, a.size, dtype=np.uint8)
    return a


def test_version_and_errors():
    assert rdmax.__version__ == "2.1.0"
    assert rdmax.ABI_VERSION == 2
    assert rdmax.err_name(rdmax.Timeout.code) == "RDMAX_E_TIMEOUT"
    assert issubclass(rdmax.Timeout, TimeoutError) and issubclass(rdmax.Timeout, rdmax.Error)
    assert rdmax.NotFound.code == -1002
    e = rdmax.error_for(-1004, "past the end")
    assert isinstance(e, rdmax.OutOfRange) and e.args == (-1004, "past the end")
    with pytest.raises(FileNotFoundError):
        rdmax.Client("/nonexistent/rdmax.sock")


def test_regions_are_buffers(daemon):
    with rdmax.Client(daemon.socket, "py") as c:
        info = c.info()
        assert info["node_name"] == "solo" and info["protocol_version"] == 1
        r = c.alloc_host(10000, rdmax.ACCESS_REMOTE_WRITE)
        assert r.length == 12288 and r.addr != 0 and r.id > 0
        a = np.frombuffer(r, dtype=np.uint32)
        a[:] = np.arange(a.size, dtype=np.uint32)
        assert bytes(memoryview(r)[4:8]) == (1).to_bytes(4, "little")
        with pytest.raises(BufferError):
            r.free()  # a view is alive
        del a
        d = r.desc()
        assert isinstance(d, bytes) and bytes(rdmax.Desc(d)) == d
        with pytest.raises(rdmax.InvalidArgument):
            rdmax.Desc(b"\x00garbage")
        r.free()
        with pytest.raises(ValueError):
            r.length
        with pytest.raises(rdmax.InvalidArgument):
            c.alloc_host(0)


def test_close_with_live_views(daemon):
    c = rdmax.Client(daemon.socket)
    r = c.alloc_host(4096)
    a = np.frombuffer(r, dtype=np.uint8)
    c.close()  # deferred: the view keeps the memory mapped
    a[:] = 7  # still valid memory
    with pytest.raises(ValueError):
        c.alloc_host(4096)
    with pytest.raises(ValueError):
        r.desc()
    del a  # the last view: the client closes now
    with pytest.raises(ValueError):
        c.fileno()


def test_register_fd(daemon):
    import fcntl
    fd = os.memfd_create("py", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 8192)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    with rdmax.Client(daemon.socket) as c:
        r = c.register_fd(fd, 0, 8192, rdmax.ACCESS_REMOTE_READ)
        assert r.length == 8192
        with pytest.raises(BufferError):
            memoryview(r)  # not mapped by the library
        r.free()
        with pytest.raises(rdmax.InvalidArgument):
            c.register_fd(fd, 1, 4096)  # unaligned offset
    os.close(fd)


def test_write_read_paged_between_daemons(daemons):
    a, b = daemons
    with rdmax.Client(a.socket, "prefill") as ca, rdmax.Client(b.socket, "decode") as cb:
        src = ca.alloc_host(1 << 20, rdmax.ACCESS_REMOTE_READ)
        dst = cb.alloc_host(1 << 20, rdmax.ACCESS_REMOTE_WRITE | rdmax.ACCESS_REMOTE_READ)
        s = fill(src, 1)
        d = np.frombuffer(dst, dtype=np.uint8)
        ddesc = rdmax.Desc(dst.desc())

        job = ca.write(src, ddesc, 100000, local_offset=3, remote_offset=7)
        assert job.wait(10) is job and job.status == 0 and job.bytes == 100000
        assert np.array_equal(d[7:100007], s[3:100003])

        back = ca.alloc_host(1 << 20)
        bk = np.frombuffer(back, dtype=np.uint8)
        ca.read(back, dst.desc(), 4096, remote_offset=7).wait(10)
        assert np.array_equal(bk[:4096], s[3:4099])

        # Paged write: numpy int64 and uint32 indices, converted in C.
        page = 4096
        si = np.array([5, 0, 9, 3], dtype=np.int64)
        di = np.array([1, 7, 2, 30], dtype=np.uint32)
        ca.paged_write(src, ddesc, page, si, di).wait(10)
        for x, y in zip(si, di):
            assert np.array_equal(d[y * page:(y + 1) * page], s[x * page:(x + 1) * page])

        # Paged read, pulling from the prefill side with a head-slice offset and stride.
        r = cb.alloc_host(1 << 20)
        rr = np.frombuffer(r, dtype=np.uint8)
        li = array.array("I", [4, 2])
        job = cb.paged_read(r, src.desc(), 1024, li, [3, 1], remote_pages_offset=2048,
                            remote_pages_stride=8192)
        job.wait(10)
        assert job.bytes == 2048
        assert np.array_equal(rr[4096:5120], s[2048 + 3 * 8192:2048 + 3 * 8192 + 1024])
        assert np.array_equal(rr[2048:3072], s[2048 + 8192:2048 + 8192 + 1024])

        # The daemon counts PAGED_READ under its own kind (rdmaxctl stats).
        stats = subprocess.run([os.path.join(conftest.BUILD, "rdmaxctl"), "--socket",
                                os.path.join(b.dir, "admin.sock"), "stats", "--prometheus"],
                               stdout=subprocess.PIPE, text=True, check=True).stdout
        assert 'rdmaxd_jobs_total{op="paged_read",status="ok"} 1' in stats
        assert 'rdmaxd_job_bytes_total{op="paged_read",status="ok"} 2048' in stats

        with pytest.raises(rdmax.OutOfRange) as ei:
            cb.paged_read(r, src.desc(), 4096, [0], [1000]).wait(10)
        assert "source page 1000" in str(ei.value.args[1])
        with pytest.raises(ValueError):
            cb.paged_read(r, src.desc(), 4096, np.array([-1]), [0])
        with pytest.raises(TypeError):
            cb.paged_read(r, src.desc(), 4096, np.array([0.5]), [0])
        del s, d, bk, rr


def test_batch_poll_status_cancel(daemons):
    a, b = daemons
    with rdmax.Client(a.socket) as ca, rdmax.Client(b.socket) as cb:
        src = ca.alloc_host(1 << 16)
        dst = cb.alloc_host(1 << 16, rdmax.ACCESS_REMOTE_WRITE)
        desc = dst.desc()
        jobs = ca.submit([rdmax.Job(rdmax.OP_WRITE, src, desc, length=4096,
                                    local_offset=i * 4096, remote_offset=i * 4096)
                          for i in range(16)])
        seen = set()
        while len(seen) < 16:
            for ev in ca.poll(timeout=10):
                assert ev.type == rdmax.Event.COMPLETION and ev.status == 0
                seen.add(ev.job_id)
        assert seen == {j.id for j in jobs}
        assert all(j.done and j.status == 0 and j.bytes == 4096 for j in jobs)
        assert jobs[0].progress() is None
        assert ca.poll(0) == []
        # Refused by the library at submit, or by the daemon in the completion.
        with pytest.raises(rdmax.OutOfRange):
            ca.write(src, desc, 1 << 20)
        bad = ca.write(src, desc, 4096, remote_offset=1 << 16)
        with pytest.raises(rdmax.OutOfRange) as ei:
            bad.wait(10)
        assert "outside" in ei.value.args[1] and bad.status == rdmax.OutOfRange.code
        # cancel() of a finished job is harmless.
        bad.cancel()


def test_imm_and_mailbox(daemons):
    a, b = daemons
    with rdmax.Client(a.socket) as ca, rdmax.Client(b.socket) as cb:
        src = ca.alloc_host(8192)
        dst = cb.alloc_host(8192, rdmax.ACCESS_REMOTE_WRITE)
        cb.expect_imm(0x77, 2)
        ca.write(src, dst.desc(), 10, imm=0x77)
        ca.write(src, dst.desc(), 10, imm=0x77)
        assert cb.wait_imm(0x77, 10) == 2
        addr = cb.mailbox_open("decode.ctl")
        assert isinstance(addr, bytes) and addr
        ca.send(addr, b"hello").wait(10)
        box, payload, frm = cb.recv("decode.ctl", 10)
        assert (box, payload, frm) == ("decode.ctl", b"hello", "prefill")
        ca.send(addr, b"named", mailbox="decode.ctl").wait(10)
        assert cb.recv("decode.ctl", 10)[1] == b"named"
        # A region descriptor is no mailbox address; a name must be the address's.
        with pytest.raises(rdmax.InvalidArgument):
            ca.send(dst.desc(), b"x").wait(10)
        with pytest.raises(rdmax.InvalidArgument):
            ca.send(addr, b"x", mailbox="other").wait(10)
        # The same name in this uid's namespace is taken.
        with pytest.raises(rdmax.AlreadyExists):
            cb.mailbox_open("decode.ctl")
        with pytest.raises(rdmax.Timeout):
            cb.recv("decode.ctl", 0.05)
        cb.mailbox_close("decode.ctl")
        # Closed: the address reaches nothing; reopened: a new key, the old one stays refused.
        with pytest.raises(rdmax.NotFound):
            ca.send(addr, b"x").wait(10)
        addr2 = cb.mailbox_open("decode.ctl")
        assert addr2 != addr
        with pytest.raises(rdmax.NotFound):
            ca.send(addr, b"x").wait(10)
        ca.send(addr2, b"again").wait(10)
        assert cb.recv("decode.ctl", 10)[1] == b"again"
        cb.mailbox_close("decode.ctl")


def test_writer_and_poller_threads(daemons):
    """A writer thread submits while a poller thread collects, on one client."""
    a, b = daemons
    n = 2000
    with rdmax.Client(a.socket) as ca, rdmax.Client(b.socket) as cb:
        src = ca.alloc_host(1 << 16)
        dst = cb.alloc_host(1 << 16, rdmax.ACCESS_REMOTE_WRITE)
        desc = rdmax.Desc(dst.desc())
        done, errors = [], []
        sem = threading.Semaphore(64)

        def writer():
            for i in range(n):
                sem.acquire()
                try:
                    ca.write(src, desc, 64, local_offset=(i % 1000) * 64,
                             remote_offset=(i % 1000) * 64)
                except Exception as e:  # pragma: no cover - reported below
                    errors.append(e)
                    return

        def poller():
            while len(done) < n and not errors:
                for ev in ca.poll(timeout=1):
                    if ev.type == rdmax.Event.COMPLETION:
                        done.append(ev)
                        sem.release()

        ts = [threading.Thread(target=writer), threading.Thread(target=poller)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert not errors
        assert len(done) == n and len({e.job_id for e in done}) == n
        assert all(e.status == 0 for e in done)


def test_wait_and_poll_from_two_threads(daemons):
    """Job.wait() in one thread is never robbed by poll() in another."""
    a, b = daemons
    with rdmax.Client(a.socket) as ca, rdmax.Client(b.socket) as cb:
        src = ca.alloc_host(1 << 16)
        dst = cb.alloc_host(1 << 16, rdmax.ACCESS_REMOTE_WRITE)
        desc = dst.desc()
        stop = threading.Event()

        def poller():
            while not stop.is_set():
                ca.poll(timeout=0.01)

        t = threading.Thread(target=poller)
        t.start()
        try:
            for _ in range(300):
                ca.write(src, desc, 128).wait(10)
        finally:
            stop.set()
            t.join()


def test_asyncio(daemons):
    a, b = daemons

    async def main(ca, src, desc, cb):
        jobs = [ca.write(src, desc, 256, remote_offset=i * 256) for i in range(32)]
        await asyncio.gather(*jobs)
        assert all(j.status == 0 for j in jobs)
        cb.expect_imm(5, 1)
        ca.write(src, desc, 1, imm=5)
        assert await asyncio.wait_for(cb.wait_imm_async(5), 10) == 1
        with pytest.raises(rdmax.OutOfRange):
            await ca.write(src, desc, 1 << 20)

    with rdmax.Client(a.socket) as ca, rdmax.Client(b.socket) as cb:
        src = ca.alloc_host(1 << 16)
        dst = cb.alloc_host(1 << 16, rdmax.ACCESS_REMOTE_WRITE)
        asyncio.run(main(ca, src, dst.desc(), cb))


def test_standing_imm_claim(daemons):
    """One claim for every request of a slot: each round fires once, with its
    bytes in place; released, it fires no more and the landings stay counted."""
    a, b = daemons
    with rdmax.Client(a.socket) as ca, rdmax.Client(b.socket) as cb:
        src = ca.alloc_host(4 * 4096)
        dst = cb.alloc_host(4096, rdmax.ACCESS_REMOTE_WRITE)
        with pytest.raises(rdmax.NotFound):
            cb.release_imm(0x55)
        with pytest.raises(rdmax.InvalidArgument):
            cb.expect_imm(0x55, 0, standing=True)
        cb.expect_imm(0x55, 2, standing=True)
        for r in range(3):
            memoryview(src)[r * 4096:(r + 1) * 4096] = bytes([r + 1]) * 4096
            ca.write(src, dst.desc(), 2048, local_offset=r * 4096, imm=0x55).wait(10)
            ca.write(src, dst.desc(), 2048, local_offset=r * 4096 + 2048, remote_offset=2048,
                     imm=0x55).wait(10)
            assert cb.wait_imm(0x55, 10) == 2
            assert bytes(memoryview(dst)) == bytes([r + 1]) * 4096
        cb.release_imm(0x55)
        ca.write(src, dst.desc(), 1, imm=0x55).wait(10)
        ca.write(src, dst.desc(), 1, imm=0x55).wait(10)
        with pytest.raises(rdmax.Timeout):
            cb.wait_imm(0x55, 0.1)
        cb.expect_imm(0x55, 2)
        assert cb.wait_imm(0x55, 10) == 2

        # asyncio: firings that arrive before the await are kept for it.
        async def rounds():
            cb.expect_imm(0x56, 1, standing=True, reset=True)
            await ca.write(src, dst.desc(), 8, imm=0x56)
            await ca.write(src, dst.desc(), 8, imm=0x56)
            got = 0
            while got < 2:
                got += await asyncio.wait_for(cb.wait_imm_async(0x56), 10)
            assert got == 2
            cb.release_imm(0x56)

        asyncio.run(rounds())


def test_peer_death_fails_within_deadline(daemons):
    a, b = daemons
    with rdmax.Client(a.socket) as ca, rdmax.Client(b.socket) as cb:
        src = ca.alloc_host(1 << 20)
        dst = cb.alloc_host(1 << 20, rdmax.ACCESS_REMOTE_WRITE)
        desc = dst.desc()
        ca.write(src, desc, 4096).wait(10)  # connected
        b.kill()
        with pytest.raises((rdmax.Timeout, rdmax.TransportError, rdmax.Unreachable)):
            ca.write(src, desc, 1 << 20, deadline=2.0).wait(15)


def test_gpu_intake_reaches_the_driver(daemon):
    class FakeCAI:
        __cuda_array_interface__ = {"data": (0x7F0000000000, False), "shape": (256,),
                                    "typestr": "<f4", "version": 3}

    class FakeTorch:
        is_cuda = True

        def data_ptr(self):
            return 0x7F0000001000

        def numel(self):
            return 100

        def element_size(self):
            return 2

        def is_contiguous(self):
            return True

    assert rdmax.gpu_pointer(FakeCAI()) == (0x7F0000000000, 1024)
    assert rdmax.gpu_pointer(FakeTorch()) == (0x7F0000001000, 200)
    with pytest.raises(rdmax.GpuNotDeviceMemory):
        rdmax.gpu_pointer(np.zeros(4))  # DLPack, but on the CPU
    with pytest.raises(TypeError):
        rdmax.gpu_pointer(b"bytes")
    with rdmax.Client(daemon.socket) as c:
        # A TCP-only daemon (or no NVIDIA driver) is named; with both, the fake pointer is refused.
        with pytest.raises((rdmax.GpuNeedsRdma, rdmax.GpuDriverMissing, rdmax.GpuNotDeviceMemory)):
            c.register_gpu_tensor(FakeCAI())


@pytest.mark.parametrize("action", ["free", "close"])
def test_free_and_close_wait_for_a_submit_being_parsed(daemons, action):
    """Region.free() or Client.close() from another thread while a submit is
    between taking the region and the library call waits for that submit: the
    region it parsed is never freed under it."""
    a, b = daemons
    with rdmax.Client(a.socket) as ca, rdmax.Client(b.socket) as cb:
        src = ca.alloc_host(1 << 16)
        dst = cb.alloc_host(1 << 16, rdmax.ACCESS_REMOTE_WRITE)
        fill(src, 11)
        expect = bytes(memoryview(src)[:8192])
        desc = dst.desc()
        other = threading.Thread(target=src.free if action == "free" else ca.close)
        seen = []

        def pages():  # runs inside the submit, after the region was taken
            other.start()
            other.join(0.5)
            seen.append(other.is_alive())
            yield 0
            yield 1

        job = ca.paged_write(src, desc, 4096, pages(), [0, 1])
        other.join(30)
        assert seen == [True] and not other.is_alive()
        if action == "free":
            assert job.wait(10).status == 0
            assert bytes(memoryview(dst)[:8192]) == expect
        with pytest.raises(ValueError):
            src.desc()


def test_traffic_class(daemons):
    a, b = daemons
    with rdmax.Client(a.socket, "lat", traffic_class="latency") as ca, \
            rdmax.Client(b.socket) as cb:
        src = ca.alloc_host(1 << 16)
        dst = cb.alloc_host(1 << 16, rdmax.ACCESS_REMOTE_WRITE)
        s = fill(src, 5)
        d = np.frombuffer(dst, dtype=np.uint8)
        ca.write(src, dst.desc(), 65536).wait(10)  # the session's class: latency
        ca.write(src, dst.desc(), 4096, traffic_class="bulk").wait(10)
        ca.submit(rdmax.Job(rdmax.OP_WRITE, src, dst.desc(), length=8,
                            traffic_class=rdmax.CLASS_BULK)).wait(10)
        assert np.array_equal(d, s)
        with pytest.raises(rdmax.InvalidArgument) as ei:
            ca.write(src, dst.desc(), 4096, traffic_class=9).wait(10)
        assert "unknown traffic class 9" in str(ei.value.args[1])
        with pytest.raises(ValueError):
            ca.write(src, dst.desc(), 4096, traffic_class="fast")
        with pytest.raises(ValueError):
            rdmax.Client(a.socket, traffic_class="urgent")
        stats = subprocess.run([os.path.join(conftest.BUILD, "rdmaxctl"), "--socket",
                                os.path.join(a.dir, "admin.sock"), "stats", "--prometheus"],
                               stdout=subprocess.PIPE, text=True, check=True).stdout
        assert 'rdmaxd_class_jobs_total{class="latency",result="ok"} 1' in stats
        assert 'rdmaxd_class_jobs_total{class="bulk",result="ok"} 2' in stats
        assert 'rdmaxd_class_jobs_total{class="bulk",result="failed"} 1' in stats
        assert 'rdmaxd_class_bytes_total{class="latency"} 65536' in stats
        del s, d
