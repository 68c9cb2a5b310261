/* SPDX-License-Identifier: MIT */
/*
 * rdmax._rdmax: the CPython extension under the `rdmax` package, a thin layer
 * over librdmax (so the shared-memory ring and every check stay in the C
 * library). Owns, per client: a mutex that serialises every library call
 * (librdmax clients are not thread-safe, Python threads are), an event queue
 * that every call empties the library into (so one thread's submit cannot
 * strand another thread's completion inside the library), and a wake eventfd
 * that lets one waiting thread sleep in poll() on the daemon's fd while the
 * others wait on a condition variable. Every call that can block runs with
 * the GIL released. Page lists are taken from any buffer (numpy integer
 * arrays, array.array, bytes) and converted in C, never element by element in
 * Python. Never logs; errors become one exception class per RDMAX_E_* code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "rdmax.h"
#include "rdmax_py.h"

#define EVENT_BATCH 64

/* ------------------------------------------------------------ exceptions */

struct err_class {
	int code;
	const char *name;
	PyObject *type;
};

static PyObject *g_error; /* rdmax.Error */
static struct err_class g_errs[] = {
	{RDMAX_E_INVALID_ARGUMENT, "InvalidArgument", NULL},
	{RDMAX_E_NOT_FOUND, "NotFound", NULL},
	{RDMAX_E_PERMISSION_DENIED, "PermissionDenied", NULL},
	{RDMAX_E_OUT_OF_RANGE, "OutOfRange", NULL},
	{RDMAX_E_UNREACHABLE, "Unreachable", NULL},
	{RDMAX_E_REMOTE_ACCESS, "RemoteAccess", NULL},
	{RDMAX_E_TIMEOUT, "Timeout", NULL},
	{RDMAX_E_CANCELLED, "Cancelled", NULL},
	{RDMAX_E_TRANSPORT_ERROR, "TransportError", NULL},
	{RDMAX_E_RESOURCE_EXHAUSTED, "ResourceExhausted", NULL},
	{RDMAX_E_UNIMPLEMENTED, "Unimplemented", NULL},
	{RDMAX_E_PROTOCOL_ERROR, "ProtocolError", NULL},
	{RDMAX_E_ALREADY_EXISTS, "AlreadyExists", NULL},
	{RDMAX_E_INTERNAL, "Internal", NULL},
	{RDMAX_E_GPU_DRIVER_MISSING, "GpuDriverMissing", NULL},
	{RDMAX_E_GPU_NOT_DEVICE_MEMORY, "GpuNotDeviceMemory", NULL},
	{RDMAX_E_GPU_NOT_EXPORTABLE, "GpuNotExportable", NULL},
	{RDMAX_E_GPU_NO_DMABUF, "GpuNoDmabuf", NULL},
	{RDMAX_E_GPU_NEEDS_RDMA, "GpuNeedsRdma", NULL},
	{RDMAX_E_GPU_TOO_LARGE, "GpuTooLarge", NULL},
	{RDMAX_E_GPU_ADDRESS_REUSED, "GpuAddressReused", NULL},
	{RDMAX_E_DISCONNECTED, "Disconnected", NULL},
};

/* The exception for err (negative), with the reason when there is one. */
PyObject *raise_err(int err, const char *reason)
{
	for (size_t i = 0; i < sizeof(g_errs) / sizeof(g_errs[0]); i++) {
		if (g_errs[i].code == err) {
			PyObject *args = Py_BuildValue(
				"(is)", err, reason && *reason ? reason : rdmax_strerror(err));
			if (args) {
				PyErr_SetObject(g_errs[i].type, args);
				Py_DECREF(args);
			}
			return NULL;
		}
	}
	if (err < 0 && err > -4096) {
		errno = -err;
		return PyErr_SetFromErrno(PyExc_OSError);
	}
	PyErr_Format(g_error, "%s (%d)", rdmax_strerror(err), err);
	return NULL;
}

/* ----------------------------------------------------------------- client */

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Move every event the library holds into the queue. Caller holds m. */
void pump(ClientObject *self)
{
	struct rdmax_event ev[EVENT_BATCH];
	bool grew = false;

	for (;;) {
		int n = rdmax_poll_events(self->c, ev, EVENT_BATCH, 0);
		if (n < 0) {
			if (!self->sticky) {
				self->sticky = n;
			}
			break;
		}
		if (self->q_len + (size_t)n > self->q_cap) {
			size_t cap = self->q_cap ? self->q_cap * 2 : 256;
			while (cap < self->q_len + (size_t)n) {
				cap *= 2;
			}
			struct qevent *q = realloc(self->q, cap * sizeof(*q));
			if (!q) {
				self->sticky = -ENOMEM;
				break;
			}
			self->q = q;
			self->q_cap = cap;
		}
		for (int i = 0; i < n; i++) {
			struct qevent *e = &self->q[self->q_len++];
			e->ev = ev[i];
			e->payload = NULL;
			if (ev[i].type == RDMAX_EVENT_MESSAGE && ev[i].bytes) {
				e->payload = malloc(ev[i].bytes);
				if (e->payload) {
					memcpy(e->payload, ev[i].payload, ev[i].bytes);
				} else {
					e->ev.bytes = 0;
				}
			}
			e->ev.payload = NULL;
			grew = true;
		}
		if (n < EVENT_BATCH) {
			break;
		}
	}
	if (grew) {
		pthread_cond_broadcast(&self->cv);
		if (self->polling) {
			uint64_t one = 1;
			(void)!write(self->wake_fd, &one, sizeof(one));
		}
	}
}

