"""The decoding requests of one engine, kept as sums so a step never visits each of them.

Every decode step adds one token to every decoding request, so the batch is described by
a step counter and three sums: the batch size, the context (``s0 + size * counter``) and
the output still to generate (``target_sum - size * counter``). A request joining at
counter ``j`` with a prompt of ``p`` tokens finishes at counter ``j + output - 1``; the
requests are kept in a heap by that target, so the next completion is the heap's top.

A heap entry is one int, ``target << 40 | arrival number``: popping compares ints (ties
by arrival), not tuples. An aborted request leaves the sums at once and its heap entry is
skipped when it comes up.
"""

from __future__ import annotations

import heapq

from taskplane.sim.requests import EngineRequest, ReqState

_SEQ_BITS = 40  # arrival numbers below 2**40


class DecodeBatch:
    """The decoders, their step counter and the per-request gpu-second accumulator."""

    __slots__ = ("_by_key", "_heap", "_n_aborted", "_seq", "acc", "counter", "n", "s0", "target_sum")

    def __init__(self) -> None:
        self._heap: list[int] = []  # keys of the decoders (and of aborted ones)
        self._by_key: dict[int, EngineRequest] = {}  # key -> request, while in the heap
        self._n_aborted = 0  # aborted decoders still in the heap
        self._seq = 0
        self.n = 0  # decoding requests
        self.s0 = 0  # sum over decoders of (prompt + 1 - join): context = s0 + n * counter
        self.target_sum = 0
        self.counter = 0  # decode steps so far (never reset: joins are relative to it)
        self.acc = 0.0  # gpu-seconds per decoding request, summed over steps

    @property
    def context(self) -> int:
        """Context tokens the next decode step reads, over all decoders."""
        return self.s0 + self.n * self.counter

    def pending_tokens(self) -> int:
        """Output tokens the decoders still have to generate."""
        return self.target_sum - self.n * self.counter

    def steps_to_next_finish(self) -> int:
        """Decode steps until the next decoder finishes (the heap must not be empty)."""
        return (self._heap[0] >> _SEQ_BITS) - self.counter

    def generated(self, r: EngineRequest) -> int:
        """Tokens ``r`` has generated so far (its first came with its prefill)."""
        return min(r.spec.output_tokens, 1 + self.counter - r.join)

    def advance(self, steps: int, gpu_s_each: float) -> None:
        """``steps`` decode steps were committed, costing each decoder ``gpu_s_each``."""
        self.acc += gpu_s_each
        self.counter += steps

    def join(self, r: EngineRequest) -> None:
        """``r`` finished its prefill (with its first token) and decodes from the next step."""
        r.state = ReqState.DECODE
        r.join = self.counter
        r.target = self.counter + r.spec.output_tokens - 1
        r.acc0 = self.acc
        self.n += 1
        self.s0 += r.spec.prompt_tokens + 1 - r.join
        self.target_sum += r.target
        self._seq += 1
        key = r.target << _SEQ_BITS | self._seq
        heapq.heappush(self._heap, key)
        self._by_key[key] = r

    def leave(self, r: EngineRequest) -> None:
        """Take ``r``'s contribution out of the sums and settle its gpu-seconds."""
        self.n -= 1
        self.s0 -= r.spec.prompt_tokens + 1 - r.join
        self.target_sum -= r.target
        r.gpu_s += self.acc - r.acc0

    def abort(self, r: EngineRequest) -> None:
        """``r`` is dropped mid-decode (its heap entry is skipped when it comes up)."""
        self.leave(r)
        self._n_aborted += 1

    @property
    def has_aborted(self) -> bool:
        return self._n_aborted > 0

    def pop_finished(self) -> list[EngineRequest]:
        """The decoders whose last token came with the step just committed, in target then
        arrival order; they have left the batch (aborted entries are dropped on the way)."""
        heap, by_key = self._heap, self._by_key
        bound = (self.counter + 1) << _SEQ_BITS  # keys below: target reached
        done = []
        while heap:
            key = heap[0]
            if key < bound:
                heapq.heappop(heap)
                r = by_key.pop(key)
                if r.state is ReqState.DECODE:
                    self.leave(r)
                    done.append(r)
                else:  # aborted earlier
                    self._n_aborted -= 1
            elif self._n_aborted and by_key[key].state is not ReqState.DECODE:  # aborted earlier
                heapq.heappop(heap)
                del by_key[key]
                self._n_aborted -= 1
            else:
                break
        return done

    def clear(self) -> None:
        """An engine restart: no decoders (the counter and accumulator carry on)."""
        self._heap.clear()
        self._by_key.clear()
        self._n_aborted = 0
        self.n = self.s0 = self.target_sum = 0
