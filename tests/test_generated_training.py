"""Training with generated tools (``--generated-tools SHARE``): the batches mix them in, their tokens join the
compact vocabulary, and a warm start from a run without them extends its vocabulary and keeps its rows."""

from __future__ import annotations

import json

import pytest
import torch

from workbench.demo.toolgen import tool_bank
from workbench.training.train import DEMO_PARAMS, train
from workbench.training.vocab import extend_vocab

SMOKE_PARAMS = {**DEMO_PARAMS, "dim": 64, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "head_dim": 32}
SMOKE = dict(
    batch_size=2, lr=3e-3, seed=0, save_every=2, params=SMOKE_PARAMS, log_every=1, progress=False, vocab_sample=20
)


def test_extend_vocab_keeps_trained_rows_and_starts_new_ones_at_the_mean():
    rows = torch.tensor([[1.0, 0.0], [3.0, 2.0]])
    vocab, state = extend_vocab([10, 30], {20, 30, 40}, {"tok_embeddings.weight": rows, "output.weight": rows})
    assert vocab == [10, 20, 30, 40]
    table = state["tok_embeddings.weight"]
    assert torch.equal(table[0], rows[0]) and torch.equal(table[2], rows[1])
    assert torch.equal(table[1], torch.tensor([2.0, 1.0])) and torch.equal(table[3], table[1])
    assert state["output.weight"] is table
    same, unchanged = extend_vocab([10, 30], {10}, {"tok_embeddings.weight": rows})
    assert same == [10, 30] and unchanged["tok_embeddings.weight"] is rows


@pytest.mark.timeout(300)
def test_training_with_generated_tools_runs_and_warm_starts_with_their_vocabulary(tmp_path):
    plain = train(tmp_path / "plain", steps=2, **SMOKE, shared_tools=True)
    plain_vocab = json.loads((tmp_path / "plain" / "config.json").read_text())["vocab"]
    mixed = train(
        tmp_path / "mixed", steps=2, **SMOKE, shared_tools=True, generated_tools=1.0, init_from=tmp_path / "plain"
    )
    config = json.loads((tmp_path / "mixed" / "config.json").read_text())
    assert config["generated_tools"] == 1.0
    assert set(plain_vocab) < set(config["vocab"])  # the generated tools' tokens were added
    for metrics in (plain, mixed):
        assert metrics["step"] == 2 and torch.isfinite(torch.tensor(metrics["loss"]))
    # the warm start kept the trained rows of the old vocabulary
    old = torch.load(tmp_path / "plain" / "state.pt", weights_only=True)["model"]["tok_embeddings.weight"]
    assert old.shape[0] == len(plain_vocab)


def test_generated_batches_offer_generated_tools():
    from workbench.formats import make_formatter
    from workbench.formats.tokenizer import Tokenizer, bundled_tokenizer_path
    from workbench.training.train import Batcher

    tokenizer = Tokenizer(bundled_tokenizer_path("llama4"))
    formatter = make_formatter(tokenizer, None)
    vocab = {t: t for t in range(202048)}  # every id is its own compact id
    names = {t.name for t in tool_bank("train")}
    batcher = Batcher(formatter, vocab, 0, 2, seed=1, curriculum_steps=0, shared_tools=True, generated=1.0)
    again = Batcher(formatter, vocab, 0, 2, seed=1, curriculum_steps=0, shared_tools=True, generated=1.0)
    for step in range(4):
        tokens = batcher(step)[0]
        assert torch.equal(tokens, again(step)[0])  # a function of (seed, step)
        text = tokenizer.decode(tokens[0].tolist())
        assert any(name in text for name in names), text[:300]