/* Take queued event i out, keeping the order of the rest. Caller holds m. */
static struct qevent q_take(ClientObject *self, size_t i)
{
	struct qevent e = self->q[i];
	memmove(&self->q[i], &self->q[i + 1], (self->q_len - i - 1) * sizeof(*self->q));
	self->q_len--;
	return e;
}

typedef bool (*match_fn)(const struct rdmax_event *e, uint64_t key, const char *name);

/* Whether some thread waits in wait_job() for this event's job. Caller holds m. */
static bool waited(const ClientObject *self, const struct rdmax_event *e)
{
	if (e->type != RDMAX_EVENT_COMPLETION) {
		return false;
	}
	for (size_t i = 0; i < self->n_waiting; i++) {
		if (self->waiting[i] == e->job_id) {
			return true;
		}
	}
	return false;
}

/* Register (add) or drop a waited job id. Caller holds m. */
static int set_waiting(ClientObject *self, uint64_t id, bool add)
{
	if (add) {
		if (self->n_waiting == self->cap_waiting) {
			size_t cap = self->cap_waiting ? 2 * self->cap_waiting : 16;
			uint64_t *w = realloc(self->waiting, cap * sizeof(*w));
			if (!w) {
				return -ENOMEM;
			}
			self->waiting = w;
			self->cap_waiting = cap;
		}
		self->waiting[self->n_waiting++] = id;
		return 0;
	}
	for (size_t i = 0; i < self->n_waiting; i++) {
		if (self->waiting[i] == id) {
			self->waiting[i] = self->waiting[--self->n_waiting];
			break;
		}
	}
	return 0;
}

static bool match_job(const struct rdmax_event *e, uint64_t key, const char *name);

/*
 * Wait (GIL released, m not held) until an event match() accepts (when match
 * is NULL: any event of a type in the bit mask key that no wait_job() waits
 * for) is queued, and take it (take
 * false: leave it queued; ret unused); timeout_ms < 0: forever. Returns 0,
 * RDMAX_E_TIMEOUT or the connection's error.
 */
static int wait_event_ex(ClientObject *self, match_fn match, uint64_t key, const char *name,
			 int timeout_ms, bool take, struct qevent *ret)
{
	int64_t deadline = timeout_ms < 0 ? INT64_MAX : now_ms() + timeout_ms;
	bool any = match == NULL;
	int r = 0;

	pthread_mutex_lock(&self->m);
	if (match == match_job && set_waiting(self, key, true) < 0) {
		pthread_mutex_unlock(&self->m);
		return -ENOMEM;
	}
	for (;;) {
		if (!self->c) {
			r = RDMAX_E_DISCONNECTED;
			goto out;
		}
		pump(self);
		for (size_t i = 0; i < self->q_len; i++) {
			/* poll() (match NULL) leaves the completions wait_job() waits for. */
			const struct rdmax_event *e = &self->q[i].ev;
			if (any ? !waited(self, e) && (key & (1u << e->type))
				: match(e, key, name)) {
				if (take) {
					*ret = q_take(self, i);
				}
				goto out;
			}
		}
		if (self->sticky) {
			r = self->sticky;
			goto out;
		}
		int64_t now = now_ms();
		if (now >= deadline) {
			r = RDMAX_E_TIMEOUT;
			goto out;
		}
		int64_t left = deadline - now;
		if (!self->polling) {
			/* This thread sleeps on the daemon's fd; the others on the condvar. */
			struct pollfd p[2] = {{.fd = rdmax_client_fd(self->c), .events = POLLIN},
					      {.fd = self->wake_fd, .events = POLLIN}};
			self->polling = true;
			pthread_mutex_unlock(&self->m);
			(void)poll(p, 2, left > INT32_MAX ? INT32_MAX : (int)left);
			if (p[1].revents & POLLIN) {
				uint64_t v;
				(void)!read(self->wake_fd, &v, sizeof(v));
			}
			pthread_mutex_lock(&self->m);
			self->polling = false;
			pthread_cond_broadcast(&self->cv);
		} else {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			int64_t ns = ts.tv_nsec + (left % 1000) * 1000000;
			ts.tv_sec += left / 1000 + ns / 1000000000;
			ts.tv_nsec = ns % 1000000000;
			if (left > 1000L * 86400 * 365) {
				ts.tv_sec += 86400 * 365;
			}
			pthread_cond_timedwait(&self->cv, &self->m, &ts);
		}
	}
out:
	if (match == match_job) {
		set_waiting(self, key, false);
	}
	pthread_mutex_unlock(&self->m);
	return r;
}

