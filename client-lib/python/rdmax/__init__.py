# SPDX-License-Identifier: MIT
"""rdmax: Python client of the rdmaxd transfer daemon, over librdmax.

A ``Client`` connects to the node's rdmaxd; host memory from
``Client.alloc_host`` is a writable buffer numpy views without a copy;
descriptors are plain ``bytes`` (validated by ``Desc``); jobs are submitted
singly or in batches and each returns a ``Job`` with ``wait``, ``cancel``,
``progress`` and ``await``. Every blocking call releases the GIL and a client
may be shared by threads. Errors are ``rdmax.Error`` subclasses named after the
protocol's status codes (``rdmax.Timeout``, ``rdmax.NotFound``, ...), carrying
the daemon's reason. See docs/python.md.
"""
import asyncio
import collections
import itertools
import threading
import weakref

from . import _rdmax
from ._rdmax import Desc, Error, PeerGroup, Region, err_name, strerror  # noqa: F401
from ._rdmax import (  # noqa: F401
    AlreadyExists,
    Cancelled,
    Disconnected,
    GpuAddressReused,
    GpuDriverMissing,
    GpuNeedsRdma,
    GpuNoDmabuf,
    GpuNotDeviceMemory,
    GpuNotExportable,
    GpuTooLarge,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ProtocolError,
    RemoteAccess,
    ResourceExhausted,
    Timeout,
    TransportError,
    Unimplemented,
    Unreachable,
)

__version__ = "2.1.0"
ABI_VERSION = _rdmax.RDMAX_ABI_VERSION

ACCESS_LOCAL = _rdmax.RDMAX_ACCESS_LOCAL
ACCESS_REMOTE_READ = _rdmax.RDMAX_ACCESS_REMOTE_READ
ACCESS_REMOTE_WRITE = _rdmax.RDMAX_ACCESS_REMOTE_WRITE
MESSAGE_PAYLOAD_MAX = _rdmax.RDMAX_MESSAGE_PAYLOAD_MAX

OP_WRITE = _rdmax.RDMAX_OP_WRITE
OP_READ = _rdmax.RDMAX_OP_READ
OP_PAGED_WRITE = _rdmax.RDMAX_OP_PAGED_WRITE
OP_PAGED_READ = _rdmax.RDMAX_OP_PAGED_READ
OP_SEND = _rdmax.RDMAX_OP_SEND
OP_SCATTER = _rdmax.RDMAX_OP_SCATTER
OP_BARRIER = _rdmax.RDMAX_OP_BARRIER

# Traffic classes (docs/python.md): a job's, or a Client's default for its jobs.
CLASS_LATENCY = _rdmax.RDMAX_CLASS_LATENCY
CLASS_BULK = _rdmax.RDMAX_CLASS_BULK
_CLASSES = {None: 0, "latency": CLASS_LATENCY, "bulk": CLASS_BULK}


def _traffic_class(value):
    """None, "latency", "bulk" or a protocol value (others fail the job with InvalidArgument)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return _CLASSES[value]
    except (KeyError, TypeError):
        raise ValueError("traffic_class must be 'latency', 'bulk' or None, not %r"
                         % (value,)) from None

_ERRORS = {cls.code: cls for cls in Error.__subclasses__() if hasattr(cls, "code")}


def error_for(code, reason=""):
    """The exception for a status code (0 is not an error)."""
    cls = _ERRORS.get(code)
    if cls is not None:
        return cls(code, reason or strerror(code))
    if -4096 < code < 0:
        return OSError(-code, reason or strerror(code))
    return Error(code, reason or strerror(code))


def _desc(remote):
    if remote is None or isinstance(remote, Desc):
        return remote
    return Desc(bytes(remote))


class Dest(collections.namedtuple("Dest", "remote peer_index remote_offset local_offset length",
                                  defaults=(None, 0, 0, 0, 0))):
    """One destination of a SCATTER (struct rdmax_scatter_dest): ``length``
    bytes at ``local_offset`` of the job's region to ``remote_offset`` of
    ``remote`` (a descriptor), or, with ``remote`` None, of member
    ``peer_index`` of the job's PeerGroup."""

    __slots__ = ()


def _dest(d):
    d = d if isinstance(d, Dest) else Dest(*d)
    return d._replace(remote=_desc(d.remote))


