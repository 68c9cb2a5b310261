/* SPDX-License-Identifier: MIT */
/*
 * Job parsing of the rdmax._rdmax extension: the tuples rdmax.Job builds
 * become struct rdmax_job, page lists are read from any integer buffer (or
 * sequence) in C, regions, descriptors and groups are checked to be live
 * objects of the submitting client. Never calls librdmax; Client.submit()
 * (_rdmax.c) hands the parsed jobs over.
 */
#include "rdmax_py.h"

#include <string.h>

/* Indices of any integer buffer (or sequence) as uint32, without a loop in Python. */
static int take_pages(PyObject *obj, struct pages_in *p, const uint32_t **ret, size_t *ret_n)
{
	memset(p, 0, sizeof(*p));
	if (obj == Py_None) {
		*ret = NULL;
		*ret_n = 0;
		return 0;
	}
	if (PyObject_GetBuffer(obj, &p->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0) {
		const char *f = p->view.format ? p->view.format : "B";
		if (*f == '<' || *f == '=' || *f == '@') {
			f++;
		}
		Py_ssize_t item = p->view.itemsize, n = item ? p->view.len / item : 0;
		bool is_signed = strchr("bhilq", *f) != NULL, known = strchr("bBhHiIlLqQ", *f);
		if (!known || f[1] != '\0' || p->view.ndim > 1) {
			PyBuffer_Release(&p->view);
			PyErr_Format(PyExc_TypeError,
				     "page indices must be a 1-d integer array (got format '%s')",
				     p->view.format ? p->view.format : "B");
			return -1;
		}
		if (item == 4 && !is_signed) {
			*ret = p->view.buf;
			*ret_n = (size_t)n;
			return 0;
		}
		p->owned = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint32_t));
		if (!p->owned) {
			PyBuffer_Release(&p->view);
			PyErr_NoMemory();
			return -1;
		}
		const uint8_t *b = p->view.buf;
		for (Py_ssize_t i = 0; i < n; i++) {
			int64_t v;
			uint64_t u;
			switch (item) {
			case 1:
				v = is_signed ? ((const int8_t *)b)[i] : ((const uint8_t *)b)[i];
				break;
			case 2:
				v = is_signed ? ((const int16_t *)b)[i] : ((const uint16_t *)b)[i];
				break;
			case 4:
				v = ((const int32_t *)b)[i];
				break;
			default:
				memcpy(&u, b + i * 8, 8);
				v = (int64_t)u;
				if (!is_signed && u > UINT32_MAX) {
					v = -1;
				}
				break;
			}
			if (v < 0 || v > (int64_t)UINT32_MAX) {
				PyMem_Free(p->owned);
				p->owned = NULL;
				PyBuffer_Release(&p->view);
				PyErr_Format(PyExc_ValueError,
					     "page index %zd (entry %zd) is outside 0..2^32-1",
					     (Py_ssize_t)v, i);
				return -1;
			}
			p->owned[i] = (uint32_t)v;
		}
		*ret = p->owned;
		*ret_n = (size_t)n;
		return 0;
	}
	/* Not a buffer: a sequence of ints (a list of block ids). */
	PyErr_Clear();
	PyObject *seq = PySequence_Fast(obj, "page indices must be an integer array or sequence");
	if (!seq) {
		return -1;
	}
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
	p->owned = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint32_t));
	if (!p->owned) {
		Py_DECREF(seq);
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		unsigned long v = PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(seq, i));
		if ((v == (unsigned long)-1 && PyErr_Occurred()) || v > UINT32_MAX) {
			Py_DECREF(seq);
			PyMem_Free(p->owned);
			p->owned = NULL;
			if (!PyErr_Occurred()) {
				PyErr_SetString(PyExc_ValueError, "page index outside 0..2^32-1");
			}
			return -1;
		}
		p->owned[i] = (uint32_t)v;
	}
	Py_DECREF(seq);
	*ret = p->owned;
	*ret_n = (size_t)n;
	return 0;
}

static void release_pages(struct pages_in *p)
{
	PyMem_Free(p->owned);
	if (p->view.obj) {
		PyBuffer_Release(&p->view);
	}
}

static int region_of(ClientObject *self, PyObject *o, struct rdmax_region **ret)
{
	if (o == Py_None) {
		*ret = NULL;
		return 0;
	}
	if (!PyObject_TypeCheck(o, &RegionType) || ((RegionObject *)o)->client != self ||
	    !((RegionObject *)o)->r) {
		PyErr_SetString(PyExc_ValueError,
				"local must be a live Region of this client (or None)");
		return -1;
	}
	*ret = ((RegionObject *)o)->r;
	return 0;
}

static int desc_of(PyObject *o, const struct rdmax_desc **ret)
{
	if (o == Py_None) {
		*ret = NULL;
		return 0;
	}
	if (!PyObject_TypeCheck(o, &DescType)) {
		PyErr_SetString(PyExc_TypeError, "remote must be an rdmax.Desc (or None)");
		return -1;
	}
	*ret = &((DescObject *)o)->d;
	return 0;
}