static int wait_event(ClientObject *self, match_fn match, uint64_t key, const char *name,
		      int timeout_ms, struct qevent *ret)
{
	return wait_event_ex(self, match, key, name, timeout_ms, true, ret);
}

static bool match_job(const struct rdmax_event *e, uint64_t key, const char *name)
{
	(void)name;
	return e->type == RDMAX_EVENT_COMPLETION && e->job_id == key;
}

static bool match_imm(const struct rdmax_event *e, uint64_t key, const char *name)
{
	(void)name;
	return e->type == RDMAX_EVENT_IMM_REACHED && e->imm == key;
}

static bool match_message(const struct rdmax_event *e, uint64_t key, const char *name)
{
	(void)key;
	return e->type == RDMAX_EVENT_MESSAGE && (!name || strcmp(e->mailbox, name) == 0);
}

/* The client, or NULL with an exception when it was closed. */
struct rdmax_client *open_client(ClientObject *self)
{
	if (!self->c || self->closing) {
		PyErr_SetString(PyExc_ValueError, "the rdmax client is closed");
		return NULL;
	}
	return self->c;
}

static int Client_init(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"socket", "name", NULL};
	const char *socket = NULL, *name = NULL;
	struct rdmax_client *c = NULL;
	int r;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|zz", kwlist, &socket, &name)) {
		return -1;
	}
	if (self->c) {
		PyErr_SetString(PyExc_ValueError, "client already open");
		return -1;
	}
	Py_BEGIN_ALLOW_THREADS r = rdmax_client_open(socket, name, &c);
	Py_END_ALLOW_THREADS if (r < 0)
	{
		raise_err(r, NULL);
		return -1;
	}
	self->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (self->wake_fd < 0) {
		rdmax_client_close(c);
		PyErr_SetFromErrno(PyExc_OSError);
		return -1;
	}
	self->c = c;
	return 0;
}

static PyObject *Client_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	ClientObject *self = (ClientObject *)type->tp_alloc(type, 0);
	if (self) {
		pthread_mutex_init(&self->m, NULL);
		pthread_cond_init(&self->cv, NULL);
		pthread_cond_init(&self->submits_done, NULL);
		self->wake_fd = -1;
	}
	return (PyObject *)self;
}

static void client_release(ClientObject *self)
{
	if (self->c) {
		rdmax_client_close(self->c);
		self->c = NULL;
	}
	for (size_t i = 0; i < self->q_len; i++) {
		free(self->q[i].payload);
	}
	free(self->q);
	self->q = NULL;
	self->q_len = self->q_cap = 0;
	free(self->waiting);
	self->waiting = NULL;
	self->n_waiting = self->cap_waiting = 0;
	if (self->wake_fd >= 0) {
		close(self->wake_fd);
		self->wake_fd = -1;
	}
}

static void Client_dealloc(ClientObject *self)
{
	client_release(self);
	pthread_cond_destroy(&self->cv);
	pthread_cond_destroy(&self->submits_done);
	pthread_mutex_destroy(&self->m);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Under m: a submit's library call is over (or it never came). */
static void submit_leave_locked(ClientObject *self)
{
	if (atomic_fetch_sub(&self->submitting, 1) == 1) {
		pthread_cond_broadcast(&self->submits_done);
	}
}

/* Under m: wait until no submit holds pointers it parsed. */
void wait_submits_locked(ClientObject *self)
{
	while (atomic_load(&self->submitting) > 0) {
		pthread_cond_wait(&self->submits_done, &self->m);
	}
}

/* Close the library's client now (GIL held). */
void close_now(ClientObject *self)
{
	if (self->c) {
		Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&self->m);
		wait_submits_locked(self);
		struct rdmax_client *c = self->c;
		self->c = NULL;
		rdmax_client_close(c);
		pthread_cond_broadcast(&self->cv);
		if (self->polling) {
			uint64_t one = 1;
			(void)!write(self->wake_fd, &one, sizeof(one));
		}
		pthread_mutex_unlock(&self->m);
		Py_END_ALLOW_THREADS
	}
}

/*
 * Close the connection. While numpy arrays or memoryviews of its host regions
 * are alive their memory must stay mapped: the client then refuses every call
 * at once and closes when the last view is released.
 */
static PyObject *Client_close(ClientObject *self, PyObject *unused)
{
	if (self->exports) {
		self->closing = true;
	} else {
		close_now(self);
	}
	Py_RETURN_NONE;
}

static PyObject *Client_fileno(ClientObject *self, PyObject *unused)
{
	if (!open_client(self)) {
		return NULL;
	}
	return PyLong_FromLong(rdmax_client_fd(self->c));
}

