# SPDX-License-Identifier: MIT
"""Stand-ins for GPU tensors, for the tests: a DLPack producer written to the
DLPack ABI with ctypes, and objects with __cuda_array_interface__ or
data_ptr() as cupy and torch have them. Any address can be given: the tests
run without a GPU (against the fake driver, or up to the library's refusal)."""
import ctypes

KCPU, KCUDA, KCUDA_HOST, KCUDA_MANAGED = 1, 2, 3, 13
FAKE_DEV_PTR = 0x7F0000000000


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", DELETER)]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]
DLTENSOR = b"dltensor"  # the capsule keeps a pointer to its name: this must outlive it


class FakeDLPack:
    """A DLPack producer to the ABI: a capsule per __dlpack__() call; counts deleter calls."""

    def __init__(self, shape, bits=16, lanes=1, strides=None, device=KCUDA, byte_offset=0,
                 data=FAKE_DEV_PTR, with_device=True):
        self.deleted = 0
        self.capsules = []
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
        self._deleter = DELETER(self._delete)
        mt = DLManagedTensor()
        mt.dl_tensor.data = data
        mt.dl_tensor.device = DLDevice(device, 0)
        mt.dl_tensor.ndim = len(shape)
        mt.dl_tensor.dtype = DLDataType(2, bits, lanes)
        mt.dl_tensor.shape = self._shape
        mt.dl_tensor.strides = self._strides
        mt.dl_tensor.byte_offset = byte_offset
        mt.deleter = self._deleter
        self.mt = mt
        self.device = device
        if not with_device:
            self.__dict__["no_device"] = True

    def _delete(self, ptr):
        assert ctypes.addressof(ptr.contents) == ctypes.addressof(self.mt)
        self.deleted += 1

    def __dlpack__(self, stream=None):
        cap = _capsule_new(ctypes.addressof(self.mt), DLTENSOR, None)
        self.capsules.append(cap)
        return cap

    def __getattr__(self, name):
        if name == "__dlpack_device__" and not self.__dict__.get("no_device"):
            return lambda: (self.device, 0)
        raise AttributeError(name)

    def names(self):
        return [_capsule_name(c) for c in self.capsules]


class FakeCAI:
    def __init__(self, ptr, shape, typestr="<f4", strides=None):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape,
                                         "typestr": typestr, "strides": strides, "version": 3}


class FakeTorch:
    def __init__(self, ptr, numel, element_size, cuda=True, contiguous=True):
        self.is_cuda = cuda
        self._p, self._n, self._e, self._c = ptr, numel, element_size, contiguous

    def data_ptr(self):
        return self._p

    def numel(self):
        return self._n

    def element_size(self):
        return self._e

    def is_contiguous(self):
        return self._c
