# SPDX-License-Identifier: MIT
"""rdmax.kv: KV-cache transfer between prefill and decode workers.

An ``Agent`` holds one worker's KV caches (one region per layer, or a K and a
V region per layer; each region is ``num_blocks`` blocks of ``block_bytes``),
describes them in a compact versioned handshake (``Agent.handshake()``,
plain bytes a peer passes to ``Agent.add_peer()``), and moves blocks as
paged jobs that carry every cache region as a region pair with the same
block ids (one job per head slice; a daemon that predates region pairs gets
one job per cache region instead):

- ``push(req, local_blocks, peer, remote_blocks)``: the prefill side writes;
- ``pull(req, local_blocks, peer, remote_blocks)``: the decode side reads.

When a request's jobs have all completed, the agent tells the other side
with a message to that agent's mailbox, so the receiver learns its KV has
landed (push) and the sender that its blocks may be freed (pull); the
request is reported done once that message was handed to the other agent.
``get_finished()`` returns the requests done sending, done receiving, and
the ones that failed with their rdmax error (so a scheduler can recompute
rather than hang); every request may carry a deadline.

Tensor parallelism: with the HND block layout (heads outermost inside a
block, as vLLM's NIXL connector requires for heterogeneous TP) a head slice
of a block is contiguous. When the two sides' TP sizes differ by an integer
ratio, each block moves as the head slices both sides share: a decode rank
with more ranks than prefill reads its slice of the prefill rank's blocks;
with fewer, it gathers slices from several prefill ranks.
"""
import struct
import threading
import time

import rdmax

MAGIC = b"RDKV"
VERSION = 2  # 2: the mailbox travels as its address, not its name
_HEAD = struct.Struct("<4sHHIIQIIII")  # magic, version, kv_per_layer, layers, blocks,
#                                        block_bytes, heads, tp_rank, tp_size, n_regions
_MSG_WRITTEN = b"W"  # the sender's push of this request has landed
_MSG_READ = b"R"  # the reader's pull of this request is done: blocks may be freed
_NOTIFY_DEADLINE = 5.0  # seconds a notification may take to reach the other agent


class Layout:
    """Shape of one worker's caches."""

    def __init__(self, num_layers, num_blocks, block_bytes, *, kv_per_layer=2, num_heads=1,
                 tp_rank=0, tp_size=1):
        if kv_per_layer not in (1, 2):
            raise ValueError("kv_per_layer is 1 (one tensor per layer) or 2 (K and V)")
        if num_heads < 1 or block_bytes % num_heads:
            raise ValueError("block_bytes must split evenly into num_heads head slices")
        if not 0 <= tp_rank < tp_size:
            raise ValueError("tp_rank must be in [0, tp_size)")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_bytes = block_bytes
        self.kv_per_layer = kv_per_layer
        self.num_heads = num_heads
        self.tp_rank = tp_rank
        self.tp_size = tp_size

    @property
    def regions(self):
        return self.num_layers * self.kv_per_layer

    @property
    def head_bytes(self):
        return self.block_bytes // self.num_heads


class Peer:
    """A remote agent, from its handshake."""

    def __init__(self, layout, descs, mailbox, name):
        self.layout = layout
        self.descs = descs
        self.mailbox = mailbox  # the address of the agent's mailbox (rdmax.Desc)
        self.name = name


def encode_handshake(layout, descs, mailbox, name):
    """mailbox: the address of the agent's mailbox (bytes from Client.mailbox_open)."""
    mb, nm = bytes(mailbox), name.encode()
    out = [_HEAD.pack(MAGIC, VERSION, layout.kv_per_layer, layout.num_layers,
                      layout.num_blocks, layout.block_bytes, layout.num_heads, layout.tp_rank,
                      layout.tp_size, len(descs)),
           struct.pack("<H", len(mb)), mb, struct.pack("<H", len(nm)), nm]
    for d in descs:
        b = bytes(d)
        out += [struct.pack("<H", len(b)), b]
    return b"".join(out)


def decode_handshake(data):
    """A Peer from handshake bytes; rdmax.InvalidArgument when they are not one."""
    data = bytes(data)

    def bad(why):
        return rdmax.InvalidArgument(rdmax.InvalidArgument.code, "KV handshake: " + why)

    if len(data) < _HEAD.size:
        raise bad("too short")
    (magic, version, kvpl, layers, blocks, block_bytes, heads, rank, size,
     n) = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise bad("not an rdmax KV handshake")
    if version != VERSION:
        raise bad("version %d, this library speaks %d" % (version, VERSION))
    try:
        layout = Layout(layers, blocks, block_bytes, kv_per_layer=kvpl, num_heads=heads,
                        tp_rank=rank, tp_size=size)
    except ValueError as e:
        raise bad(str(e)) from None
    if n != layout.regions:
        raise bad("%d regions for %d layers x %d" % (n, layers, kvpl))
    pos = _HEAD.size
    fields = []
    for _ in range(2 + n):
        if pos + 2 > len(data):
            raise bad("truncated")
        (ln,) = struct.unpack_from("<H", data, pos)
        pos += 2
        if pos + ln > len(data):
            raise bad("truncated")
        fields.append(data[pos:pos + ln])
        pos += ln
    if pos != len(data):
        raise bad("trailing bytes")
    descs = [rdmax.Desc(f) for f in fields[2:]]
    return Peer(layout, descs, rdmax.Desc(fields[0]), fields[1].decode())