static PyObject *Client_info(ClientObject *self, PyObject *unused)
{
	if (!open_client(self)) {
		return NULL;
	}
	const struct rdmax_daemon_info *i = rdmax_client_info(self->c);
	return Py_BuildValue(
		"{s:I,s:s,s:s,s:K,s:I,s:I,s:I,s:I,s:K,s:I,s:I,s:I,s:O}", "protocol_version",
		i->protocol_version, "daemon_version", i->daemon_version, "node_name", i->node_name,
		"instance_id", (unsigned long long)i->instance_id, "capabilities", i->capabilities,
		"max_message_bytes", i->max_message_bytes, "max_fds_per_message",
		i->max_fds_per_message, "max_regions", i->max_regions, "max_registered_bytes",
		(unsigned long long)i->max_registered_bytes, "max_outstanding_jobs",
		i->max_outstanding_jobs, "max_jobs_per_submit", i->max_jobs_per_submit,
		"max_paged_pairs", RDMAX_INFO_HAS(i, max_paged_pairs) ? i->max_paged_pairs : 1,
		"ring", rdmax_client_uses_ring(self->c) == 1 ? Py_True : Py_False);
}

static PyObject *Client_submit(ClientObject *self, PyObject *arg)
{
	PyObject *seq = PySequence_Fast(arg, "submit() takes a sequence of jobs");
	struct rdmax_job *jobs = NULL;
	struct job_in *ins = NULL;
	Py_ssize_t n, parsed = 0;
	int ret;

	if (!seq) {
		return NULL;
	}
	if (!open_client(self)) {
		Py_DECREF(seq);
		return NULL;
	}
	n = PySequence_Fast_GET_SIZE(seq);
	jobs = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*jobs));
	ins = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*ins));
	if (!jobs || !ins) {
		PyErr_NoMemory();
		goto out;
	}
	atomic_fetch_add(&self->submitting, 1);
	for (; parsed < n; parsed++) {
		if (parse_job(self, PySequence_Fast_GET_ITEM(seq, parsed), &jobs[parsed],
			      &ins[parsed]) < 0) {
			release_job(&ins[parsed]);
			LOCKED(self, submit_leave_locked(self));
			goto out;
		}
	}
	/* A close() that came first left self->c NULL: nothing parsed is used. */
	LOCKED(self, ret = self->c ? rdmax_submit(self->c, jobs, (size_t)n) : -ENOTCONN;
	       submit_leave_locked(self));
	if (ret < 0) {
		raise_err(ret, NULL);
		goto out;
	}
	for (Py_ssize_t i = 0; i < parsed; i++) {
		release_job(&ins[i]);
	}
	PyMem_Free(jobs);
	PyMem_Free(ins);
	Py_DECREF(seq);
	Py_RETURN_NONE;
out:
	for (Py_ssize_t i = 0; i < parsed; i++) {
		release_job(&ins[i]);
	}
	PyMem_Free(jobs);
	PyMem_Free(ins);
	Py_DECREF(seq);
	return NULL;
}

/* ------------------------------------------------------------- peer groups */

/*
 * peer_group(descs): rdmax_peer_group_create() over a sequence of Desc; the
 * PeerGroup keeps the members (its `members` tuple) and the client.
 */
static PyObject *Client_peer_group(ClientObject *self, PyObject *arg)
{
	struct rdmax_peer_group *g = NULL;
	struct rdmax_desc *descs = NULL;
	size_t n = 0;
	int r;

	PyObject *seq = PySequence_Fast(arg, "peer_group() takes a sequence of rdmax.Desc");
	if (!seq) {
		return NULL;
	}
	if (!open_client(self) || copy_descs(seq, &descs, &n) < 0) {
		PyMem_Free(descs);
		Py_DECREF(seq);
		return NULL;
	}
	LOCKED(self, r = rdmax_peer_group_create(self->c, descs, n, &g));
	PyMem_Free(descs);
	if (r < 0) {
		Py_DECREF(seq);
		return raise_err(r, NULL);
	}
	PeerGroupObject *pg = PyObject_New(PeerGroupObject, &PeerGroupType);
	PyObject *members = PySequence_Tuple(seq);
	Py_DECREF(seq);
	if (!pg || !members) {
		Py_XDECREF(members);
		if (pg) {
			pg->client = NULL;
			pg->g = NULL;
			pg->members = NULL;
			Py_DECREF(pg);
		}
		LOCKED(self, r = rdmax_peer_group_destroy(self->c, g));
		return NULL;
	}
	Py_INCREF(self);
	pg->client = self;
	pg->g = g;
	pg->members = members;
	return (PyObject *)pg;
}

/* destroy(): rdmax_peer_group_destroy(); jobs already submitted with the group run on. */
static PyObject *PeerGroup_destroy(PeerGroupObject *self, PyObject *unused)
{
	int r = 0;

	if (!self->g) {
		Py_RETURN_NONE;
	}
	struct rdmax_peer_group *g = self->g;
	self->g = NULL;
	/* A closed client freed its groups with it. */
	if (self->client->c) {
		LOCKED(self->client, wait_submits_locked(self->client);
		       r = self->client->c ? rdmax_peer_group_destroy(self->client->c, g) : 0);
	}
	if (r < 0) {
		return raise_err(r, NULL);
	}
	Py_RETURN_NONE;
}

