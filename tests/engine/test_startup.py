"""What the driver does while its workers start: :mod:`packshard.engine.startup`."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from packshard.engine import EngineOptions, open_engine
from packshard.engine.startup import Beside, while_starting
from tests.helpers import StartingEngine


def test_the_driver_does_every_item_while_the_workers_stay_starting() -> None:
    met: list[int] = []
    done = while_starting(
        StartingEngine(10_000), list(range(50)), lambda i, _: i * i, lambda: met.append(1)
    )
    assert done == [i * i for i in range(50)]
    assert met == [1]  # once, however long the workers take


def test_an_engine_that_is_up_leaves_the_items_to_its_workers() -> None:
    """The serial engine is never starting: the driver's thread is stopped at once."""
    gate = threading.Event()

    def own(i: int, stopped) -> int:
        gate.wait(1.0)  # the thread is still on its first item when it is told to stop
        return i

    met: list[int] = []
    with open_engine(EngineOptions(workers=1)) as engine:
        released = threading.Timer(0.05, gate.set)
        released.start()
        done = while_starting(engine, list(range(5)), own, lambda: met.append(1))
    assert not met
    assert done in ([], [0])  # at most the item in hand when it heard


@pytest.mark.parametrize("leave", ["none", "raise"])
def test_an_item_left_ends_the_prefix_whatever_follows(leave: str) -> None:
    def own(i: int, stopped) -> int | None:
        if i == 3:
            if leave == "raise":
                raise OSError("unreadable")
            return None
        return i

    done = while_starting(StartingEngine(10_000), list(range(8)), own)
    assert done == [0, 1, 2]  # 3 and everything after it go to the workers, in order


def test_an_item_in_hand_stops_once_the_workers_are_up() -> None:
    """``stopped`` turns true when the workers are up; an item that polls it gives up."""
    polled: list[bool] = []

    def own(i: int, stopped) -> int:
        while not stopped():
            time.sleep(0.005)
        polled.append(True)
        raise InterruptedError("left mid-item")

    assert while_starting(StartingEngine(2), ["big", "small"], own) == []
    assert polled == [True]  # the second item was never begun


def test_beside_loads_once_then_its_follow_up_and_says_whether_it_failed() -> None:
    calls: list[str] = []
    with ThreadPoolExecutor(1) as pool:
        load = Beside(pool, lambda: calls.append("load") or 42, lambda: calls.append("then"))
        load.start()
        load.start()
        assert load.result() == 42 and not load.failed()
    assert calls == ["load", "then"]

    with ThreadPoolExecutor(1) as pool:
        broken = Beside(pool, lambda: 1 // 0)
        assert broken.failed()  # starts it if nobody has
        with pytest.raises(ZeroDivisionError):
            broken.result()
