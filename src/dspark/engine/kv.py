"""KV memory of the engine: which request holds which slot of the store, and how much of it.

A fixed number of slots of fixed capacity is preallocated at start (the memory limit);
a request holds one slot from admission to completion, and requests beyond the slots
wait in the engine's queue. Occupied slots are kept dense (``0 .. n-1``): when a request
leaves, the highest occupied slot moves into the hole (one copy of that request's
cached tokens), so a step's decode runs span a short contiguous slot range and
attention reads them through a view (``targets/flat.py``).

Rollback is a length: the positions past ``length`` hold rejected drafts' keys/values,
which the causal mask never lets a later query read before they are overwritten.
"""

from __future__ import annotations

from dspark.targets.flat import KVStore


class KVMemory:
    """Slot bookkeeping over a :class:`KVStore` (one request per slot)."""

    def __init__(self, store: KVStore) -> None:
        self.store = store
        self._owner: list[int] = []  # request id per occupied slot, dense
        self._slot: dict[int, int] = {}  # request id -> slot
        self._length: dict[int, int] = {}  # request id -> cached tokens

    @property
    def capacity(self) -> int:
        """Tokens one request can hold."""
        return self.store.capacity

    @property
    def num_free(self) -> int:
        return self.store.num_slots - len(self._owner)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._slot

    def allocate(self, request_id: int) -> int:
        assert request_id not in self._slot, f"request {request_id} already holds a slot"
        if self.num_free == 0:
            raise RuntimeError("no free KV slot")
        slot = len(self._owner)
        self._owner.append(request_id)
        self._slot[request_id] = slot
        self._length[request_id] = 0
        return slot

    def release(self, request_id: int) -> None:
        """Free the request's slot; the last occupied slot moves into it.

        The move copies the moved request's committed ``length`` positions: commit every
        request's step before releasing any (tokens written past ``length`` are lost).
        """
        slot = self._slot.pop(request_id)
        del self._length[request_id]
        last = len(self._owner) - 1
        moved = self._owner.pop()
        if slot != last:
            self.store.move(last, slot, self._length[moved])
            self._owner[slot] = moved
            self._slot[moved] = slot

    def slot(self, request_id: int) -> int:
        return self._slot[request_id]

    def length(self, request_id: int) -> int:
        """Tokens cached for the request; its next token goes to this position."""
        return self._length[request_id]

    def set_length(self, request_id: int, length: int) -> None:
        """Commit (advance) or roll back the request's cached length."""
        if not 0 <= length <= self.capacity:
            raise ValueError(f"length {length} outside the slot capacity {self.capacity}")
        self._length[request_id] = length
