"""Which of `specasr serve`'s requests run and which wait (`Admission`), on the event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from .openai_api import ApiError, shutting_down

RETRY_AFTER_S = 2  # what a 429 tells the client to wait


class Admission:
    """Which requests run and which wait: at most `slots` transcriptions at once and `slots +
    queue` requests in the server (running, waiting for a turn, or still uploading). Used on
    the event loop's thread only."""

    def __init__(self, slots: int, queue: int) -> None:
        self.slots, self.limit = slots, slots + queue
        self.inside = 0  # admitted and not answered
        self.running = 0  # holding a slot: a worker thread transcribes for them
        self.draining = False
        self._turns: deque[asyncio.Future] = deque()

    @property
    def queued(self) -> int:
        return self.inside - self.running

    def enter(self) -> None:
        if self.draining:
            raise shutting_down()
        if self.inside >= self.limit:
            raise ApiError(
                429,
                f"The server is busy ({self.running} running, {self.queued} waiting); try again shortly.",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        self.inside += 1

    def leave(self) -> None:
        self.inside -= 1

    async def turn(self, timeout: float, timed_out: ApiError) -> None:
        """Waits up to `timeout` s for a slot; whoever gets one gives it back with `done`."""
        if self.draining:
            raise shutting_down()
        if self.running < self.slots and not self._turns:
            self.running += 1
            return
        turn = asyncio.get_running_loop().create_future()
        self._turns.append(turn)
        try:
            await asyncio.wait_for(turn, max(0.0, timeout))
        except BaseException as e:
            if turn.done() and not turn.cancelled() and turn.exception() is None:
                self.done()  # a slot came with the timeout: pass it on
            with contextlib.suppress(ValueError):
                self._turns.remove(turn)
            if isinstance(e, asyncio.TimeoutError):
                raise timed_out from None
            raise

    def done(self) -> None:
        self.running -= 1
        while self._turns and self.running < self.slots:
            turn = self._turns.popleft()
            if not turn.done():
                self.running += 1
                turn.set_result(None)

    def drain(self) -> None:
        """From now on nobody gets a turn: new requests and those waiting get 503."""
        self.draining = True
        while self._turns:
            turn = self._turns.popleft()
            if not turn.done():
                turn.set_exception(shutting_down())
