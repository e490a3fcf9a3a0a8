"""The prefix cache through its public API: which slot a prompt lands in, the prefixes a wave shares, the
copies between slots, and the rule that a slot's record is cleared before its prefix is written and set
only after the write completed (so an interrupted write never leaves a record of what a slot no longer
holds).  The last test drives the scheduler on a tiny checkpoint through an interrupted prefill."""

from __future__ import annotations

import pytest
import torch

from workbench.generation import Request, SamplingParams, Scheduler
from workbench.generation.prefix_cache import MIN_SHARED_PREFIX, PrefixCache
from workbench.models.args import ModelArgs
from workbench.models.distributed import ensure_model_parallel
from workbench.models.kv_cache import KVCache
from workbench.runtime.loading import load_model_for_rank
from workbench.session import resolve_settings

SLOTS, LENGTH = 4, 64


def _cache() -> KVCache:
    """A small cache whose every (slot, position) holds a distinct number: copies are visible."""
    cache = KVCache.allocate(2, SLOTS, 1, LENGTH, 2, torch.device("cpu"), torch.float32)
    for layer, (k, v) in enumerate(zip(cache.keys, cache.values)):
        k.copy_(torch.arange(k.numel(), dtype=torch.float32).reshape(k.shape) + 1000 * layer)
        v.copy_(-k)
    return cache


def _ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


PREFIX = _ids(100, 20)  # longer than MIN_SHARED_PREFIX


def test_a_prompt_lands_in_the_slot_that_holds_its_prefix() -> None:
    pc = PrefixCache(_cache())
    pc.hold(2, PREFIX + [7, 8])
    pc.hold(1, _ids(500, 30))
    prompts = [_ids(900, 5), PREFIX + [1, 2, 3], _ids(500, 20) + [0]]
    assert pc.assign([0, 1, 2, 3], prompts) == [0, 2, 1]
    # a held prefix shorter than MIN_SHARED_PREFIX does not pull a prompt to its slot
    short = PrefixCache(_cache())
    short.hold(3, PREFIX[: MIN_SHARED_PREFIX - 2])
    assert short.assign([0, 3], [PREFIX + [1]]) == [0]
    # a slot that is not free is never assigned, even if it holds the prefix
    assert pc.assign([0, 3], [PREFIX + [1]]) == [0]
    pc.enabled = False  # reuse off: free slots in order
    assert pc.assign([0, 1, 2, 3], prompts) == [0, 1, 2]


def test_shared_prefixes_are_planned_once_per_run_of_sharers() -> None:
    pc = PrefixCache(_cache())
    rows = [(0, PREFIX + [1, 2]), (1, _ids(700, 30)), (2, PREFIX + [9]), (3, PREFIX + [5, 5, 5])]
    # rows 0, 2, 3 share PREFIX; row 1 shares nothing; the host is the first of the run in sorted order
    assert pc.shared_prefixes(rows) == [(0, PREFIX)]
    # never a row's last token: two identical rows share all but their last token
    assert pc.shared_prefixes([(0, PREFIX), (1, PREFIX)]) == [(0, PREFIX[:-1])]
    # a prefix some slot already holds is not planned again (it is copied from there)
    pc.hold(1, PREFIX + [42])
    assert pc.shared_prefixes([r for r in rows if r[0] != 1]) == []
    # sharing fewer than MIN_SHARED_PREFIX tokens is no sharing
    short = PrefixCache(_cache())
    assert short.shared_prefixes([(0, PREFIX[:10] + [1] * 20), (1, PREFIX[:10] + [2] * 20)]) == []
    short.enabled = False
    assert short.shared_prefixes(rows) == []


def test_plan_reuses_the_own_slot_at_any_length_and_copies_long_prefixes() -> None:
    pc = PrefixCache(_cache())
    pc.hold(0, _ids(100, 5))  # short, but it is the item's own slot: reused without a copy
    pc.hold(1, PREFIX + [1, 2, 3])
    plan = pc.plan([(0, _ids(100, 8), 7), (2, PREFIX + [4, 5], 21), (3, PREFIX[:10] + [6], 10)])
    assert plan.starts == [5, 20, 0]  # slot 3 shares only 10 tokens with slot 1: recomputed
    assert plan.copies == [(1, 2, 20)]
    # the limit caps reuse (at least the last token is always computed by the callers)
    assert pc.plan([(2, PREFIX + [1, 2, 3], 18)]).starts == [18]
    assert pc.held()[1] == PREFIX + [1, 2, 3]  # planning changes nothing


