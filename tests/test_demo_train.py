"""The demo model's training command runs, is deterministic, and resumes exactly where it stopped."""

from __future__ import annotations

import json

import pytest
import torch

from workbench.training.train import DEMO_PARAMS, main, train

SMOKE_PARAMS = {**DEMO_PARAMS, "dim": 64, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "head_dim": 32}
SMOKE = dict(
    batch_size=2, lr=3e-3, seed=0, save_every=2, params=SMOKE_PARAMS, log_every=1, progress=False, vocab_sample=20
)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("spelled", [False, True], ids=["plain", "spelled"])
def test_training_resumes_to_the_same_weights_as_an_uninterrupted_run(tmp_path, spelled):
    straight = train(tmp_path / "straight", steps=4, **SMOKE, spelled=spelled)
    train(tmp_path / "resumed", steps=4, **{**SMOKE, "save_every": 2}, stop_after=2, spelled=spelled)
    resumed = train(tmp_path / "resumed", steps=4, **SMOKE, spelled=spelled)
    a = torch.load(tmp_path / "straight" / "state.pt", weights_only=True)
    b = torch.load(tmp_path / "resumed" / "state.pt", weights_only=True)
    assert a["step"] == b["step"] == 4
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=0, atol=0)
    assert straight["loss"] == pytest.approx(resumed["loss"], abs=0)
    log = [json.loads(line) for line in (tmp_path / "straight" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4] and all(r["loss"] > 0 for r in log)
    assert 0.0 <= log[-1]["token_acc"] <= 1.0
    if spelled:  # the saved model holds the materialised rows (what export ships), tied in and out
        assert torch.equal(a["model"]["tok_embeddings.weight"], a["model"]["output.weight"])
        assert not torch.equal(a["model"]["tok_embeddings.weight"], a["free_embeddings"])
        torch.testing.assert_close(a["free_embeddings"], b["free_embeddings"], rtol=0, atol=0)


@pytest.mark.timeout(300)
def test_batch_workers_give_the_same_run_and_stop_cleanly(tmp_path):
    """Batches made ahead by worker processes (what keeps a GPU busy) are the main process's batches."""
    here = train(tmp_path / "here", steps=6, **SMOKE)
    train(tmp_path / "workers", steps=6, **SMOKE, workers=2, stop_after=3)  # the workers are stopped mid-run
    ahead = train(tmp_path / "workers", steps=6, **SMOKE, workers=3)
    assert here["loss"] == pytest.approx(ahead["loss"], abs=0)
    a = torch.load(tmp_path / "here" / "state.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "workers" / "state.pt", weights_only=True)["model"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_spelled_rows_hold_the_spelling_of_word_tokens():
    from workbench.formats.tokenizer import Tokenizer, bundled_tokenizer_path
    from workbench.training.spelled import MAX_PIECES, SpelledEmbeddings, spelling_table
    from workbench.training.vocab import build_compact_vocab

    tokenizer = Tokenizer(bundled_tokenizer_path("llama4"))
    vocab = build_compact_vocab(tokenizer, sample_dialogs=5)
    to_compact = {t: i for i, t in enumerate(vocab)}
    rows, pieces = spelling_table(tokenizer, vocab)
    assert pieces.shape == (len(rows), MAX_PIECES)
    oslo = to_compact[tokenizer.encode(" Oslo")[0]]
    spelled_oslo = pieces[rows.tolist().index(oslo)]
    assert [vocab[i] for i in spelled_oslo if i >= 0] == tokenizer.encode("Oslo")  # "Os", "lo"
    assert len(tokenizer.encode("Oslo")) == 2
    # tokens that are not a word after a space are left alone
    assert to_compact[tokenizer.encode("Oslo")[0]] not in set(rows.tolist())
    assert to_compact[tokenizer.encode_special("<|eot|>")] not in set(rows.tolist())

    free = torch.nn.Parameter(torch.randn(len(vocab), 16, generator=torch.Generator().manual_seed(0)))
    speller = SpelledEmbeddings(free, rows, pieces, seed=0)
    rotation = speller.powers[1]  # [D, D], orthogonal, and the higher powers are its powers
    torch.testing.assert_close(rotation @ rotation.T, torch.eye(16), atol=1e-5, rtol=0)
    torch.testing.assert_close(speller.powers[2], rotation @ rotation, atol=1e-5, rtol=0)
    table = speller()  # [V, D]
    first, second = (int(i) for i in spelled_oslo[:2])
    want = speller.space + free[first] + rotation @ free[second]  # the free row of a word starts at zero
    torch.testing.assert_close(table[oslo], want, atol=1e-5, rtol=0)
    torch.testing.assert_close(table[first], free[first])  # a piece's row is its own
    table[oslo].sum().backward()  # training a word's row trains its pieces
    assert free.grad[second].abs().sum() > 0 and speller.space.grad.abs().sum() > 0
    # a warm start adopts exported rows: the same table, with the word rows still built from their pieces
    exported = torch.randn(len(vocab), 16, generator=torch.Generator().manual_seed(1))
    speller.adopt(exported)
    with torch.no_grad():
        torch.testing.assert_close(speller(), exported, atol=1e-5, rtol=0)
        free[second] += 1.0  # a piece's row moves every word spelled with it
        assert not torch.allclose(speller()[oslo], exported[oslo], atol=1e-3)


@pytest.mark.timeout(300)
def test_the_training_command_runs_and_exports_a_loadable_artifact(tmp_path):
    from workbench.demo.artifact import expand, full_state_dict

    (tmp_path / "params.json").write_text(json.dumps(SMOKE_PARAMS))
    main(
        [
            "--out",
            str(tmp_path / "run"),
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--save-every",
            "1",
            "--params",
            str(tmp_path / "params.json"),
            "--vocab-sample",
            "20",
            "--export",
            str(tmp_path / "demo.pt"),
            "--export-sample",
            "4",
        ]
    )
    artifact = torch.load(tmp_path / "demo.pt", weights_only=True)
    assert artifact["check"]["min_gap"] > 0
    state = full_state_dict(artifact)
    assert state["output.weight"].shape == (202048, 64)
    # training continues from the shipped artifact too (a fresh checkout has no training folder)
    train(tmp_path / "warm", steps=1, init_from=tmp_path / "demo.pt", **SMOKE)
    warm = json.loads((tmp_path / "warm" / "config.json").read_text())
    assert warm["vocab"] == artifact["vocab"].tolist()
    # ... also with spelled rows: the word rows split into spelling + free rest, the same table to start
    train(tmp_path / "warm-spelled", steps=1, init_from=tmp_path / "demo.pt", spelled=True, **SMOKE)
    first = [json.loads((tmp_path / run / "log.jsonl").read_text().splitlines()[0]) for run in ("warm", "warm-spelled")]
    assert first[0]["loss"] == pytest.approx(first[1]["loss"], rel=1e-4)
    folder = expand(tmp_path / "ckpt", tmp_path / "demo.pt")
    import workbench as wb

    engine = wb.load(str(folder), max_seq_len=256, max_batch_size=2)
    try:
        out = engine.completion("Hello", max_tokens=3, temperature=0.0)
        assert len(out.tokens) <= 3
    finally:
        wb.unload()
