"""bench.throughput's table and workbench.notebook.plots' figures (saved as PNGs), on a real tiny engine."""

from __future__ import annotations

import pytest

from workbench import bench, plots
from workbench.errors import InputError
from workbench.session import build_engine, resolve_settings


@pytest.fixture(scope="module")
def engine(llama3_dir):
    return build_engine(resolve_settings(llama3_dir, max_batch_size=4, max_seq_len=128))


@pytest.fixture(scope="module")
def table(engine):
    return bench.throughput(
        engine, batch_sizes=(1, 2, 4), prompt_lens=(8, 16), max_tokens=6, repeats=2, warmup=1, progress=False
    )


def test_throughput_table(table):
    assert list(table.columns) == list(bench.THROUGHPUT_COLUMNS)
    assert len(table) == 6 and set(table["batch_size"]) == {1, 2, 4} and set(table["prompt_len"]) == {8, 16}
    assert (table["repeats"] == 2).all() and (table["mode"] == "none").all()
    assert (table["tok_s_min"] <= table["tok_s"]).all() and (table["tok_s"] <= table["tok_s_max"]).all()
    assert (table["latency_p50_s"] <= table["latency_p90_s"]).all()
    assert (table["generated_tokens"] == 6 * table["batch_size"]).all()  # random tiny weights never stop early
    assert (table["prefill_tok_s"] > 0).all() and (table["ttft_s"] > 0).all()
    ones = table[table["batch_size"] == 1]
    assert (ones["speedup_vs_batch1"] == 1.0).all()


def test_synthetic_prompts_have_the_asked_length(engine):
    prompts = bench.synthetic_prompts(engine, 3, 20)
    assert [len(p) for p in prompts] == [20, 20, 20] and len({tuple(p) for p in prompts}) == 3
    assert all(not engine.tokenizer.is_special(t) for p in prompts for t in p[1:])


def test_throughput_over_modes_restores_the_mode(engine):
    table = bench.throughput(
        engine,
        batch_sizes=(1, 2),
        prompt_lens=(8,),
        max_tokens=3,
        repeats=1,
        warmup=0,
        modes=[None, "bf16"],
        progress=False,
    )
    assert table["mode"].tolist() == ["none", "none", "bf16", "bf16"]
    assert engine.settings.quantization is None
    with pytest.raises(InputError, match="repeats"):
        bench.throughput(engine, repeats=0)


def test_throughput_does_equal_work_in_every_mode_and_reports_it():
    """The demo model stops early on these prompts (so counting only what a normal call generates would
    compare unequal work); the table's calls ignore stop tokens and every row generates max_tokens."""
    demo = build_engine(resolve_settings(None, max_batch_size=4, max_seq_len=128, device="cpu"))
    try:
        prompts = bench.synthetic_prompts(demo, 4, 16, seed=3)
        natural = demo.batch_completion(prompts, max_tokens=24, progress=False)
        assert any(len(r.tokens) < 24 for r in natural)  # without equal work the counts would differ
        fixed = bench.fixed_length_run(demo, prompts, 24)  # the timed call: stop tokens kept as ordinary tokens
        assert [len(r.tokens) for r in fixed] == [24] * 4
        for short, full in zip(natural, fixed):  # the same greedy tokens up to where the normal call stopped
            assert full.tokens[: len(short.tokens)] == short.tokens
            assert short.stop_reason == "out_of_tokens" or full.tokens[len(short.tokens)] in demo.tokenizer.stop_tokens
        table = bench.throughput(
            demo,
            batch_sizes=(4,),
            prompt_lens=(16,),
            max_tokens=24,
            repeats=1,
            warmup=0,
            modes=[None, "int4_mixed"],
            progress=False,
        )
    finally:
        demo.close()
    assert table["mode"].tolist() == ["none", "int4_mixed"]
    assert (table["generated_tokens"] == 24 * table["batch_size"]).all()


def test_plots_save_pngs(table, tmp_path):
    fig = plots.throughput(table, save=tmp_path / "throughput.png")
    assert len(fig.axes) == 2 and len(fig.axes[0].get_lines()) >= 2  # one line per prompt length
    assert fig.axes[0].get_xlabel() == "batch size"
    png = (tmp_path / "throughput.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    plots.latency(table, save=tmp_path / "latency.png")
    assert (tmp_path / "latency.png").stat().st_size > 5000


def test_quantization_plot(engine, tmp_path):
    frame = bench.quantization(
        engine, ["Hello", "The capital of France is"], modes=(None, "bf16"), max_tokens=3, progress=False
    )
    fig = plots.quantization(frame, save=tmp_path / "q.png")
    assert [ax.get_title() for ax in fig.axes] == [
        "memory",
        "speed",
        f"fidelity to {frame.index[0]} (not task accuracy)",
    ]
    assert (tmp_path / "q.png").read_bytes()[:4] == b"\x89PNG"
    # memory: what the weights occupy, the float32 model's packed copy included, one bar height per mode
    memory, speed, accuracy = fig.axes
    tops = {}
    for bar in memory.patches:
        tops[round(bar.get_x(), 3)] = max(tops.get(round(bar.get_x(), 3), 0), bar.get_y() + bar.get_height())
    assert sorted(tops.values(), reverse=True) == pytest.approx(list(frame["resident_bytes"] / 2**20))
    assert plots.PACKED_LABEL in [t.get_text() for t in memory.get_legend().get_texts()]
    # speed: prefill and decode each relative to the first mode, so both show on one axis
    heights = [bar.get_height() for bar in speed.patches]
    assert heights[0] == pytest.approx(1.0) and heights[len(frame)] == pytest.approx(1.0)
    assert heights[len(frame) - 1] == pytest.approx(frame["prefill_tok_s"].iloc[-1] / frame["prefill_tok_s"].iloc[0])
    # accuracy: the share of unchanged replies, with its interval
    assert [bar.get_height() for bar in accuracy.patches] == pytest.approx(list(frame["same_reply"]))