static void PeerGroup_dealloc(PeerGroupObject *self)
{
	if (self->g && self->client && self->client->c) {
		int r;
		ClientObject *c = self->client;
		LOCKED(c, r = rdmax_peer_group_destroy(c->c, self->g));
		(void)r;
	}
	Py_XDECREF(self->members);
	Py_XDECREF(self->client);
	PyObject_Free(self);
}

static Py_ssize_t PeerGroup_len(PeerGroupObject *self)
{
	return self->members ? PyTuple_GET_SIZE(self->members) : 0;
}

static PyObject *PeerGroup_get_members(PeerGroupObject *self, void *unused)
{
	return Py_NewRef(self->members);
}

static PyObject *PeerGroup_get_alive(PeerGroupObject *self, void *unused)
{
	return PyBool_FromLong(self->g && self->client->c && !self->client->closing);
}

static PyMethodDef PeerGroup_methods[] = {
	{"destroy", (PyCFunction)PeerGroup_destroy, METH_NOARGS,
	 "rdmax_peer_group_destroy(); jobs already submitted with the group run on."},
	{NULL, NULL, 0, NULL},
};

static PyGetSetDef PeerGroup_getset[] = {
	{"members", (getter)PeerGroup_get_members, NULL, "the member descriptors, in order", NULL},
	{"alive", (getter)PeerGroup_get_alive, NULL, "not destroyed and its client open", NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods PeerGroup_as_sequence = {
	.sq_length = (lenfunc)PeerGroup_len,
};

PyTypeObject PeerGroupType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rdmax._rdmax.PeerGroup",
	.tp_basicsize = sizeof(PeerGroupObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Remote regions the daemon resolved once, for SCATTER and BARRIER jobs.",
	.tp_dealloc = (destructor)PeerGroup_dealloc,
	.tp_methods = PeerGroup_methods,
	.tp_getset = PeerGroup_getset,
	.tp_as_sequence = &PeerGroup_as_sequence,
};

/* ------------------------------------------------------------------ events */

/* (type, job_id, status, bytes, imm, count, reason, mailbox, payload, from_node) */
static PyObject *event_tuple(const struct qevent *e)
{
	const struct rdmax_event *ev = &e->ev;
	PyObject *payload = e->payload
				    ? PyBytes_FromStringAndSize(e->payload, (Py_ssize_t)ev->bytes)
			    : ev->type == RDMAX_EVENT_MESSAGE ? PyBytes_FromStringAndSize("", 0)
							      : Py_NewRef(Py_None);
	if (!payload) {
		return NULL;
	}
	return Py_BuildValue("(iKiKIKssNs)", (int)ev->type, (unsigned long long)ev->job_id,
			     ev->status, (unsigned long long)ev->bytes, ev->imm,
			     (unsigned long long)ev->count, ev->reason, ev->mailbox, payload,
			     ev->from_node);
}

static int timeout_ms_of(PyObject *o, int *ret)
{
	if (o == Py_None) {
		*ret = -1;
		return 0;
	}
	double s = PyFloat_AsDouble(o);
	if (s == -1.0 && PyErr_Occurred()) {
		return -1;
	}
	*ret = s <= 0 ? 0 : s > 2e6 ? INT32_MAX : (int)(s * 1000 + 0.999);
	return 0;
}

/*
 * poll(timeout=0, max=None, kinds=all): a list of event tuples, waiting up to
 * timeout for the first; kinds: bit mask of (1 << event type) to take.
 */
static PyObject *Client_poll(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"timeout", "max", "kinds", NULL};
	PyObject *timeout = NULL;
	Py_ssize_t max = PY_SSIZE_T_MAX;
	unsigned int kinds = 0xffffffffu;
	int ms = 0, r = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OnI", kwlist, &timeout, &max, &kinds) ||
	    !open_client(self)) {
		return NULL;
	}
	if (timeout && timeout_ms_of(timeout, &ms) < 0) {
		return NULL;
	}
	PyObject *list = PyList_New(0);
	if (!list) {
		return NULL;
	}
	if (ms != 0) {
		/* Wait without taking: claims (wait_job) made meanwhile still hold. */
		Py_BEGIN_ALLOW_THREADS r = wait_event_ex(self, NULL, kinds, NULL, ms, false, NULL);
		Py_END_ALLOW_THREADS if (r < 0 && r != RDMAX_E_TIMEOUT)
		{
			Py_DECREF(list);
			return raise_err(r, NULL);
		}
		r = 0;
	}
	struct qevent *taken = NULL;
	size_t n_taken = 0;
	Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&self->m);
	if (self->c) {
		pump(self);
	}
	size_t want = self->q_len;
	if ((Py_ssize_t)want > max) {
		want = (size_t)max;
	}
	taken = malloc((self->q_len ? self->q_len : 1) * sizeof(*taken));
	if (taken) {
		/* Every event but the completions a wait_job() waits for, in order. */
		size_t kept = 0;
		for (size_t i = 0; i < self->q_len; i++) {
			if (n_taken < want && !waited(self, &self->q[i].ev) &&
			    (kinds & (1u << self->q[i].ev.type))) {
				taken[n_taken++] = self->q[i];
			} else {
				self->q[kept++] = self->q[i];
			}
		}
		self->q_len = kept;
	}
	if (n_taken == 0 && self->sticky) {
		r = self->sticky;
		self->sticky = 0;
	}
	pthread_mutex_unlock(&self->m);
	Py_END_ALLOW_THREADS;
	for (size_t i = 0; i < n_taken; i++) {
		struct qevent *e = &taken[i];
		PyObject *t = list ? event_tuple(e) : NULL;
		if (list && (!t || PyList_Append(list, t) < 0)) {
			Py_CLEAR(list);
		}
		Py_XDECREF(t);
		free(e->payload);
	}
	free(taken);
	if (r < 0) {
		Py_XDECREF(list);
		return raise_err(r, NULL);
	}
	return list;
}