/* Fields of the tuple of a SCATTER or BARRIER (parse_group_job()). */
#define GROUP_JOB_FIELDS 10

/* A live PeerGroup of this client (or None: NULL), else an exception. */
static int group_of(ClientObject *self, PyObject *o, struct rdmax_peer_group **ret)
{
	if (o == Py_None) {
		*ret = NULL;
		return 0;
	}
	if (!PyObject_TypeCheck(o, &PeerGroupType) || ((PeerGroupObject *)o)->client != self ||
	    !((PeerGroupObject *)o)->g) {
		PyErr_SetString(PyExc_ValueError,
				"group must be a live PeerGroup of this client (or None)");
		return -1;
	}
	*ret = ((PeerGroupObject *)o)->g;
	return 0;
}

/* Descriptor objects into a fresh array (the caller frees it with PyMem_Free). */
int copy_descs(PyObject *seq, struct rdmax_desc **ret, size_t *ret_n)
{
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);

	*ret = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(**ret));
	if (!*ret) {
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
		if (!PyObject_TypeCheck(o, &DescType)) {
			PyErr_Format(PyExc_TypeError, "entry %zd is not an rdmax.Desc", i);
			return -1;
		}
		(*ret)[i] = ((DescObject *)o)->d;
	}
	*ret_n = (size_t)n;
	return 0;
}

/*
 * A SCATTER or BARRIER from the tuple (id, op, flags, imm, deadline_ms, local,
 * group, dests, remotes) that rdmax/__init__.py builds: dests is a sequence
 * of (remote Desc or None, peer_index, remote_offset, local_offset, length),
 * remotes a sequence of Desc or None. Everything is copied, so the Python
 * objects may change while the submit runs without the GIL.
 */
static int parse_group_job(ClientObject *self, PyObject *t, struct rdmax_job *j,
			   struct group_in *in)
{
	PyObject *local, *group, *dests, *remotes;
	unsigned long long id;
	int op;
	unsigned int flags, imm, deadline, traffic_class;

	if (!PyArg_ParseTuple(t, "KiIIIOOOOI", &id, &op, &flags, &imm, &deadline, &local, &group,
			      &dests, &remotes, &traffic_class)) {
		return -1;
	}
	j->traffic_class = traffic_class;
	j->id = id;
	j->op = (enum rdmax_op)op;
	j->flags = flags;
	j->imm = imm;
	j->deadline_ms = deadline;
	if (region_of(self, local, &j->local) < 0) {
		return -1;
	}
	if (op == RDMAX_OP_SCATTER) {
		if (group_of(self, group, &j->u.scatter.group) < 0) {
			return -1;
		}
		PyObject *seq = PySequence_Fast(dests, "dests must be a sequence of rdmax.Dest");
		if (!seq) {
			return -1;
		}
		Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
		in->dests = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*in->dests));
		in->descs = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*in->descs));
		if (!in->dests || !in->descs) {
			Py_DECREF(seq);
			PyErr_NoMemory();
			return -1;
		}
		for (Py_ssize_t i = 0; i < n; i++) {
			struct rdmax_scatter_dest *d = &in->dests[i];
			PyObject *remote;
			unsigned int index;
			unsigned long long roff, loff, len;
			PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
			PyObject *tup = PySequence_Tuple(item);
			if (!tup ||
			    !PyArg_ParseTuple(tup, "OIKKK", &remote, &index, &roff, &loff, &len)) {
				Py_XDECREF(tup);
				Py_DECREF(seq);
				return -1;
			}
			if (remote != Py_None) {
				if (!PyObject_TypeCheck(remote, &DescType)) {
					Py_DECREF(tup);
					Py_DECREF(seq);
					PyErr_Format(
						PyExc_TypeError,
						"dest %zd: remote must be an rdmax.Desc or None",
						i);
					return -1;
				}
				in->descs[i] = ((DescObject *)remote)->d;
				d->remote = &in->descs[i];
			}
			Py_DECREF(tup);
			d->peer_index = index;
			d->remote_offset = roff;
			d->local_offset = loff;
			d->length = len;
		}
		Py_DECREF(seq);
		j->u.scatter.dests = in->dests;
		j->u.scatter.count = (size_t)n;
		return 0;
	}
	if (op == RDMAX_OP_BARRIER) {
		if (group_of(self, group, &j->u.barrier.group) < 0) {
			return -1;
		}
		if (remotes == Py_None) {
			return 0;
		}
		PyObject *seq =
			PySequence_Fast(remotes, "remotes must be a sequence of rdmax.Desc");
		if (!seq) {
			return -1;
		}
		int r = copy_descs(seq, &in->descs, &j->u.barrier.count);
		Py_DECREF(seq);
		j->u.barrier.remotes = in->descs;
		return r;
	}
	PyErr_Format(PyExc_ValueError, "op %d is not SCATTER or BARRIER", op);
	return -1;
}

static void release_group(struct group_in *in)
{
	PyMem_Free(in->dests);
	PyMem_Free(in->descs);
	in->dests = NULL;
	in->descs = NULL;
}

