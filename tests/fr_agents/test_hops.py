"""Thread hops for the rollout's event loop: every caller gets its own outcome, results that
arrive together are handed back in one loop wake-up, and blocking calls do not hold up others."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from fr_agents.hops import HopPool, Inbox, inbox


def test_each_call_gets_its_own_result_or_exception() -> None:
    pool = HopPool(4, "t-hops")

    def work(i: int) -> int:
        if i % 5 == 3:
            raise KeyError(i)
        return i * i

    async def main() -> list[object]:
        return await asyncio.gather(*(pool.call(work, i) for i in range(40)), return_exceptions=True)

    out = asyncio.run(main())
    for i, got in enumerate(out):
        if i % 5 == 3:
            assert isinstance(got, KeyError) and got.args == (i,)
        else:
            assert got == i * i


class CountingInbox(Inbox):
    """An inbox that counts its drains (loop wake-ups)."""

    drains = 0

    def _drain(self) -> None:
        CountingInbox.drains += 1
        super()._drain()


def test_results_that_arrive_together_are_delivered_in_one_loop_wake_up() -> None:
    async def main() -> list[int]:
        box = CountingInbox(asyncio.get_running_loop())
        futures = [box.loop.create_future() for _ in range(50)]
        sent = threading.Event()

        def send() -> None:
            for i, fut in enumerate(futures):
                box.put(fut, (True, i))
            sent.set()

        threading.Thread(target=send).start()
        sent.wait(10)  # the loop is held here: all 50 results arrive before it can drain
        return list(await asyncio.gather(*futures))

    CountingInbox.drains = 0
    assert asyncio.run(main()) == list(range(50))
    assert CountingInbox.drains == 1


def test_a_cancelled_awaiter_gets_nothing_and_the_others_still_get_theirs() -> None:
    pool = HopPool(2, "t-hops")
    ran = []
    gate = threading.Event()
    finished = [threading.Event(), threading.Event()]

    def slow(i: int) -> int:
        gate.wait(10)
        ran.append(i)
        finished[i].set()
        return i

    async def main() -> list[int]:
        first = asyncio.ensure_future(pool.call(slow, 0))
        second = asyncio.ensure_future(pool.call(slow, 1))
        await asyncio.sleep(0.05)
        first.cancel()
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await first
        return [await second, await pool.call(lambda: 7)]

    assert asyncio.run(main()) == [1, 7]
    # The cancelled call's thread may still be between the gate and its append when the others
    # return: wait for it to end (it must, within the gate's own bound) rather than race it.
    assert finished[0].wait(10), "the cancelled call never ran to its end"
    assert sorted(ran) == [0, 1], "a started call runs to its end, as with run_in_executor"


def test_a_blocking_call_does_not_hold_up_the_others_and_threads_stay_within_max_workers() -> None:
    pool = HopPool(3, "t-hops-max")
    gate = threading.Event()

    async def main() -> tuple[float, int]:
        blocked = [asyncio.ensure_future(pool.call(gate.wait, 10)) for _ in range(2)]
        t = time.monotonic()
        assert await pool.call(lambda: 1) == 1  # the third thread serves it while two block
        fast = time.monotonic() - t
        more = [asyncio.ensure_future(pool.call(lambda i=i: i)) for i in range(5)]
        await asyncio.sleep(0.05)
        threads = sum(1 for th in threading.enumerate() if th.name.startswith("t-hops-max_"))
        gate.set()
        assert await asyncio.gather(*blocked) == [True, True]
        assert await asyncio.gather(*more) == list(range(5))
        return fast, threads

    fast, threads = asyncio.run(main())
    assert fast < 5.0
    assert threads == 3


def test_inbox_is_one_per_loop() -> None:
    async def two() -> bool:
        return inbox() is inbox()

    async def get() -> Inbox:
        return inbox()

    assert asyncio.run(two())
    assert asyncio.run(get()) is not asyncio.run(get())


def test_hop_pool_refuses_no_workers() -> None:
    with pytest.raises(ValueError, match="max_workers"):
        HopPool(0, "t")


def test_a_thread_caller_that_cancelled_its_future_gets_nothing_and_the_others_still_do() -> None:
    import concurrent.futures

    from fr_agents.hops import teller

    cancelled, kept = concurrent.futures.Future(), concurrent.futures.Future()
    assert cancelled.cancel()
    teller(cancelled)((True, 1))  # dropped, without raising in the worker
    teller(kept)((False, KeyError("k")))
    assert cancelled.cancelled()
    with pytest.raises(KeyError):
        kept.result(timeout=1)
