#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Disaggregated prefill/decode with rdmax.kv, in two processes.

    kv_prefill_decode.py decode  --socket B.sock --dir DIR [--requests N]
    kv_prefill_decode.py prefill --socket A.sock --dir DIR [--requests N]

Both sides allocate K and V caches for every layer (torch tensors over rdmax
host memory when torch is installed, numpy otherwise) and swap handshakes
through DIR. Prefill fills its blocks; every request moves 8 non-contiguous
blocks of all layers: even requests are pushed by prefill (PAGED_WRITE),
odd ones pulled by decode (PAGED_READ). Each side learns from
get_finished() what the other did. Decode checks every byte and both print
the checksum of the KV that moved.
"""
import argparse
import hashlib
import os
import sys
import time

import numpy as np

import rdmax
import rdmax.kv

try:
    import torch
except ImportError:
    torch = None

LAYERS, BLOCKS, BLOCK_BYTES, PER_REQ = 4, 512, 16384, 8


def prefill_blocks(req):
    # Request r owns prefill blocks [16r, 16r + 16), of which 8 scattered ones move.
    rng = np.random.default_rng([11, req])
    return (req * 16 + np.sort(rng.choice(16, PER_REQ, replace=False))).astype(np.uint32)


def decode_blocks(req, n_req):
    # Every request gets 8 distinct decode blocks, in scrambled order.
    perm = np.random.default_rng(13).permutation(BLOCKS)[:n_req * PER_REQ]
    return perm[req * PER_REQ:(req + 1) * PER_REQ].astype(np.uint32)


def pattern(region, block):
    return np.random.default_rng([17, region, block]).integers(0, 256, BLOCK_BYTES,
                                                                dtype=np.uint8)


def view(region):
    """The cache as (blocks, bytes): a torch tensor when torch is there, else numpy."""
    a = np.frombuffer(region, dtype=np.uint8).reshape(BLOCKS, BLOCK_BYTES)
    return torch.from_numpy(a) if torch is not None else a


def wait_file(path, timeout=30):
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > end:
            sys.exit("kv example: %s did not appear" % path)
        time.sleep(0.01)
    return open(path, "rb").read()


def publish(path, data):
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.rename(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["prefill", "decode"])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--requests", type=int, default=24)
    o = ap.parse_args()
    n = o.requests
    assert n * 16 <= BLOCKS and n * PER_REQ <= BLOCKS

    with rdmax.Client(o.socket, "kv-" + o.role) as client:
        layout = rdmax.kv.Layout(LAYERS, BLOCKS, BLOCK_BYTES, kv_per_layer=2)
        agent = rdmax.kv.Agent(client, layout, o.role)
        caches = [view(r) for r in agent.alloc_caches()]
        me = os.path.join(o.dir, o.role + ".hs")
        publish(me, agent.handshake())
        other = "decode" if o.role == "prefill" else "prefill"
        peer = agent.add_peer(wait_file(os.path.join(o.dir, other + ".hs")))
        digest = hashlib.sha256()
        deadline = time.monotonic() + 60

        if o.role == "prefill":
            for r in range(n):
                for i, c in enumerate(caches):
                    for b in prefill_blocks(r):
                        c[int(b)] = torch.from_numpy(pattern(i, int(b))) \
                            if torch is not None else pattern(i, int(b))
            publish(os.path.join(o.dir, "filled"), b"")
            for r in range(0, n, 2):
                agent.push("req-%d" % r, prefill_blocks(r), peer, decode_blocks(r, n),
                           deadline=20)
            sent = set()
            while len(sent) < n:
                done_send, _, failed = agent.get_finished()
                if failed:
                    sys.exit("prefill: failed: %r" % failed)
                sent |= done_send
                if time.monotonic() > deadline:
                    sys.exit("prefill: %d of %d requests done" % (len(sent), n))
                if not done_send:
                    agent.wait(0.5)
            for r in range(n):
                for i in range(layout.regions):
                    for b in prefill_blocks(r):
                        digest.update(pattern(i, int(b)).tobytes())
            print("prefill: %d requests sent (%d pushed, %d pulled), %d layers x K,V, "
                  "checksum %s" % (n, (n + 1) // 2, n // 2, LAYERS, digest.hexdigest()[:16]))
        else:
            wait_file(os.path.join(o.dir, "filled"))
            for r in range(0, n, 2):
                agent.expect("req-%d" % r, 30)
            for r in range(1, n, 2):
                agent.pull("req-%d" % r, decode_blocks(r, n), peer, prefill_blocks(r),
                           deadline=20)
            got = set()
            while len(got) < n:
                _, done_recv, failed = agent.get_finished()
                if failed:
                    sys.exit("decode: failed: %r" % failed)
                got |= done_recv
                if time.monotonic() > deadline:
                    sys.exit("decode: %d of %d requests arrived" % (len(got), n))
                if not done_recv:
                    agent.wait(0.5)
            for r in range(n):
                for i, c in enumerate(caches):
                    for pb, db in zip(prefill_blocks(r), decode_blocks(r, n)):
                        want = pattern(i, int(pb))
                        have = c[int(db)].numpy() if torch is not None else c[int(db)]
                        if not np.array_equal(have, want):
                            sys.exit("decode: request %d region %d block %d differs" %
                                     (r, i, db))
                        digest.update(have.tobytes())
            print("decode: %d requests received and verified (%s), checksum %s" %
                  (n, "torch" if torch is not None else "numpy", digest.hexdigest()[:16]))
        del caches
        agent.close()


if __name__ == "__main__":
    main()