/* wait_job(job_id, timeout=None): the completion tuple; raises rdmax.Timeout. */
static PyObject *Client_wait_job(ClientObject *self, PyObject *args)
{
	unsigned long long id;
	PyObject *timeout = Py_None;
	struct qevent e;
	int ms, r;

	if (!PyArg_ParseTuple(args, "K|O", &id, &timeout) || !open_client(self) ||
	    timeout_ms_of(timeout, &ms) < 0) {
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS r = wait_event(self, match_job, id, NULL, ms, &e);
	Py_END_ALLOW_THREADS if (r < 0)
	{
		return raise_err(r, NULL);
	}
	PyObject *t = event_tuple(&e);
	free(e.payload);
	return t;
}

static PyObject *Client_wait_imm(ClientObject *self, PyObject *args)
{
	unsigned int imm;
	PyObject *timeout = Py_None;
	struct qevent e;
	int ms, r;

	if (!PyArg_ParseTuple(args, "I|O", &imm, &timeout) || !open_client(self) ||
	    timeout_ms_of(timeout, &ms) < 0) {
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS r = wait_event(self, match_imm, imm, NULL, ms, &e);
	Py_END_ALLOW_THREADS if (r < 0)
	{
		return raise_err(r, NULL);
	}
	return PyLong_FromUnsignedLongLong(e.ev.count);
}

/* recv(mailbox=None, timeout=None): (mailbox, payload, from_node). */
static PyObject *Client_recv(ClientObject *self, PyObject *args)
{
	const char *name = NULL;
	PyObject *timeout = Py_None;
	struct qevent e;
	int ms, r;

	if (!PyArg_ParseTuple(args, "|zO", &name, &timeout) || !open_client(self) ||
	    timeout_ms_of(timeout, &ms) < 0) {
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS r = wait_event(self, match_message, 0, name, ms, &e);
	Py_END_ALLOW_THREADS if (r < 0)
	{
		return raise_err(r, NULL);
	}
	PyObject *t = Py_BuildValue("(sy#s)", e.ev.mailbox, e.payload ? e.payload : "",
				    (Py_ssize_t)e.ev.bytes, e.ev.from_node);
	free(e.payload);
	return t;
}

static PyObject *simple_u64(ClientObject *self, PyObject *args, int which)
{
	unsigned long long a = 0;
	const char *name = NULL;
	int r = 0;

	if (which == 3 || which == 4) {
		if (!PyArg_ParseTuple(args, "s", &name)) {
			return NULL;
		}
	} else if (!PyArg_ParseTuple(args, "K", &a)) {
		return NULL;
	}
	if (!open_client(self)) {
		return NULL;
	}
	switch (which) {
	case 1:
		LOCKED(self, r = rdmax_cancel(self->c, a));
		break;
	case 3: {
		struct rdmax_desc addr;
		LOCKED(self, r = rdmax_mailbox_open_addr(self->c, name, &addr));
		if (r < 0) {
			return raise_err(r, NULL);
		}
		return PyBytes_FromStringAndSize((const char *)addr.bytes, addr.len);
	}
	case 4:
		LOCKED(self, r = rdmax_mailbox_close(self->c, name));
		break;
	case 5:
		if (a > UINT32_MAX) {
			PyErr_SetString(PyExc_ValueError, "imm is a 32-bit value");
			return NULL;
		}
		LOCKED(self, r = rdmax_release_imm(self->c, (uint32_t)a));
		break;
	}
	if (r < 0) {
		return raise_err(r, NULL);
	}
	Py_RETURN_NONE;
}

static PyObject *Client_expect_imm(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"imm", "count", "standing", "reset", NULL};
	unsigned long long imm, count;
	int standing = 0, reset = 0, r;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "KK|$pp", kwlist, &imm, &count, &standing,
					 &reset)) {
		return NULL;
	}
	if (imm > UINT32_MAX) {
		PyErr_SetString(PyExc_ValueError, "imm is a 32-bit value");
		return NULL;
	}
	if (!open_client(self)) {
		return NULL;
	}
	uint32_t flags = (standing ? RDMAX_EXPECT_STANDING : 0) | (reset ? RDMAX_EXPECT_RESET : 0);
	LOCKED(self, r = rdmax_expect_imm_flags(self->c, (uint32_t)imm, count, flags));
	if (r < 0) {
		return raise_err(r, NULL);
	}
	Py_RETURN_NONE;
}

