"""The tool loop that moves each dialog on its own (``workbench/tools/flow.py``): transcripts equal to the
turn-synchronous loop's (``run_turns``) and the run store's rows shared with it, slow tools that run while the
other dialogs decode (a loose timing, the exact numbers are in bench/), ``tool_concurrency=1``, ``as_completed``
order, ``async def`` tools."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import workbench as wb
from workbench import tools
from workbench.errors import InputError

CITIES = ["Paris", "Oslo", "Tokyo", "Lima", "Paris", "Cairo", "Paris", "Rome"]
DIALOGS = [[{"role": "user", "content": f"What's the weather in {city}?"}] for city in CITIES]


@pytest.fixture(scope="module")
def demo():
    engine = wb.load()
    yield engine
    wb.unload()


class _Weather:
    """A get_weather whose Paris answer takes ``slow`` seconds; counts the calls running at once."""

    def __init__(self, slow: float = 0.0) -> None:
        self.slow = slow
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.calls: list[str] = []

    def get_weather(self, city: str) -> str:
        """Current weather for a city.

        Args:
            city: The city's name.
        """
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.calls.append(city)
        try:
            if city == "Paris":
                time.sleep(self.slow)
            return f"{len(city) + 10} C and sunny"
        finally:
            with self.lock:
                self.now -= 1


def test_per_dialog_transcripts_equal_the_turn_synchronous_loop_and_share_its_store(demo, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "runs.sqlite"))
    weather = _Weather()
    synchronous = tools.run_turns(demo, DIALOGS, [weather.get_weather], max_tokens=48, run="loops")
    per_dialog = tools.run_batch(demo, DIALOGS, [weather.get_weather], max_tokens=48)
    assert per_dialog == synchronous
    assert [t.stop_reason for t in per_dialog] == [t.stop_reason for t in synchronous]
    assert any(m.role == "tool" for t in per_dialog for m in t)  # the dialogs did call the tool
    stored = tools.run_batch(demo, DIALOGS, [weather.get_weather], max_tokens=48, run="loops")
    assert stored == synchronous and all(t.cached for t in stored)  # every turn answered by the other loop's rows
    sampled = dict(max_tokens=48, temperature=0.7, seed=7)
    assert tools.run_batch(demo, DIALOGS[:4], [weather.get_weather], **sampled) == tools.run_turns(
        demo, DIALOGS[:4], [weather.get_weather], **sampled
    )


def test_slow_tools_run_while_the_other_dialogs_decode(demo):
    """Three Paris dialogs whose tool takes 1 s: the slow calls run at once (not one after another, as the
    turn-synchronous loop ran them) and the dialogs without a slow tool end first.  The time it saves is
    measured in bench/loop.py, not asserted here."""
    expected = tools.run_batch(demo, DIALOGS, [_Weather().get_weather], max_tokens=48)
    slow = _Weather(slow=1.0)
    order = []
    for k, transcript in tools.as_completed(demo, DIALOGS, [slow.get_weather], max_tokens=48):
        order.append(k)
        assert transcript == expected[k]
    assert sorted(order) == list(range(len(DIALOGS)))
    assert slow.calls.count("Paris") == 3 and slow.most >= 2  # the slow calls overlapped
    paris = {k for k, city in enumerate(CITIES) if city == "Paris"}
    assert set(order[-3:]) == paris  # the dialogs waiting for Paris ended last


def test_tool_concurrency_one_runs_one_call_at_a_time(demo):
    weather = _Weather(slow=0.05)
    transcripts = tools.run_batch(demo, DIALOGS, [weather.get_weather], max_tokens=48, tool_concurrency=1)
    assert weather.most == 1 and len(weather.calls) >= len(DIALOGS)
    assert transcripts == tools.run_turns(demo, DIALOGS, [_Weather().get_weather], max_tokens=48)
    with pytest.raises(InputError, match="tool_concurrency"):
        tools.run_batch(demo, DIALOGS, [weather.get_weather], tool_concurrency=0)


def test_async_tools_are_awaited(demo):
    async def get_weather(city: str) -> str:
        """Current weather for a city.

        Args:
            city: The city's name.
        """
        await asyncio.sleep(0.01)
        return f"{len(city) + 10} C and sunny"

    got = tools.run_batch(demo, DIALOGS[:2], [get_weather], max_tokens=48)
    want = tools.run_batch(demo, DIALOGS[:2], [_Weather().get_weather], max_tokens=48)
    assert got == want
    assert wb.tools.run(demo, DIALOGS[0], [get_weather], max_tokens=48) == want[0]