class Event:
    """One event of ``Client.poll``: a completion, an imm landing or a message."""

    COMPLETION = _rdmax.RDMAX_EVENT_COMPLETION
    IMM_REACHED = _rdmax.RDMAX_EVENT_IMM_REACHED
    MESSAGE = _rdmax.RDMAX_EVENT_MESSAGE
    __slots__ = ("type", "job_id", "status", "bytes", "imm", "count", "reason", "mailbox",
                 "payload", "from_node")

    def __init__(self, t):
        (self.type, self.job_id, self.status, self.bytes, self.imm, self.count, self.reason,
         self.mailbox, self.payload, self.from_node) = t

    def __repr__(self):
        if self.type == Event.COMPLETION:
            return "Event(completion job=%d status=%s bytes=%d%s)" % (
                self.job_id, err_name(self.status), self.bytes,
                " reason=%r" % self.reason if self.reason else "")
        if self.type == Event.IMM_REACHED:
            return "Event(imm 0x%x reached %d)" % (self.imm, self.count)
        return "Event(message for %r from %r, %d bytes)" % (self.mailbox, self.from_node,
                                                            len(self.payload))


class Job:
    """One job. Build with the ``Job.*`` constructors or the Client helpers."""

    __slots__ = ("id", "op", "flags", "imm", "deadline_ms", "local", "local_offset", "length",
                 "remote", "remote_offset", "page_len", "local_pages", "local_pages_offset",
                 "local_pages_stride", "remote_pages", "remote_pages_offset",
                 "remote_pages_stride", "mailbox", "payload", "pairs", "status", "bytes", "reason",
                 "dests", "group", "remotes", "traffic_class", "_client", "__weakref__")

    def __init__(self, op, local=None, remote=None, *, local_offset=0, length=0,
                 remote_offset=0, page_len=0, local_pages=None, local_pages_offset=0,
                 local_pages_stride=0, remote_pages=None, remote_pages_offset=0,
                 remote_pages_stride=0, imm=None, deadline=None, mailbox=None, payload=b"",
                 id=None, dests=None, group=None, remotes=None, pairs=None, traffic_class=None):
        self.id = id
        self.traffic_class = _traffic_class(traffic_class)
        self.op = op
        self.flags = 0 if imm is None else _rdmax.RDMAX_JOB_IMM
        self.imm = imm or 0
        self.deadline_ms = 0 if not deadline else max(1, int(deadline * 1000))
        self.local = local
        self.local_offset = local_offset
        self.length = length
        self.remote = _desc(remote)
        self.remote_offset = remote_offset
        self.page_len = page_len
        self.local_pages = local_pages
        self.local_pages_offset = local_pages_offset
        self.local_pages_stride = local_pages_stride
        self.remote_pages = remote_pages
        self.remote_pages_offset = remote_pages_offset
        self.remote_pages_stride = remote_pages_stride
        self.mailbox = mailbox
        self.payload = payload
        # Paged jobs: more (Region, Desc) pairs moved with the same page lists, one job.
        if pairs and op not in (OP_PAGED_WRITE, OP_PAGED_READ):
            raise ValueError("only PAGED_WRITE and PAGED_READ jobs carry region pairs")
        self.pairs = None if not pairs else tuple((r, _desc(d)) for r, d in pairs)
        self.status = None
        self.bytes = 0
        self.reason = ""
        self._client = None
        # SCATTER: dests (and the group their peer_index entries name); BARRIER: group or remotes.
        self.dests = None if dests is None else [_dest(d) for d in dests]
        self.group = group
        self.remotes = None if remotes is None else [_desc(d) for d in remotes]
        if op == OP_BARRIER and imm is None:
            raise ValueError("a BARRIER carries an imm")

    def _tuple(self):
        if self.op == OP_SCATTER or self.op == OP_BARRIER:
            return (self.id, self.op, self.flags, self.imm, self.deadline_ms, self.local,
                    self.group, self.dests or (), self.remotes, self.traffic_class)
        return (self.id, self.op, self.flags, self.imm, self.deadline_ms, self.local,
                self.local_offset, self.length, self.remote, self.remote_offset, self.page_len,
                self.local_pages, self.local_pages_offset, self.local_pages_stride,
                self.remote_pages, self.remote_pages_offset, self.remote_pages_stride,
                self.mailbox, self.payload, self.pairs, self.traffic_class)

    def _finish(self, ev):
        self.status, self.bytes, self.reason = ev.status, ev.bytes, ev.reason

    @property
    def done(self):
        """True once the job's one completion arrived."""
        return self.status is not None

    def wait(self, timeout=None):
        """Wait for the completion (GIL released); raises the job's error, or
        rdmax.Timeout when the wait (not the job) timed out. Returns self."""
        if self._client is None:
            raise ValueError("the job was not submitted")
        if self.status is None:
            self._client._wait_job(self, timeout)
        if self.status != 0:
            raise error_for(self.status, self.reason)
        return self

    def cancel(self):
        """Ask the daemon to complete the job with rdmax.Cancelled now."""
        try:
            self._client._c_cancel(self.id)
        except NotFound:
            pass  # already completing

    def progress(self):
        """(bytes_done, bytes_total) while in flight, None once finished."""
        return self._client._c_job_status(self.id)

    def __await__(self):
        if self._client is None:
            raise ValueError("the job was not submitted")
        if self.status is None:
            yield from self._client._dispatcher().wait_job(self).__await__()
        if self.status != 0:
            raise error_for(self.status, self.reason)
        return self

    def __repr__(self):
        state = "pending" if self.status is None else err_name(self.status)
        return "Job(id=%s op=%d %s)" % (self.id, self.op, state)