static PyObject *Client_release_imm(ClientObject *self, PyObject *args)
{
	return simple_u64(self, args, 5);
}

static PyObject *Client_cancel(ClientObject *self, PyObject *args)
{
	return simple_u64(self, args, 1);
}

static PyObject *Client_mailbox_open(ClientObject *self, PyObject *args)
{
	return simple_u64(self, args, 3);
}

static PyObject *Client_mailbox_close(ClientObject *self, PyObject *args)
{
	return simple_u64(self, args, 4);
}

/* claim(job_id) / unclaim(job_id): poll() leaves this job's completion to wait_job(). */
static PyObject *claim(ClientObject *self, PyObject *args, bool add)
{
	unsigned long long id;
	int r;

	if (!PyArg_ParseTuple(args, "K", &id)) {
		return NULL;
	}
	pthread_mutex_lock(&self->m);
	r = set_waiting(self, id, add);
	pthread_mutex_unlock(&self->m);
	if (r < 0) {
		return PyErr_NoMemory();
	}
	Py_RETURN_NONE;
}

static PyObject *Client_claim(ClientObject *self, PyObject *args)
{
	return claim(self, args, true);
}

static PyObject *Client_unclaim(ClientObject *self, PyObject *args)
{
	return claim(self, args, false);
}

/* job_status(job_id): (done, total), or None when the job is no longer in flight. */
static PyObject *Client_job_status(ClientObject *self, PyObject *args)
{
	unsigned long long id;
	uint64_t done = 0, total = 0;
	int r;

	if (!PyArg_ParseTuple(args, "K", &id) || !open_client(self)) {
		return NULL;
	}
	LOCKED(self, r = rdmax_job_status(self->c, id, &done, &total));
	if (r == RDMAX_E_NOT_FOUND) {
		Py_RETURN_NONE;
	}
	if (r < 0) {
		return raise_err(r, NULL);
	}
	return Py_BuildValue("(KK)", (unsigned long long)done, (unsigned long long)total);
}

static PyMethodDef Client_methods[] = {
	{"close", (PyCFunction)Client_close, METH_NOARGS, "Close the connection."},
	{"fileno", (PyCFunction)Client_fileno, METH_NOARGS, "The daemon fd, for event loops."},
	{"info", (PyCFunction)Client_info, METH_NOARGS, "The daemon's Welcome as a dict."},
	{"alloc_host", (PyCFunction)Client_alloc_host, METH_VARARGS, "alloc_host(len, access)"},
	{"register_fd", (PyCFunction)Client_register_fd, METH_VARARGS,
	 "register_fd(fd, offset, length, access)"},
	{"register_gpu", (PyCFunction)Client_register_gpu, METH_VARARGS,
	 "register_gpu(ptr, length, access)"},
	{"register_dlpack", (PyCFunction)Client_register_dlpack, METH_VARARGS,
	 "register_dlpack(tensor, access)"},
	{"alloc_gpu", (PyCFunction)Client_alloc_gpu, METH_VARARGS,
	 "alloc_gpu(device, length, access)"},
	{"submit", (PyCFunction)Client_submit, METH_O, "submit(job_tuples)"},
	{"poll", (PyCFunction)(void (*)(void))Client_poll, METH_VARARGS | METH_KEYWORDS,
	 "poll(timeout=0, max=None)"},
	{"wait_job", (PyCFunction)Client_wait_job, METH_VARARGS, "wait_job(id, timeout)"},
	{"wait_imm", (PyCFunction)Client_wait_imm, METH_VARARGS, "wait_imm(imm, timeout)"},
	{"recv", (PyCFunction)Client_recv, METH_VARARGS, "recv(mailbox, timeout)"},
	{"expect_imm", (PyCFunction)(void (*)(void))Client_expect_imm, METH_VARARGS | METH_KEYWORDS,
	 "expect_imm(imm, count, *, standing=False, reset=False)"},
	{"release_imm", (PyCFunction)Client_release_imm, METH_VARARGS, "release_imm(imm)"},
	{"cancel", (PyCFunction)Client_cancel, METH_VARARGS, "cancel(job_id)"},
	{"job_status", (PyCFunction)Client_job_status, METH_VARARGS, "job_status(job_id)"},
	{"claim", (PyCFunction)Client_claim, METH_VARARGS, "claim(job_id)"},
	{"unclaim", (PyCFunction)Client_unclaim, METH_VARARGS, "unclaim(job_id)"},
	{"mailbox_open", (PyCFunction)Client_mailbox_open, METH_VARARGS,
	 "mailbox_open(name) -> address bytes"},
	{"mailbox_close", (PyCFunction)Client_mailbox_close, METH_VARARGS, "mailbox_close(name)"},
	{"peer_group", (PyCFunction)Client_peer_group, METH_O, "peer_group(descs)"},
	{NULL, NULL, 0, NULL},
};

