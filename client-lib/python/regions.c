/* SPDX-License-Identifier: MIT */
/*
 * rdmax._rdmax's regions: the Client calls that make them (host memory, an
 * fd, GPU memory, DLPack tensors), the Region type (its buffer view of host
 * memory, free, descriptor) and the Desc type. A region holds its client;
 * every library call runs under the client's mutex (LOCKED, _rdmax.c).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "rdmax.h"
#include "rdmax_py.h"

static PyObject *make_region(ClientObject *self, struct rdmax_region *r, bool allocated, bool host)
{
	RegionObject *reg = PyObject_New(RegionObject, &RegionType);
	if (!reg) {
		int ret;
		LOCKED(self, ret = allocated ? rdmax_region_free(self->c, r)
					     : rdmax_region_deregister(self->c, r));
		(void)ret;
		return NULL;
	}
	Py_INCREF(self);
	reg->client = self;
	reg->r = r;
	reg->allocated = allocated;
	reg->host = host;
	reg->exports = 0;
	reg->keep = NULL;
	reg->dl_managed = NULL;
	return (PyObject *)reg;
}

PyObject *Client_alloc_host(ClientObject *self, PyObject *args)
{
	unsigned long long length;
	unsigned int access = 0;
	struct rdmax_region *r = NULL;
	int ret;

	if (!PyArg_ParseTuple(args, "K|I", &length, &access) || !open_client(self)) {
		return NULL;
	}
	LOCKED(self, ret = rdmax_region_alloc_host(self->c, length, access, &r));
	if (ret < 0) {
		return raise_err(ret, NULL);
	}
	return make_region(self, r, true, true);
}

PyObject *Client_register_fd(ClientObject *self, PyObject *args)
{
	int fd;
	unsigned long long offset, length;
	unsigned int access = 0;
	struct rdmax_region *r = NULL;
	int ret;

	if (!PyArg_ParseTuple(args, "iKK|I", &fd, &offset, &length, &access) ||
	    !open_client(self)) {
		return NULL;
	}
	LOCKED(self, ret = rdmax_region_register_fd(self->c, fd, offset, length, NULL, access, &r));
	if (ret < 0) {
		return raise_err(ret, NULL);
	}
	return make_region(self, r, false, false);
}

/* register_gpu(ptr, length, access=0, keep=None): keep lives as long as the region. */
PyObject *Client_register_gpu(ClientObject *self, PyObject *args)
{
	unsigned long long ptr, length;
	unsigned int access = 0;
	struct rdmax_region *r = NULL;
	PyObject *keep = Py_None;
	int ret;

	if (!PyArg_ParseTuple(args, "KK|IO", &ptr, &length, &access, &keep) || !open_client(self)) {
		return NULL;
	}
	LOCKED(self, ret = rdmax_region_register_gpu(self->c, (void *)(uintptr_t)ptr, length,
						     access, &r));
	if (ret < 0) {
		return raise_err(ret, NULL);
	}
	RegionObject *reg = (RegionObject *)make_region(self, r, false, false);
	if (reg && keep != Py_None) {
		reg->keep = Py_NewRef(keep);
	}
	return (PyObject *)reg;
}

PyObject *Client_alloc_gpu(ClientObject *self, PyObject *args)
{
	int device;
	unsigned long long length;
	unsigned int access = 0;
	struct rdmax_region *r = NULL;
	int ret;

	if (!PyArg_ParseTuple(args, "iK|I", &device, &length, &access) || !open_client(self)) {
		return NULL;
	}
	LOCKED(self, ret = rdmax_region_alloc_gpu(self->c, device, length, access, &r));
	if (ret < 0) {
		return raise_err(ret, NULL);
	}
	return make_region(self, r, true, false);
}

/* ------------------------------------------------------------------ DLPack */

/*
 * The DLPack ABI (dlpack.h, version 0.8 and later; stable since 0.6): a
 * "dltensor" capsule holds a DLManagedTensor. A consumer that takes it
 * renames the capsule "used_dltensor" and calls the deleter once it is done;
 * a capsule left unconsumed is the producer's to clean up.
 */
enum { DL_CPU = 1, DL_CUDA = 2, DL_CUDA_HOST = 3, DL_CUDA_MANAGED = 13 };

typedef struct {
	int32_t device_type;
	int32_t device_id;
} DLDevice;