class Client(_rdmax.Client):
    """A connection to the node's rdmaxd (``socket`` None: $RDMAX_SOCKET or
    /run/rdmaxd.sock). Safe to share between threads; use as a context manager."""

    def __init__(self, socket=None, name=None, traffic_class=None):
        self._traffic_class = _traffic_class(traffic_class)  # of jobs that name none
        super().__init__(socket, name)
        self._ids = itertools.count(1)
        self._id_lock = threading.Lock()
        self._jobs = weakref.WeakValueDictionary()
        self._route_lock = threading.Lock()
        self._async = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- jobs

    def submit(self, jobs):
        """Submit one Job or a list of Jobs in one message; returns them.
        Either every job is accepted (each then completes exactly once) or the
        call raises and none was submitted."""
        single = isinstance(jobs, Job)
        batch = [jobs] if single else list(jobs)
        with self._id_lock:
            for j in batch:
                if j._client is not None:
                    raise ValueError("job %s was already submitted" % j.id)
                if j.id is None:
                    j.id = next(self._ids)
                if not j.traffic_class:
                    j.traffic_class = self._traffic_class
        for j in batch:
            j._client = self
            self._jobs[j.id] = j
        try:
            _rdmax.Client.submit(self, [j._tuple() for j in batch])
        except BaseException:
            for j in batch:
                self._jobs.pop(j.id, None)
                j._client = None
            raise
        if self._async is not None:
            self._async.kick()
        return batch[0] if single else batch

    def write(self, local, remote, length, *, local_offset=0, remote_offset=0, imm=None,
              deadline=None, traffic_class=None):
        return self.submit(Job(OP_WRITE, local, remote, length=length, local_offset=local_offset,
                               remote_offset=remote_offset, imm=imm, deadline=deadline,
                               traffic_class=traffic_class))

    def read(self, local, remote, length, *, local_offset=0, remote_offset=0, deadline=None,
             traffic_class=None):
        return self.submit(Job(OP_READ, local, remote, length=length, local_offset=local_offset,
                               remote_offset=remote_offset, deadline=deadline,
                               traffic_class=traffic_class))

    def paged_write(self, local, remote, page_len, local_pages, remote_pages, **kw):
        return self.submit(Job(OP_PAGED_WRITE, local, remote, page_len=page_len,
                               local_pages=local_pages, remote_pages=remote_pages, **kw))

    def paged_read(self, local, remote, page_len, local_pages, remote_pages, **kw):
        return self.submit(Job(OP_PAGED_READ, local, remote, page_len=page_len,
                               local_pages=local_pages, remote_pages=remote_pages, **kw))

    def send(self, address, payload, *, mailbox=None, deadline=None, traffic_class=None):
        """A message to the mailbox at ``address`` (what ``mailbox_open`` returned on the
        receiving side); ``mailbox``, when given, must be that mailbox's name."""
        return self.submit(Job(OP_SEND, None, address, mailbox=mailbox, payload=payload,
                               deadline=deadline, traffic_class=traffic_class))

    def scatter(self, local, dests, *, group=None, imm=None, deadline=None, traffic_class=None):
        """One SCATTER: each ``Dest`` (or tuple in its field order) names a
        descriptor, or with ``remote`` None a member of ``group``. With ``imm``
        each destination node counts it once for the job."""
        return self.submit(Job(OP_SCATTER, local, dests=dests, group=group, imm=imm,
                               deadline=deadline, traffic_class=traffic_class))

    def barrier(self, imm, *, group=None, remotes=None, deadline=None, traffic_class=None):
        """One BARRIER: a zero-byte write carrying ``imm`` to each distinct node
        of ``group`` or of ``remotes`` (descriptors with remote write access).
        A receiver expecting N senders calls expect_imm(imm, N)."""
        return self.submit(Job(OP_BARRIER, group=group, remotes=remotes, imm=imm,
                               deadline=deadline, traffic_class=traffic_class))

    def peer_group(self, descs):
        """A PeerGroup of remote descriptors the daemon resolves once
        (rdmax_peer_group_create): ``len(g)``, ``g.members``, ``g.destroy()``."""
        return _rdmax.Client.peer_group(self, [_desc(d) for d in descs])

    def _route(self, t):
        ev = Event(t)
        if ev.type == Event.COMPLETION:
            job = self._jobs.pop(ev.job_id, None)
            if job is not None:
                job._finish(ev)
        return ev

    def poll(self, timeout=0, max=None, kinds=None):
        """Events that arrived, waiting up to ``timeout`` seconds (None: forever)
        for the first. ``kinds``: the Event types to take (default all; the
        others stay queued for a later poll() or recv()). Completions of jobs a
        thread waits for in Job.wait() go to that thread, not here."""
        kw = {} if max is None else {"max": max}
        if kinds is not None:
            kw["kinds"] = sum(1 << k for k in kinds)
        if timeout != 0:
            # Waits, takes nothing.
            _rdmax.Client.poll(self, timeout, max=0, kinds=kw.get("kinds", 0xFFFFFFFF))
        if max == 0:
            return []
        with self._route_lock:
            return [self._route(t) for t in _rdmax.Client.poll(self, 0, **kw)]

    def _wait_job(self, job, timeout):
        # Take-and-route in poll() and this claim exclude each other: either
        # poll() already finished the job, or it leaves the completion to us.
        with self._route_lock:
            if job.status is not None:
                return
            self.claim(job.id)
        try:
            t = self.wait_job(job.id, timeout)
        finally:
            self.unclaim(job.id)
        with self._route_lock:
            self._route(t)

    def _c_cancel(self, job_id):
        _rdmax.Client.cancel(self, job_id)

    def _c_job_status(self, job_id):
        return _rdmax.Client.job_status(self, job_id)

    # ---- memory and descriptors

    def import_desc(self, data):
        """A descriptor from bytes a peer sent (validated; never unpickled)."""
        return Desc(bytes(data))

    def register_gpu_tensor(self, tensor, access=ACCESS_LOCAL):
        """Register the device memory behind a GPU tensor: any object with
        ``__cuda_array_interface__`` or ``data_ptr()`` plus
        ``numel()*element_size()``, or a ``__dlpack__`` capsule of device type
        CUDA (or CUDA pinned host), parsed in C. The region keeps the tensor
        (and a consumed DLPack tensor until its deleter runs at ``free()``)
        so the memory cannot go while it is registered. Memory of another
        device raises rdmax.GpuNotDeviceMemory."""
        if _dlpack_only(tensor):
            return _rdmax.Client.register_dlpack(self, tensor, access)
        ptr, length = gpu_pointer(tensor)
        return self.register_gpu(ptr, length, access, tensor)

    # ---- asyncio

    def _dispatcher(self):
        loop = asyncio.get_running_loop()
        if self._async is None or self._async.loop is not loop:
            self._async = _AsyncDispatcher(self, loop)
        return self._async

    async def wait_imm_async(self, imm):
        """Await the ExpectImm of ``imm`` (see expect_imm); returns the landings
        it consumed. Firings nobody awaited yet add up for the next await."""
        return await self._dispatcher().wait_imm(imm)

    async def recv_async(self, mailbox=None):
        """Await the next message for ``mailbox`` (None: any): (mailbox, payload, from)."""
        return await self._dispatcher().recv(mailbox)