PyTypeObject ClientType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rdmax._rdmax.Client",
	.tp_basicsize = sizeof(ClientObject),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc = "A connection to the node's rdmaxd (librdmax's struct rdmax_client).",
	.tp_new = Client_new,
	.tp_init = (initproc)Client_init,
	.tp_dealloc = (destructor)Client_dealloc,
	.tp_methods = Client_methods,
};

/* ------------------------------------------------------------------ module */

static PyObject *mod_strerror(PyObject *m, PyObject *arg)
{
	long e = PyLong_AsLong(arg);
	return e == -1 && PyErr_Occurred() ? NULL : PyUnicode_FromString(rdmax_strerror((int)e));
}

static PyObject *mod_err_name(PyObject *m, PyObject *arg)
{
	long e = PyLong_AsLong(arg);
	return e == -1 && PyErr_Occurred() ? NULL : PyUnicode_FromString(rdmax_err_name((int)e));
}

static PyMethodDef mod_methods[] = {
	{"strerror", mod_strerror, METH_O, "rdmax_strerror()"},
	{"err_name", mod_err_name, METH_O, "rdmax_err_name()"},
	{"dlpack_info", mod_dlpack_info, METH_O,
	 "dlpack_info(obj): (address, bytes, device_type, device_id) of a DLPack tensor"},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef g_module = {
	PyModuleDef_HEAD_INIT, "_rdmax", "CPython binding of librdmax.", -1, mod_methods,
};

PyMODINIT_FUNC PyInit__rdmax(void);

PyMODINIT_FUNC PyInit__rdmax(void)
{
	PyObject *m = PyModule_Create(&g_module);
	if (!m) {
		return NULL;
	}
	if (PyType_Ready(&ClientType) < 0 || PyType_Ready(&RegionType) < 0 ||
	    PyType_Ready(&DescType) < 0 || PyType_Ready(&PeerGroupType) < 0) {
		goto fail;
	}
	PyModule_AddObjectRef(m, "Client", (PyObject *)&ClientType);
	PyModule_AddObjectRef(m, "Region", (PyObject *)&RegionType);
	PyModule_AddObjectRef(m, "Desc", (PyObject *)&DescType);
	PyModule_AddObjectRef(m, "PeerGroup", (PyObject *)&PeerGroupType);
	g_error = PyErr_NewExceptionWithDoc(
		"rdmax.Error", "An rdmax error: args are (code, reason).", PyExc_Exception, NULL);
	if (!g_error || PyModule_AddObjectRef(m, "Error", g_error) < 0) {
		goto fail;
	}
	for (size_t i = 0; i < sizeof(g_errs) / sizeof(g_errs[0]); i++) {
		char qual[64];
		snprintf(qual, sizeof(qual), "rdmax.%s", g_errs[i].name);
		PyObject *bases = g_errs[i].code == RDMAX_E_TIMEOUT
					  ? PyTuple_Pack(2, g_error, PyExc_TimeoutError)
					  : PyTuple_Pack(1, g_error);
		if (!bases) {
			goto fail;
		}
		g_errs[i].type = PyErr_NewException(qual, bases, NULL);
		Py_DECREF(bases);
		if (!g_errs[i].type ||
		    PyModule_AddObjectRef(m, g_errs[i].name, g_errs[i].type) < 0) {
			goto fail;
		}
		PyObject *code = PyLong_FromLong(g_errs[i].code);
		if (!code || PyObject_SetAttrString(g_errs[i].type, "code", code) < 0) {
			Py_XDECREF(code);
			goto fail;
		}
		Py_DECREF(code);
	}
#define C(x) PyModule_AddIntConstant(m, #x, x)
	C(RDMAX_OP_WRITE);
	C(RDMAX_OP_READ);
	C(RDMAX_OP_PAGED_WRITE);
	C(RDMAX_OP_PAGED_READ);
	C(RDMAX_OP_SCATTER);
	C(RDMAX_OP_BARRIER);
	C(RDMAX_OP_SEND);
	C(RDMAX_JOB_IMM);
	C(RDMAX_CLASS_LATENCY);
	C(RDMAX_CLASS_BULK);
	C(RDMAX_ACCESS_LOCAL);
	C(RDMAX_ACCESS_REMOTE_READ);
	C(RDMAX_ACCESS_REMOTE_WRITE);
	C(RDMAX_EVENT_COMPLETION);
	C(RDMAX_EVENT_IMM_REACHED);
	C(RDMAX_EVENT_MESSAGE);
	C(RDMAX_MESSAGE_PAYLOAD_MAX);
	C(RDMAX_ABI_VERSION);
#undef C
	return m;
fail:
	Py_DECREF(m);
	return NULL;
}