def head_slices(local, remote):
    """For an integer TP ratio, [(remote_rank, local_off, remote_off, length)] of the
    head slices one local block shares with remote ranks' blocks (HND layout)."""
    if local.num_heads * local.tp_size != remote.num_heads * remote.tp_size:
        raise ValueError("the two sides hold different total head counts")
    if local.head_bytes != remote.head_bytes:
        raise ValueError("head slices differ in size (block size, head dim or dtype)")
    hb = local.head_bytes
    if local.tp_size >= remote.tp_size:
        if local.tp_size % remote.tp_size:
            raise ValueError("TP sizes %d and %d are not an integer ratio" %
                             (local.tp_size, remote.tp_size))
        ratio = local.tp_size // remote.tp_size
        r_rank = local.tp_rank // ratio
        off = (local.tp_rank % ratio) * local.num_heads * hb
        return [(r_rank, 0, off, local.block_bytes)]
    if remote.tp_size % local.tp_size:
        raise ValueError("TP sizes %d and %d are not an integer ratio" %
                         (local.tp_size, remote.tp_size))
    ratio = remote.tp_size // local.tp_size
    return [(local.tp_rank * ratio + i, i * remote.block_bytes, 0, remote.block_bytes)
            for i in range(ratio)]


class _Request:
    __slots__ = ("id", "kind", "jobs", "deadline", "notify", "error")

    def __init__(self, rid, kind, jobs, deadline, notify):
        self.id = rid
        self.kind = kind  # "push" or "pull"
        self.jobs = jobs
        self.deadline = deadline
        self.notify = notify  # (peer, message) once the jobs completed
        self.error = None


