"""broker/advisor/wake.py: the thread CPU after the loop last woke from waiting for I/O."""

from __future__ import annotations

import asyncio
import time

from broker.advisor.wake import LastWake


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_work_after_a_wait_is_the_receive_and_the_selector_is_put_back() -> None:
    async def main() -> tuple[float, float, bool]:
        loop = asyncio.get_running_loop()
        selector = loop._selector
        with LastWake() as wake:
            assert wake.available and wake.cpu_s is None
            _spin(0.02)  # "sending": before the loop waits
            started = time.thread_time()
            await asyncio.sleep(0.01)  # nothing else to run: the loop waits in select
            woke = wake.cpu_s
            _spin(0.03)  # "receiving": after the wake
            received = time.thread_time() - woke
            wake.clear()
            assert wake.cpu_s is None
        restored = "select" not in vars(selector)  # the instance's own wrapper is gone
        return woke - started, received, restored

    before_wake, received, restored = asyncio.run(main())
    assert 0 <= before_wake < 0.01  # the send's spin came before the wait, not after it
    assert 0.03 <= received < 0.06
    assert restored


def test_a_loop_without_a_selector_measures_nothing() -> None:
    class Proactor:  # the shape of a loop asyncio does not build on a selector (uvloop, Windows)
        pass

    with LastWake(Proactor()) as wake:
        assert not wake.available and wake.cpu_s is None
