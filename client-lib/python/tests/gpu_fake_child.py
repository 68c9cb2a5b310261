# SPDX-License-Identifier: MIT
"""Run by test_gpu_fake_driver.py with LD_LIBRARY_PATH naming the fake
libcuda.so.1: registers GPU tensors of every kind through rdmax against the
fake GPU daemon whose socket is argv[1]. Exits 0 after printing "ok", or
with the failed assertion."""
import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdmax  # noqa: E402
from gpufakes import KCPU, FakeCAI, FakeDLPack, FakeTorch  # noqa: E402

MiB = 1 << 20
FAKE_MANAGED = 3  # enum fake_kind

cuda = ctypes.CDLL("libcuda.so.1")  # the library librdmax loads: the fake's, by LD_LIBRARY_PATH
cuda.fakecuda_alloc.restype = ctypes.c_uint64
cuda.fakecuda_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int]
cuda.fakecuda_alloc_kind.restype = ctypes.c_uint64
cuda.fakecuda_alloc_kind.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
cuda.fakecuda_exports.argtypes = [ctypes.POINTER(ctypes.c_uint64)]


def exports():
    size = ctypes.c_uint64()
    n = cuda.fakecuda_exports(ctypes.byref(size))
    return n, size.value


def raises(exc, fn, *args):
    try:
        fn(*args)
    except exc as e:
        return e
    raise AssertionError("%s did not raise %s" % (fn, exc.__name__))


with rdmax.Client(sys.argv[1], "gpu-child") as c:
    caps = c.info()["capabilities"]
    assert caps & 0x2 and caps & 0x4, caps  # RDMAX_CAP_VERBS and RDMAX_CAP_DMABUF
    base = cuda.fakecuda_alloc(4 * MiB, 0)
    assert base and base % (2 * MiB) == 0

    # __cuda_array_interface__ (cupy, numba): the whole allocation is exported once.
    cai = FakeCAI(base + 4096, (1024,), "<f4")
    r1 = c.register_gpu_tensor(cai, rdmax.ACCESS_REMOTE_WRITE)
    assert (r1.addr, r1.length) == (base + 4096, 4096)
    rdmax.Desc(r1.desc())
    assert exports() == (1, 4 * MiB), exports()

    # data_ptr() (torch): the daemon holds that allocation's dma-buf, no second export.
    r2 = c.register_gpu_tensor(FakeTorch(base + 3 * MiB, 512, 2))
    assert (r2.addr, r2.length) == (base + 3 * MiB, 1024)
    assert exports()[0] == 1

    # A DLPack capsule: consumed, and released when the region is freed.
    dl = FakeDLPack((16, 16), bits=16, data=base, byte_offset=65536)
    r3 = c.register_gpu_tensor(dl, rdmax.ACCESS_REMOTE_READ)
    assert (r3.addr, r3.length) == (base + 65536, 512)
    assert dl.names() == [b"used_dltensor"] and dl.deleted == 0
    r3.free()
    assert dl.deleted == 1

    # Memory of the second GPU, through DLPack without __dlpack_device__.
    base1 = cuda.fakecuda_alloc(2 * MiB, 1)
    dl1 = FakeDLPack((1024,), bits=8, data=base1, with_device=False)
    r4 = c.register_gpu_tensor(dl1)
    assert (r4.addr, r4.length) == (base1, 1024)
    assert exports() == (2, 2 * MiB), exports()

    # Refusals, named, before anything reaches the daemon.
    managed = cuda.fakecuda_alloc_kind(FAKE_MANAGED, MiB, 0)
    raises(rdmax.GpuNotDeviceMemory, c.register_gpu_tensor, FakeCAI(managed, (256,), "<f4"))
    raises(rdmax.GpuNotDeviceMemory, c.register_gpu_tensor, FakeCAI(0x10000, (16,), "<f4"))
    raises(rdmax.OutOfRange, c.register_gpu_tensor, FakeTorch(base + 4 * MiB - 512, 1024, 1))
    raises(rdmax.GpuNotDeviceMemory, c.register_gpu_tensor, np.zeros(16))
    raises(rdmax.GpuNotDeviceMemory, c.register_gpu_tensor, FakeDLPack((4,), device=KCPU))
    r1.free()
    r2.free()
    r4.free()
    assert dl1.deleted == 1
print("ok")