typedef struct {
	uint8_t code;
	uint8_t bits;
	uint16_t lanes;
} DLDataType;

typedef struct {
	void *data;
	DLDevice device;
	int32_t ndim;
	DLDataType dtype;
	int64_t *shape;
	int64_t *strides; /* in elements; NULL: compact row-major */
	uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
	DLTensor dl_tensor;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* What a consumed DLPack tensor describes. */
struct dl_view {
	DLManagedTensor *mt; /* ours until dl_release() */
	uintptr_t ptr;       /* data + byte_offset */
	uint64_t bytes;      /* shape x dtype */
	int device_type, device_id;
};

static void dl_release(DLManagedTensor *mt)
{
	if (mt && mt->deleter) {
		mt->deleter(mt);
	}
}

/* Bytes of a C-contiguous tensor, or -1 with a ValueError. */
static int dl_bytes(const DLTensor *t, uint64_t *ret)
{
	uint64_t elems = 1, bits = (uint64_t)t->dtype.bits * (t->dtype.lanes ? t->dtype.lanes : 1);
	int64_t expect = 1;

	if (t->ndim < 0 || (t->ndim > 0 && !t->shape)) {
		PyErr_SetString(PyExc_ValueError, "DLPack tensor with a malformed shape");
		return -1;
	}
	if (bits == 0 || bits % 8 != 0) {
		PyErr_Format(PyExc_ValueError,
			     "DLPack dtype of %u bits x %u lanes is not a whole number of bytes",
			     t->dtype.bits, t->dtype.lanes);
		return -1;
	}
	for (int32_t i = t->ndim - 1; i >= 0; i--) {
		int64_t n = t->shape[i];
		if (n < 0 || __builtin_mul_overflow(elems, (uint64_t)n, &elems)) {
			PyErr_SetString(PyExc_ValueError, "DLPack tensor with a malformed shape");
			return -1;
		}
		/* Dimensions of one element may carry any stride. */
		if (t->strides && n != 1 && t->strides[i] != expect) {
			PyErr_SetString(PyExc_ValueError,
					"only C-contiguous DLPack tensors can be registered");
			return -1;
		}
		if (__builtin_mul_overflow(expect, n ? n : 1, &expect)) {
			PyErr_SetString(PyExc_ValueError, "DLPack tensor too large");
			return -1;
		}
	}
	if (__builtin_mul_overflow(elems, bits / 8, ret)) {
		PyErr_SetString(PyExc_ValueError, "DLPack tensor too large");
		return -1;
	}
	return 0;
}

/*
 * Take obj.__dlpack__(): check the tensor, then consume the capsule (renamed
 * "used_dltensor"); the caller calls dl_release(view->mt) when done. A
 * tensor refused by the checks is left to its producer.
 */
static int dl_take(PyObject *obj, struct dl_view *v)
{
	PyObject *cap = PyObject_CallMethod(obj, "__dlpack__", NULL);

	memset(v, 0, sizeof(*v));
	if (!cap) {
		return -1;
	}
	if (!PyCapsule_IsValid(cap, "dltensor")) {
		Py_DECREF(cap);
		PyErr_SetString(PyExc_TypeError,
				"__dlpack__() did not return an unused \"dltensor\" capsule");
		return -1;
	}
	DLManagedTensor *mt = PyCapsule_GetPointer(cap, "dltensor");
	const DLTensor *t = &mt->dl_tensor;
	if (dl_bytes(t, &v->bytes) < 0 ||
	    __builtin_add_overflow((uintptr_t)t->data, (uintptr_t)t->byte_offset, &v->ptr)) {
		if (!PyErr_Occurred()) {
			PyErr_SetString(PyExc_ValueError,
					"DLPack byte_offset past the address space");
		}
		Py_DECREF(cap);
		return -1;
	}
	if (PyCapsule_SetName(cap, "used_dltensor") < 0) {
		Py_DECREF(cap);
		return -1;
	}
	Py_DECREF(cap);
	v->mt = mt;
	v->device_type = t->device.device_type;
	v->device_id = t->device.device_id;
	return 0;
}

/*
 * dlpack_info(obj): (address, bytes, device_type, device_id) of any DLPack
 * tensor; the capsule is consumed and its deleter called before returning.
 */
PyObject *mod_dlpack_info(PyObject *m, PyObject *obj)
{
	struct dl_view v;

	if (dl_take(obj, &v) < 0) {
		return NULL;
	}
	dl_release(v.mt);
	return Py_BuildValue("(KKii)", (unsigned long long)v.ptr, (unsigned long long)v.bytes,
			     v.device_type, v.device_id);
}

/* A refusal of memory that is not CUDA memory, as rdmax.GpuNotDeviceMemory. */
static PyObject *not_cuda(int device_type)
{
	char why[RDMAX_MESSAGE_MAX];

	snprintf(why, sizeof(why),
		 "the DLPack tensor is on device type %d%s, not CUDA (2) or CUDA pinned host (3)",
		 device_type,
		 device_type == DL_CPU            ? " (CPU: use alloc_host memory)"
		 : device_type == DL_CUDA_MANAGED ? " (CUDA managed)"
						  : "");
	return raise_err(RDMAX_E_GPU_NOT_DEVICE_MEMORY, why);
}

/*
 * register_dlpack(obj, access=0): register the CUDA memory of a DLPack tensor
 * (device type CUDA or CUDA pinned host); the consumed tensor is released
 * (its deleter) when the region is freed.
 */
PyObject *Client_register_dlpack(ClientObject *self, PyObject *args)
{
	PyObject *obj;
	unsigned int access = 0;
	struct rdmax_region *r = NULL;
	struct dl_view v;
	int ret;

	if (!PyArg_ParseTuple(args, "O|I", &obj, &access) || !open_client(self)) {
		return NULL;
	}
	/* __dlpack_device__ first: memory of another device is refused without an export. */
	if (PyObject_HasAttrString(obj, "__dlpack_device__")) {
		int type, id;
		PyObject *d = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
		if (!d) {
			return NULL;
		}
		ret = PyArg_Parse(d, "(ii)", &type, &id);
		Py_DECREF(d);
		if (!ret) {
			return NULL;
		}
		if (type != DL_CUDA && type != DL_CUDA_HOST) {
			return not_cuda(type);
		}
	}
	if (dl_take(obj, &v) < 0) {
		return NULL;
	}
	if (v.device_type != DL_CUDA && v.device_type != DL_CUDA_HOST) {
		dl_release(v.mt);
		return not_cuda(v.device_type);
	}
	LOCKED(self, ret = rdmax_region_register_gpu(self->c, (void *)v.ptr, v.bytes, access, &r));
	if (ret < 0) {
		dl_release(v.mt);
		return raise_err(ret, NULL);
	}
	RegionObject *reg = (RegionObject *)make_region(self, r, false, false);
	if (!reg) {
		dl_release(v.mt);
		return NULL;
	}
	reg->dl_managed = v.mt;
	reg->keep = Py_NewRef(obj);
	return (PyObject *)reg;
}

/* ----------------------------------------------------------------- regions */

static struct rdmax_region *live_region(RegionObject *self)
{
	if (!self->r || !self->client->c || self->client->closing) {
		PyErr_SetString(PyExc_ValueError, "the region was freed or its client closed");
		return NULL;
	}
	return self->r;
}

/* The object owning a GPU region's memory goes once the region is gone (GIL held). */
static void region_drop_owner(RegionObject *self)
{
	DLManagedTensor *mt = self->dl_managed;

	self->dl_managed = NULL;
	dl_release(mt);
	Py_CLEAR(self->keep);
}

static PyObject *Region_free(RegionObject *self, PyObject *unused)
{
	int r;

	if (!self->r) {
		Py_RETURN_NONE;
	}
	if (self->exports) {
		PyErr_SetString(PyExc_BufferError,
				"views of this region are alive: release them before freeing it");
		return NULL;
	}
	if (!self->client->c) {
		self->r = NULL;
		region_drop_owner(self);
		Py_RETURN_NONE;
	}
	struct rdmax_region *reg = self->r;
	self->r = NULL;
	ClientObject *c = self->client;
	LOCKED(c, wait_submits_locked(c); r = !c->c ? 0
					      : self->allocated
						      ? rdmax_region_free(c->c, reg)
						      : rdmax_region_deregister(c->c, reg));
	region_drop_owner(self);
	if (r < 0) {
		return raise_err(r, NULL);
	}
	Py_RETURN_NONE;
}

static void Region_dealloc(RegionObject *self)
{
	if (self->r && self->client->c) {
		int r;
		ClientObject *c = self->client;
		LOCKED(c, r = self->allocated ? rdmax_region_free(c->c, self->r)
					      : rdmax_region_deregister(c->c, self->r));
		(void)r;
	}
	region_drop_owner(self);
	Py_XDECREF(self->client);
	PyObject_Free(self);
}

static PyObject *Region_desc(RegionObject *self, PyObject *unused)
{
	struct rdmax_desc d;

	if (!live_region(self) || rdmax_region_desc(self->r, &d) < 0) {
		return PyErr_Occurred() ? NULL : raise_err(-EINVAL, NULL);
	}
	return PyBytes_FromStringAndSize((const char *)d.bytes, d.len);
}

static PyObject *Region_get_length(RegionObject *self, void *unused)
{
	return live_region(self) ? PyLong_FromUnsignedLongLong(rdmax_region_length(self->r)) : NULL;
}

static PyObject *Region_get_addr(RegionObject *self, void *unused)
{
	return live_region(self) ? PyLong_FromVoidPtr(rdmax_region_addr(self->r)) : NULL;
}

static PyObject *Region_get_id(RegionObject *self, void *unused)
{
	return live_region(self) ? PyLong_FromUnsignedLongLong(rdmax_region_id(self->r)) : NULL;
}

static int Region_getbuffer(RegionObject *self, Py_buffer *view, int flags)
{
	if (!self->host) {
		PyErr_SetString(PyExc_BufferError,
				"only host regions (alloc_host) can be viewed from Python");
		return -1;
	}
	if (!live_region(self)) {
		return -1;
	}
	if (PyBuffer_FillInfo(view, (PyObject *)self, rdmax_region_addr(self->r),
			      (Py_ssize_t)rdmax_region_length(self->r), 0, flags) < 0) {
		return -1;
	}
	self->exports++;
	self->client->exports++;
	return 0;
}

static void Region_releasebuffer(RegionObject *self, Py_buffer *view)
{
	self->exports--;
	if (--self->client->exports == 0 && self->client->closing) {
		close_now(self->client);
	}
}

static PyBufferProcs Region_as_buffer = {
	.bf_getbuffer = (getbufferproc)Region_getbuffer,
	.bf_releasebuffer = (releasebufferproc)Region_releasebuffer,
};

static PyMethodDef Region_methods[] = {
	{"free", (PyCFunction)Region_free, METH_NOARGS,
	 "Release the region (rdmax_region_free or _deregister, as it was made)."},
	{"desc", (PyCFunction)Region_desc, METH_NOARGS, "The descriptor as bytes."},
	{NULL, NULL, 0, NULL},
};

static PyGetSetDef Region_getset[] = {
	{"length", (getter)Region_get_length, NULL, "bytes", NULL},
	{"addr", (getter)Region_get_addr, NULL, "local address", NULL},
	{"id", (getter)Region_get_id, NULL, "the daemon's region id", NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject RegionType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rdmax._rdmax.Region",
	.tp_basicsize = sizeof(RegionObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A region registered with the daemon; host regions are writable buffers.",
	.tp_dealloc = (destructor)Region_dealloc,
	.tp_methods = Region_methods,
	.tp_getset = Region_getset,
	.tp_as_buffer = &Region_as_buffer,
};

/* ------------------------------------------------------------- descriptors */

static PyObject *Desc_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	Py_buffer b;
	if (!PyArg_ParseTuple(args, "y*", &b)) {
		return NULL;
	}
	DescObject *self = (DescObject *)type->tp_alloc(type, 0);
	if (self) {
		int r = rdmax_desc_import(b.buf, (size_t)b.len, &self->d);
		if (r < 0) {
			Py_CLEAR(self);
			raise_err(r, "not a region descriptor this library can use");
		}
	}
	PyBuffer_Release(&b);
	return (PyObject *)self;
}

static PyObject *Desc_bytes(DescObject *self, PyObject *unused)
{
	return PyBytes_FromStringAndSize((const char *)self->d.bytes, self->d.len);
}

static PyMethodDef Desc_methods[] = {
	{"__bytes__", (PyCFunction)Desc_bytes, METH_NOARGS, "The encoded descriptor."},
	{NULL, NULL, 0, NULL},
};

PyTypeObject DescType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rdmax._rdmax.Desc",
	.tp_basicsize = sizeof(DescObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A remote region descriptor, validated when made from bytes.",
	.tp_new = Desc_new,
	.tp_methods = Desc_methods,
};