def test_prepare_copies_keys_and_values_and_clears_the_written_slots() -> None:
    cache = _cache()
    pc = PrefixCache(cache)
    pc.hold(0, PREFIX + [1])
    pc.hold(1, _ids(300, 25))
    before = [t.clone() for t in cache.keys + cache.values]
    # slot 1 receives slot 0's prefix while slot 0 receives slot 1's: sources are read before any write
    starts = pc.prepare([(1, PREFIX + [9, 9], 21), (0, _ids(300, 20) + [7], 20)])
    assert starts == [20, 20]
    for old, new in zip(before, cache.keys + cache.values):
        assert torch.equal(new[1, :, :20], old[0, :, :20])
        assert torch.equal(new[0, :, :20], old[1, :, :20])
        assert torch.equal(new[2:], old[2:])  # other slots untouched
    assert pc.held() == {}  # both slots are being written: they claim nothing until hold()
    assert pc.stats == {"prefill_tokens": 2 + 1, "reused_tokens": 40}
    pc.hold(1, PREFIX + [9, 9])
    assert pc.held() == {1: PREFIX + [9, 9]}


class _FailingLayer:
    """A cache layer whose next copy raises, after the layers before it were already written."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.armed = True

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt
        return self.tensor.index_select(dim, index)

    def __getitem__(self, key):
        return self.tensor[key]


def test_an_interrupted_copy_leaves_no_record_of_the_overwritten_slot() -> None:
    cache = _cache()
    cache.values[-1] = _FailingLayer(cache.values[-1])
    pc = PrefixCache(cache)
    pc.hold(0, PREFIX + [1])
    pc.hold(2, _ids(300, 30))
    with pytest.raises(KeyboardInterrupt):
        pc.prepare([(2, PREFIX + [5], 20)])  # slot 2's keys were overwritten before the last layer failed
    assert pc.held() == {0: PREFIX + [1]}  # slot 2 no longer claims its old tokens
    assert pc.plan([(3, _ids(300, 30) + [1], 30)]).starts == [0]  # so nothing reuses them
    assert pc.prepare([(2, PREFIX + [5], 20)]) == [20]  # the next call works (the layer copies now)
    assert torch.equal(cache.values[-1].tensor[2, :, :20], cache.values[-1].tensor[0, :, :20])


def test_records_of_running_rows_grow_and_are_truncated_before_junk_writes() -> None:
    class Row:
        def __init__(self) -> None:
            self.tokens = _ids(100, 3)

        def held_tokens(self) -> list[int]:
            return self.tokens

    pc = PrefixCache(_cache())
    row = Row()
    pc.hold(0, row)
    row.tokens = row.tokens + [4, 5]  # fed by decode steps: the record follows without a call
    assert pc.held() == {0: _ids(100, 3) + [4, 5]}
    pc.truncate(0, 4)  # a padding row is about to write position 4 of slot 0
    pc.truncate(0, 6)  # a later, higher write does not extend the record again
    assert pc.held() == {0: _ids(100, 3) + [4]}
    pc.hold(1, PREFIX + [1, 2], cap=18)  # positions from 18 on hold something beyond token ids
    assert pc.held()[1] == PREFIX[:18]
    pc.truncate(2, 0)  # an empty slot has nothing to truncate
    pc.forget()
    assert pc.held() == {}


@pytest.fixture(scope="module")
def model(llama3_dir):
    ensure_model_parallel(1)
    return load_model_for_rank(resolve_settings(llama3_dir, max_seq_len=128), ModelArgs.from_checkpoint(llama3_dir))


def _tokens(scheduler: Scheduler, prompt: list[int]) -> list[int]:
    events = scheduler.generate([Request(0, prompt, SamplingParams.create(max_tokens=6))])
    return [e.token for e in events if e.token is not None]


def test_an_interrupted_prefill_leaves_the_scheduler_ready(model, monkeypatch) -> None:
    """Prompt B's prefill writes into the slot that held prompt A, then is interrupted: A must not be reused
    from that slot afterwards (it would read B's keys/values), and the next calls give fresh tokens."""
    a, b = _ids(1000, 40), _ids(5000, 40)
    fresh = Scheduler(model, stop_tokens={}, decode_text=lambda ids: "", max_batch_size=2, max_seq_len=128)
    expected_a, expected_b = _tokens(fresh, a), _tokens(fresh, b)

    scheduler = Scheduler(model, stop_tokens={}, decode_text=lambda ids: "", max_batch_size=2, max_seq_len=128)
    assert _tokens(scheduler, a) == expected_a
    assert scheduler.prefix_cache.held()[0][:40] == a
    forward = model.forward_packed

    def write_then_interrupt(*args, **kwargs):
        forward(*args, **kwargs)  # B's keys/values are in the slot now
        raise KeyboardInterrupt

    monkeypatch.setattr(model, "forward_packed", write_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        _tokens(scheduler, b)
    monkeypatch.undo()
    assert scheduler.prefix_cache.held() == {}
    reused = scheduler.stats["reused_tokens"]
    assert _tokens(scheduler, a) == expected_a
    assert scheduler.stats["reused_tokens"] == reused  # computed whole, not taken from the overwritten slot
    assert _tokens(scheduler, a + b[:3]) == _tokens(fresh, a + b[:3])  # and now reused from A's record
    assert scheduler.stats["reused_tokens"] > reused
    assert _tokens(scheduler, b) == expected_b  # the interrupted prompt itself runs as on a fresh scheduler
