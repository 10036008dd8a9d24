"""A fleet router's view of one replica, built from vLLM's KV events alone (as llm-d's precise
prefix-cache scorer and Dynamo's KV router build theirs).

The replica publishes ``KVEventBatch`` messages on ZMQ (``--kv-events-config`` with the ``zmq``
publisher): multipart ``(topic, sequence number, msgpack payload)``; the payload is an array
``[timestamp, events, data_parallel_rank]``, each event a map tagged by ``type``: ``BlockStored``
(``block_hashes``, ``parent_block_hash``, ``token_ids``, ``block_size``, ``extra_keys``: one entry per
block, the ``cache_salt`` among them for a salted request's first block), ``BlockRemoved``
(``block_hashes``) or ``AllBlocksCleared``. The decoding here is plain msgpack, no vLLM types: what a
router written in another language sees.

:class:`PrefixIndex` keys every stored block by what a request would have to match to reuse it
(its parent block, its tokens, its extra keys) and predicts a request's hit as the longest chain of
its full blocks found in the index, never the last prompt token (vLLM computes it always).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import msgspec
import zmq


class PrefixIndex:
    def __init__(self) -> None:
        self._by_key: dict[tuple, object] = {}
        self._key_of: dict[object, tuple] = {}
        self.counts: Counter[str] = Counter()
        self.stored_salted = 0  # stored blocks whose extra keys name a cache salt

    def apply(self, event: dict) -> None:
        kind = event.get("type")
        self.counts[kind] += 1
        if kind == "BlockStored":
            size, tokens = event["block_size"], event["token_ids"]
            parent = _hashable(event.get("parent_block_hash"))
            extras = event.get("extra_keys") or [None] * len(event["block_hashes"])
            for i, block_hash in enumerate(event["block_hashes"]):
                block_hash = _hashable(block_hash)
                extra = _hashable(extras[i])
                if extra:
                    self.stored_salted += 1
                key = (parent, tuple(tokens[i * size:(i + 1) * size]), extra)
                self._by_key[key] = block_hash
                self._key_of[block_hash] = key
                parent = block_hash
        elif kind == "BlockRemoved":
            for block_hash in event["block_hashes"]:
                key = self._key_of.pop(_hashable(block_hash), None)
                if key is not None and self._by_key.get(key) == _hashable(block_hash):
                    del self._by_key[key]
        elif kind == "AllBlocksCleared":
            self._by_key.clear()
            self._key_of.clear()

    def __len__(self) -> int:
        return len(self._by_key)

    def predicted_hit(self, token_ids: list[int], block_size: int, extra_first: object = None) -> int:
        """Tokens of ``token_ids`` the replica would serve from its prefix cache, by the events: whole
        blocks from the start whose chain is indexed (``extra_first``: the first block's extra keys, e.g.
        a salt; None for a plain request), never the last token."""
        usable = (len(token_ids) - 1) // block_size
        parent, hit = None, 0
        for i in range(usable):
            extra = _hashable(extra_first) if i == 0 else None
            block_hash = self._by_key.get((parent, tuple(token_ids[i * block_size:(i + 1) * block_size]), extra))
            if block_hash is None:
                break
            parent, hit = block_hash, (i + 1) * block_size
        return hit


def _hashable(value):
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


class EventSubscriber:
    """Subscribes to a replica's KV events in a background thread and feeds a :class:`PrefixIndex`."""

    def __init__(self, endpoint: str, topic: str = "") -> None:
        self.index = PrefixIndex()
        self.batches = 0
        self._lock = threading.Lock()
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.RCVTIMEO, 200)
        self._socket.setsockopt_string(zmq.SUBSCRIBE, topic)
        self._socket.connect(endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                _topic, _seq, payload = self._socket.recv_multipart()
            except zmq.Again:
                continue
            _ts, events, *_ = msgspec.msgpack.decode(payload)
            with self._lock:
                self.batches += 1
                for event in events:
                    self.index.apply(event)

    def settle(self, quiet_s: float = 0.5, timeout_s: float = 10.0) -> None:
        """Wait until no batch has arrived for ``quiet_s`` (the replica publishes after its engine steps,
        from a thread of its own)."""
        deadline = time.monotonic() + timeout_s
        seen, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            with self._lock:
                batches = self.batches
            if batches != seen:
                seen, since = batches, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return
            time.sleep(0.05)

    def predicted_hit(self, token_ids: list[int], block_size: int, extra_first: object = None) -> int:
        with self._lock:
            return self.index.predicted_hit(token_ids, block_size, extra_first)

    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(self.index.counts)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close(0)
        self._context.term()
