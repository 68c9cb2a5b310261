# SPDX-License-Identifier: MIT
"""GPU tensors into rdmax without a GPU: __cuda_array_interface__, data_ptr()
and DLPack capsules (a producer built here with ctypes to the DLPack ABI, and
numpy's own for CPU arrays), the capsule protocol (renamed "used_dltensor",
the deleter called exactly once), and the refusals, named."""
import sys

import numpy as np
import pytest

import rdmax
from rdmax import _rdmax

from gpufakes import (FAKE_DEV_PTR, KCPU, KCUDA_HOST, KCUDA_MANAGED, FakeCAI,
                      FakeDLPack, FakeTorch)


def test_dlpack_capsules_are_parsed_and_consumed():
    t = FakeDLPack((4, 8, 16), bits=16, byte_offset=256)
    assert rdmax.gpu_pointer(t) == (FAKE_DEV_PTR + 256, 4 * 8 * 16 * 2)
    assert t.deleted == 1 and t.names() == [b"used_dltensor"]
    # Strides of a C-contiguous tensor, size-1 dimensions with any stride, vector lanes.
    t = FakeDLPack((3, 1, 5), bits=32, lanes=2, strides=(5, 999, 1))
    assert rdmax.gpu_pointer(t) == (FAKE_DEV_PTR, 3 * 5 * 8)
    # A scalar is one element; pinned host memory (kDLCUDAHost) goes the GPU way too.
    assert rdmax.gpu_pointer(FakeDLPack((), bits=64, device=KCUDA_HOST)) == (FAKE_DEV_PTR, 8)
    # Without __dlpack_device__ the capsule's own device decides.
    t = FakeDLPack((10,), bits=8, with_device=False)
    assert rdmax.gpu_pointer(t) == (FAKE_DEV_PTR, 10)


def test_dlpack_refusals_leave_the_capsule_to_its_producer():
    for kw in ({"strides": (1, 4)},  # column-major
               {"strides": (8, 2)},  # every other element
               {"bits": 4},          # packed sub-byte type
               {"bits": 0}):
        t = FakeDLPack((4, 4), **kw)
        with pytest.raises(ValueError):
            rdmax.gpu_pointer(t)
        assert t.deleted == 0 and t.names() == [b"dltensor"]
    # Another device: refused by __dlpack_device__ before any export ...
    for dev in (KCPU, KCUDA_MANAGED, 10):
        t = FakeDLPack((16,), device=dev)
        with pytest.raises(rdmax.GpuNotDeviceMemory) as ei:
            rdmax.gpu_pointer(t)
        assert "device type %d" % dev in ei.value.args[1]
        assert t.capsules == []
    # ... or by the capsule's device, which is then consumed and released.
    t = FakeDLPack((16,), device=KCPU, with_device=False)
    with pytest.raises(rdmax.GpuNotDeviceMemory):
        rdmax.gpu_pointer(t)
    assert t.deleted == 1 and t.names() == [b"used_dltensor"]

    class Reuses:
        def __init__(self, cap):
            self.cap = cap

        def __dlpack__(self):
            return self.cap

    with pytest.raises(TypeError):
        _rdmax.dlpack_info(Reuses(t.capsules[0]))  # a used capsule is not taken twice
    with pytest.raises(TypeError):
        _rdmax.dlpack_info(Reuses(b"not a capsule"))


def test_numpy_dlpack_capsules():
    """numpy (>= 1.22) exports CPU arrays: parsed like any producer's, and released."""
    a = np.arange(1000, dtype=np.float32).reshape(10, 100)[2:7]
    refs = sys.getrefcount(a)
    assert _rdmax.dlpack_info(a) == (a.ctypes.data, 5 * 100 * 4, KCPU, 0)
    assert sys.getrefcount(a) == refs  # numpy's deleter ran
    b = np.arange(100, dtype=np.int16)[::3]
    refs = sys.getrefcount(b)
    with pytest.raises(ValueError):
        _rdmax.dlpack_info(b)  # strided
    assert sys.getrefcount(b) == refs  # left to numpy, which released it
    with pytest.raises(rdmax.GpuNotDeviceMemory):
        rdmax.gpu_pointer(a)  # CPU memory is not registered as GPU memory


def test_cai_and_data_ptr_objects():
    assert rdmax.gpu_pointer(FakeCAI(FAKE_DEV_PTR, (4, 64), "<f2")) == (FAKE_DEV_PTR, 512)
    with pytest.raises(ValueError):
        rdmax.gpu_pointer(FakeCAI(FAKE_DEV_PTR, (4, 64), strides=(4, 256)))
    assert rdmax.gpu_pointer(FakeTorch(FAKE_DEV_PTR + 64, 100, 2)) == (FAKE_DEV_PTR + 64, 200)
    with pytest.raises(ValueError):
        rdmax.gpu_pointer(FakeTorch(FAKE_DEV_PTR, 100, 2, contiguous=False))
    with pytest.raises(rdmax.GpuNotDeviceMemory):
        rdmax.gpu_pointer(FakeTorch(FAKE_DEV_PTR, 100, 2, cuda=False))
    with pytest.raises(TypeError):
        rdmax.gpu_pointer(b"bytes")


def test_register_gpu_tensor_reaches_the_library(daemon):
    """Each kind of tensor reaches rdmax_region_register_gpu(); a TCP-only daemon
    refuses GPU memory by name there (GpuNeedsRdma), and a consumed DLPack
    tensor is released exactly once on that refusal."""
    with rdmax.Client(daemon.socket) as c:
        assert not c.info()["capabilities"] & 0x2  # RDMAX_CAP_VERBS: this daemon runs TCP
        for t in (FakeCAI(FAKE_DEV_PTR, (256,)), FakeTorch(FAKE_DEV_PTR, 100, 2)):
            refs = sys.getrefcount(t)
            with pytest.raises(rdmax.GpuNeedsRdma):
                c.register_gpu_tensor(t, rdmax.ACCESS_REMOTE_WRITE)
            assert sys.getrefcount(t) == refs  # nothing kept on failure
        t = FakeDLPack((32, 32), bits=16)
        with pytest.raises(rdmax.GpuNeedsRdma):
            c.register_gpu_tensor(t)
        assert t.deleted == 1 and t.names() == [b"used_dltensor"]
        # Wrong device, refused before the library.
        t = FakeDLPack((32,), device=KCPU)
        with pytest.raises(rdmax.GpuNotDeviceMemory):
            c.register_gpu_tensor(t)
        with pytest.raises(rdmax.GpuNotDeviceMemory):
            c.register_gpu_tensor(np.zeros(8))
        with pytest.raises(rdmax.GpuNotDeviceMemory):
            c.register_gpu_tensor(FakeTorch(FAKE_DEV_PTR, 1, 1, cuda=False))
        with pytest.raises(ValueError):
            c.register_gpu_tensor(FakeDLPack((4, 4), strides=(1, 4)))