/*
 * One job from the tuple (id, op, flags, imm, deadline_ms, local, local_offset,
 * length, remote, remote_offset, page_len, local_pages, local_pages_offset,
 * local_pages_stride, remote_pages, remote_pages_offset, remote_pages_stride,
 * mailbox, payload[, pairs[, traffic_class]]) that rdmax/__init__.py builds;
 * pairs: None or a sequence of (Region, Desc) of a paged job.
 */
/* The further region pairs of a paged job, into in->pairs. */
static int take_pairs(ClientObject *self, PyObject *pairs, struct rdmax_job *j, struct job_in *in)
{
	if (pairs == Py_None) {
		return 0;
	}
	PyObject *seq = PySequence_Fast(pairs, "pairs must be a sequence of (Region, Desc)");
	if (!seq) {
		return -1;
	}
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
	in->pairs = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*in->pairs));
	if (!in->pairs) {
		Py_DECREF(seq);
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *p = PySequence_Fast_GET_ITEM(seq, i), *local, *remote;
		if (!PyTuple_Check(p) || !PyArg_ParseTuple(p, "OO", &local, &remote) ||
		    region_of(self, local, &in->pairs[i].local) < 0 ||
		    desc_of(remote, &in->pairs[i].remote) < 0) {
			if (!PyErr_Occurred()) {
				PyErr_SetString(PyExc_TypeError,
						"a pair is a (Region, Desc) tuple");
			}
			Py_DECREF(seq);
			return -1;
		}
	}
	/* The tuple holds the sequence and its items for the submit's duration. */
	Py_DECREF(seq);
	j->pairs = in->pairs;
	j->n_pairs = (size_t)n;
	return 0;
}

int parse_job(ClientObject *self, PyObject *t, struct rdmax_job *j, struct job_in *in)
{
	PyObject *local, *remote, *lpages, *rpages, *mailbox, *payload, *pairs = Py_None;
	unsigned long long id, loff, len, roff, plen, lpo, lps, rpo, rps;
	int op;
	unsigned int flags, imm, deadline, traffic_class = 0;

	memset(j, 0, sizeof(*j));
	memset(in, 0, sizeof(*in));
	if (!PyTuple_Check(t)) {
		PyErr_SetString(PyExc_TypeError, "a job is a tuple built by rdmax.Job");
		return -1;
	}
	if (PyTuple_GET_SIZE(t) == GROUP_JOB_FIELDS) {
		return parse_group_job(self, t, j, &in->grp);
	}
	if (!PyArg_ParseTuple(t, "KiIIIOKKOKKOKKOKKOO|OI", &id, &op, &flags, &imm, &deadline,
			      &local, &loff, &len, &remote, &roff, &plen, &lpages, &lpo, &lps,
			      &rpages, &rpo, &rps, &mailbox, &payload, &pairs, &traffic_class)) {
		return -1;
	}
	j->traffic_class = traffic_class;
	j->id = id;
	j->op = (enum rdmax_op)op;
	j->flags = flags;
	j->imm = imm;
	j->deadline_ms = deadline;
	j->local_offset = loff;
	j->length = len;
	j->remote_offset = roff;
	if (region_of(self, local, &j->local) < 0 || desc_of(remote, &j->remote) < 0) {
		return -1;
	}
	if (op == RDMAX_OP_PAGED_WRITE || op == RDMAX_OP_PAGED_READ) {
		j->u.paged.page_len = plen;
		if (take_pages(lpages, &in->lp, &j->u.paged.local_pages.indices,
			       &j->u.paged.local_pages.count) < 0) {
			return -1;
		}
		if (take_pages(rpages, &in->rp, &j->u.paged.remote_pages.indices,
			       &j->u.paged.remote_pages.count) < 0) {
			return -1;
		}
		j->u.paged.local_pages.offset = lpo;
		j->u.paged.local_pages.stride = lps;
		j->u.paged.remote_pages.offset = rpo;
		j->u.paged.remote_pages.stride = rps;
		if (take_pairs(self, pairs, j, in) < 0) {
			return -1;
		}
	} else if (op == RDMAX_OP_SEND) {
		/* remote is the mailbox's address; the name is optional and checked against it. */
		if (mailbox != Py_None && !PyUnicode_Check(mailbox)) {
			PyErr_SetString(PyExc_TypeError, "a SEND's mailbox is a name or None");
			return -1;
		}
		if (mailbox != Py_None) {
			in->mailbox = PyUnicode_AsUTF8String(mailbox);
			if (!in->mailbox) {
				return -1;
			}
		}
		if (PyObject_GetBuffer(payload, &in->payload, PyBUF_SIMPLE) < 0) {
			return -1;
		}
		j->u.send.mailbox = in->mailbox ? PyBytes_AS_STRING(in->mailbox) : NULL;
		j->u.send.payload = in->payload.buf;
		j->u.send.length = (size_t)in->payload.len;
	}
	return 0;
}

void release_job(struct job_in *in)
{
	release_group(&in->grp);
	release_pages(&in->lp);
	release_pages(&in->rp);
	PyMem_Free(in->pairs);
	if (in->payload.obj) {
		PyBuffer_Release(&in->payload);
	}
	Py_XDECREF(in->mailbox);
}
