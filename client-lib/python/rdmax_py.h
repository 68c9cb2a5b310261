/* SPDX-License-Identifier: MIT */
/*
 * Private to the rdmax._rdmax extension: the Python object types the module
 * defines (_rdmax.c, regions.c) and the job parsing (jobs.c) reads, what one
 * parsed job holds until its submit returned, and what the three files share.
 */
#ifndef RDMAX_PY_H
#define RDMAX_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "rdmax.h"

/* An event taken out of the library, its message payload copied. */
struct qevent {
	struct rdmax_event ev;
	void *payload; /* MESSAGE: malloc'd copy of ev.bytes bytes */
};

typedef struct {
	PyObject_HEAD struct rdmax_client *c;
	pthread_mutex_t m; /* every library call, the queue */
	pthread_cond_t cv; /* the queue grew or the poller left */
	/*
	 * Submits between parsing their jobs (GIL held, pointers to regions and
	 * groups taken) and the library call: close(), Region.free() and
	 * PeerGroup.destroy() wait for none to be left, under m, before they free
	 * what such a submit may hold.
	 */
	atomic_int submitting;
	pthread_cond_t submits_done; /* submitting fell to 0 */
	int wake_fd;                 /* eventfd: wakes the thread sleeping in poll() */
	bool polling;                /* a thread sleeps in poll() on the daemon's fd */
	struct qevent *q;            /* queued events, oldest first */
	size_t q_len, q_cap;
	int sticky;        /* an error of the library's event path, reported once */
	uint64_t *waiting; /* job ids a wait_job() waits for: poll() leaves them */
	size_t n_waiting, cap_waiting;
	uint32_t exports; /* buffer views of this client's regions */
	bool closing;     /* close() was called while views were alive: closes with the last */
} ClientObject;

typedef struct {
	PyObject_HEAD ClientObject *client; /* strong reference */
	struct rdmax_region *r;             /* NULL once freed */
	bool allocated;                     /* rdmax_region_free(), not _deregister() */
	bool host;                          /* mapped here: exports a buffer */
	Py_ssize_t exports;
	PyObject *keep;   /* GPU tensors: the object owning the memory, while registered */
	void *dl_managed; /* a consumed DLPack tensor (DLManagedTensor): its deleter at free */
} RegionObject;

typedef struct {
	PyObject_HEAD struct rdmax_desc d;
} DescObject;

typedef struct {
	PyObject_HEAD ClientObject *client; /* strong reference */
	struct rdmax_peer_group *g;         /* NULL once destroyed */
	PyObject *members;                  /* tuple of Desc, in member order */
} PeerGroupObject;

extern PyTypeObject ClientType, RegionType, DescType, PeerGroupType;

/* A page list taken from a buffer, as uint32 indices. */
struct pages_in {
	Py_buffer view;  /* view.obj NULL: none held */
	uint32_t *owned; /* converted copy, or NULL when view's memory is used */
};

/* What a SCATTER or BARRIER holds until the submit returned (copies: no Python object). */
struct group_in {
	struct rdmax_scatter_dest *dests;
	struct rdmax_desc *descs; /* SCATTER: the dests' descriptors; BARRIER: the remotes */
};

/* Everything one parsed job holds until the submit returned. */
struct job_in {
	struct pages_in lp, rp;
	struct rdmax_region_pair *pairs; /* PyMem; the regions and descs stay the tuple's */
	Py_buffer payload;
	PyObject *mailbox; /* bytes */
	struct group_in grp;
};

/* _rdmax.c: errors and the client's mutex. */

/* The exception for err (negative), with the reason when there is one; returns NULL. */
PyObject *raise_err(int err, const char *reason);
/* Move every event the library holds into the queue. Caller holds m. */
void pump(ClientObject *self);
/* The client, or NULL with an exception when it was closed. */
struct rdmax_client *open_client(ClientObject *self);
/* Under m: wait until no submit holds pointers it parsed. */
void wait_submits_locked(ClientObject *self);
/* Close the library's client now (GIL held). */
void close_now(ClientObject *self);

/* Run `call` under the client's mutex with the GIL released; pump afterwards. */
#define LOCKED(self, call)                                                                         \
	do {                                                                                       \
		Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&(self)->m);                             \
		call;                                                                              \
		pump(self);                                                                        \
		pthread_mutex_unlock(&(self)->m);                                                  \
		Py_END_ALLOW_THREADS                                                               \
	} while (0)

/* regions.c: the Client methods that make regions, and rdmax.dlpack_info(). */
PyObject *Client_alloc_host(ClientObject *self, PyObject *args);
PyObject *Client_register_fd(ClientObject *self, PyObject *args);
PyObject *Client_register_gpu(ClientObject *self, PyObject *args);
PyObject *Client_alloc_gpu(ClientObject *self, PyObject *args);
PyObject *Client_register_dlpack(ClientObject *self, PyObject *args);
PyObject *mod_dlpack_info(PyObject *m, PyObject *obj);

/* jobs.c */

/*
 * One job from the tuple rdmax/__init__.py builds into *j, with what it holds
 * in *in (release_job() frees it, also after a failure): 0, or -1 with a
 * Python exception.
 */
int parse_job(ClientObject *self, PyObject *t, struct rdmax_job *j, struct job_in *in);
void release_job(struct job_in *in);

/* Descriptor objects of a sequence into a fresh array (PyMem_Free): 0, or -1 with an exception. */
int copy_descs(PyObject *seq, struct rdmax_desc **ret, size_t *ret_n);

#endif