class _AsyncDispatcher:
    """Routes a client's events to asyncio futures: the client's fd is
    watched with add_reader; each wake-up (and each submit) takes what arrived."""

    def __init__(self, client, loop):
        self.client = client
        self.loop = loop
        self.imm = {}
        self.imm_reached = {}  # imm -> landings fired with nobody awaiting them
        self.msgs = []
        self.jobs = {}
        self.watching = False

    def _watch(self):
        if not self.watching:
            self.loop.add_reader(self.client.fileno(), self._ready)
            self.watching = True

    def kick(self):
        try:
            self.loop.call_soon_threadsafe(self._ready)
        except RuntimeError:
            pass

    def _ready(self):
        try:
            events = self.client.poll(0)
        except Error as e:
            for fut in list(self.jobs.values()) + list(self.imm.values()) + \
                    [f for _, f in self.msgs]:
                if not fut.done():
                    fut.set_exception(e)
            return
        for ev in events:
            if ev.type == Event.COMPLETION:
                fut = self.jobs.pop(ev.job_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            elif ev.type == Event.IMM_REACHED:
                fut = self.imm.pop(ev.imm, None)
                if fut is not None and not fut.done():
                    fut.set_result(ev.count)
                else:
                    # Kept for the next wait: a standing claim fires without
                    # one. One entry per claimed value, which the daemon bounds.
                    self.imm_reached[ev.imm] = self.imm_reached.get(ev.imm, 0) + ev.count
            else:
                for i, (box, fut) in enumerate(self.msgs):
                    if box is None or box == ev.mailbox:
                        del self.msgs[i]
                        if not fut.done():
                            fut.set_result((ev.mailbox, ev.payload, ev.from_node))
                        break
        if not self.jobs and not self.imm and not self.msgs and self.watching:
            self.loop.remove_reader(self.client.fileno())
            self.watching = False

    async def wait_job(self, job):
        if job.status is not None:
            return
        fut = self.loop.create_future()
        self.jobs[job.id] = fut
        self._watch()
        self.loop.call_soon(self._ready)
        await fut

    async def wait_imm(self, imm):
        if imm in self.imm_reached:
            return self.imm_reached.pop(imm)
        fut = self.loop.create_future()
        self.imm[imm] = fut
        self._watch()
        self.loop.call_soon(self._ready)
        return await fut

    async def recv(self, mailbox):
        fut = self.loop.create_future()
        self.msgs.append((mailbox, fut))
        self._watch()
        self.loop.call_soon(self._ready)
        return await fut


_DL_CUDA, _DL_CUDA_HOST = 2, 3  # DLPack device types this package registers


def _not_cuda(why):
    return GpuNotDeviceMemory(GpuNotDeviceMemory.code, why)


def _dlpack_only(obj):
    """A DLPack tensor offering neither __cuda_array_interface__ nor data_ptr()."""
    return (getattr(obj, "__cuda_array_interface__", None) is None
            and not hasattr(obj, "data_ptr") and hasattr(obj, "__dlpack__"))


def gpu_pointer(obj):
    """(device pointer, bytes) of a GPU array: __cuda_array_interface__,
    data_ptr() (torch), or a DLPack capsule from __dlpack__() (parsed in C;
    device type CUDA or CUDA pinned host). Memory on another device raises
    rdmax.GpuNotDeviceMemory; a non-contiguous array raises ValueError."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        ptr = cai["data"][0]
        shape = cai["shape"]
        itemsize = int(cai["typestr"][2:])
        n = 1
        for s in shape:
            n *= s
        if cai.get("strides") not in (None, ()):
            raise ValueError("only C-contiguous GPU arrays can be registered")
        return ptr, n * itemsize
    if hasattr(obj, "data_ptr"):
        if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
            raise ValueError("only contiguous tensors can be registered")
        if hasattr(obj, "is_cuda") and not obj.is_cuda:
            raise _not_cuda("the tensor is not on a CUDA device")
        return obj.data_ptr(), obj.numel() * obj.element_size()
    if hasattr(obj, "__dlpack__"):
        if hasattr(obj, "__dlpack_device__"):
            dev_type, _ = obj.__dlpack_device__()
            if dev_type not in (_DL_CUDA, _DL_CUDA_HOST):
                raise _not_cuda("the DLPack tensor is on device type %d, not CUDA" % dev_type)
        ptr, length, dev_type, _ = _rdmax.dlpack_info(obj)
        if dev_type not in (_DL_CUDA, _DL_CUDA_HOST):
            raise _not_cuda("the DLPack tensor is on device type %d, not CUDA" % dev_type)
        return ptr, length
    raise TypeError("not a GPU array: no __cuda_array_interface__, data_ptr() or __dlpack__")