class Agent:
    """One worker's KV caches and its transfers; thread-safe."""

    def __init__(self, client, layout, name):
        self.client = client
        self.layout = layout
        self.name = name
        self.mailbox = "rdmaxkv.%s.%d" % (name, layout.tp_rank)
        self.regions = []
        self._lock = threading.Lock()
        self._active = {}
        self._sending, self._recving, self._failed = set(), set(), {}
        self._expected = {}  # request -> deadline (monotonic) of a push we wait for
        # Region pairs one paged job may carry (1: a daemon that predates them).
        self._max_pairs = client.info().get("max_paged_pairs", 1)
        self.mailbox_addr = client.mailbox_open(self.mailbox)

    # ---- caches

    def alloc_caches(self, access=rdmax.ACCESS_REMOTE_READ | rdmax.ACCESS_REMOTE_WRITE):
        """Allocate every cache region in host memory; returns them (writable buffers)."""
        size = self.layout.num_blocks * self.layout.block_bytes
        self.register_caches([self.client.alloc_host(size, access)
                              for _ in range(self.layout.regions)])
        return self.regions

    def register_caches(self, caches, access=rdmax.ACCESS_REMOTE_READ |
                        rdmax.ACCESS_REMOTE_WRITE):
        """Register the caches, in order layer 0 K, layer 0 V, layer 1 K, ... (or one per
        layer): rdmax Regions, or GPU tensors (__cuda_array_interface__, data_ptr())."""
        if len(caches) != self.layout.regions:
            raise ValueError("%d caches for %d layers x %d" % (len(caches), self.layout.num_layers,
                                                                self.layout.kv_per_layer))
        regions = []
        need = self.layout.num_blocks * self.layout.block_bytes
        for c in caches:
            r = c if isinstance(c, rdmax.Region) else self.client.register_gpu_tensor(c, access)
            if r.length < need:
                raise ValueError("a cache of %d bytes is smaller than %d blocks of %d" %
                                 (r.length, self.layout.num_blocks, self.layout.block_bytes))
            regions.append(r)
        self.regions = regions

    def handshake(self):
        """Versioned bytes for the peers: layout facts, mailbox and one descriptor per cache."""
        return encode_handshake(self.layout, [r.desc() for r in self.regions],
                                self.mailbox_addr, self.name)

    def add_peer(self, handshake):
        return decode_handshake(handshake)

    # ---- transfers

    def _jobs(self, op, local_blocks, peers, remote_blocks, deadline):
        slices = head_slices(self.layout, peers[0].layout)
        jobs = []
        step = max(1, self._max_pairs)
        for rank, l_off, r_off, length in slices:
            peer = peers[rank] if len(peers) > 1 else peers[0]
            # Every layer's K and V with the same block ids: one job of region pairs.
            for first in range(0, len(self.regions), step):
                group = range(first, min(first + step, len(self.regions)))
                jobs.append(rdmax.Job(
                    op, self.regions[first], peer.descs[first], page_len=length,
                    local_pages=local_blocks, local_pages_offset=l_off,
                    local_pages_stride=self.layout.block_bytes, remote_pages=remote_blocks,
                    remote_pages_offset=r_off, remote_pages_stride=peer.layout.block_bytes,
                    deadline=deadline,
                    pairs=[(self.regions[i], peer.descs[i]) for i in group[1:]]))
        return jobs

    def _start(self, rid, kind, op, local_blocks, peer, remote_blocks, deadline, msg):
        peers = peer if isinstance(peer, (list, tuple)) else [peer]
        jobs = self._jobs(op, local_blocks, peers, remote_blocks, deadline)
        with self._lock:
            if rid in self._active:
                raise ValueError("request %r is already in flight" % rid)
            self.client.submit(jobs)
            self._active[rid] = _Request(
                rid, kind, jobs, None if deadline is None else time.monotonic() + deadline,
                [(p, msg + rid.encode()) for p in peers])

    def push(self, request_id, local_blocks, peer, remote_blocks, deadline=None):
        """Write local blocks into the peer's blocks (every layer, one batch); the peer
        learns it from get_finished() (done receiving) once everything landed."""
        self._start(request_id, "push", rdmax.OP_PAGED_WRITE, local_blocks, peer,
                    remote_blocks, deadline, _MSG_WRITTEN)

    def pull(self, request_id, local_blocks, peer, remote_blocks, deadline=None):
        """Read the peer's blocks into local blocks (every layer, one batch); the peer
        learns from its get_finished() (done sending) that it may free them. ``peer`` is a
        list of peers (indexed by TP rank) when this side has the smaller TP size."""
        self._start(request_id, "pull", rdmax.OP_PAGED_READ, local_blocks, peer,
                    remote_blocks, deadline, _MSG_READ)

    def expect(self, request_id, deadline):
        """A peer will push this request: fail it if nothing landed within deadline s."""
        with self._lock:
            self._expected[request_id] = time.monotonic() + deadline

    def get_finished(self):
        """(done_sending, done_receiving, failed): sets of request ids, and a dict of
        request id -> rdmax.Error. Each request is reported once."""
        now = time.monotonic()
        # Routes completions to their jobs; messages stay for recv() below.
        self.client.poll(0, kinds=(rdmax.Event.COMPLETION,))
        with self._lock:
            for rid, req in list(self._active.items()):
                err = next((j for j in req.jobs if j.status not in (None, 0)), None)
                if err is not None:
                    for j in req.jobs:
                        if j.status is None:
                            j.cancel()
                    self._failed[rid] = rdmax.error_for(err.status, err.reason)
                    del self._active[rid]
                elif all(j.status == 0 for j in req.jobs):
                    if req.notify:
                        # Phase two: tell the other side, then report the request.
                        try:
                            req.jobs = [self.client.send(peer.mailbox, msg,
                                                         deadline=_NOTIFY_DEADLINE)
                                        for peer, msg in req.notify]
                        except rdmax.Error as e:
                            self._failed[rid] = e
                            del self._active[rid]
                        req.notify = None
                        continue
                    del self._active[rid]
                    (self._recving if req.kind == "pull" else self._sending).add(rid)
                elif req.deadline is not None and now > req.deadline + _NOTIFY_DEADLINE:
                    # Job deadlines fire first; this only catches a completion that never came.
                    self._failed[rid] = rdmax.Timeout(rdmax.Timeout.code,
                                                      "request %r passed its deadline" % rid)
                    del self._active[rid]
            while True:
                try:
                    box, payload, _ = self.client.recv(self.mailbox, 0)
                except rdmax.Timeout:
                    break
                kind, rid = payload[:1], payload[1:].decode()
                if kind == _MSG_WRITTEN:
                    self._expected.pop(rid, None)
                    self._recving.add(rid)
                elif kind == _MSG_READ:
                    self._sending.add(rid)
            for rid, dl in list(self._expected.items()):
                if now > dl:
                    del self._expected[rid]
                    self._failed[rid] = rdmax.Timeout(
                        rdmax.Timeout.code, "no KV for request %r within its deadline" % rid)
            out = (self._sending, self._recving, self._failed)
            self._sending, self._recving, self._failed = set(), set(), {}
            return out

    def wait(self, timeout):
        """Sleep until a completion or message may have changed get_finished()'s
        answer, at most ``timeout`` seconds (GIL released)."""
        self.client.poll(timeout, max=0, kinds=(rdmax.Event.COMPLETION, rdmax.Event.MESSAGE))

    def pending(self):
        """Requests with jobs (or their notification) still in flight."""
        with self._lock:
            return len(self._active)

    def close(self):
        """Close the agent's mailbox (the caches stay the caller's)."""
        self.client.mailbox_close(self.mailbox)
