"""The demo model's training command runs, is deterministic, and resumes exactly where it stopped."""

from __future__ import annotations

import json

import pytest
import torch

from workbench.demo.train import DEMO_PARAMS, main, train

SMOKE_PARAMS = {**DEMO_PARAMS, "dim": 64, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "head_dim": 32}
SMOKE = dict(batch_size=2, lr=3e-3, seed=0, save_every=2, params=SMOKE_PARAMS, log_every=1, progress=False,
             vocab_sample=20)  # fmt: skip


@pytest.mark.timeout(300)
def test_training_resumes_to_the_same_weights_as_an_uninterrupted_run(tmp_path):
    straight = train(tmp_path / "straight", steps=4, **SMOKE)
    train(tmp_path / "resumed", steps=4, **{**SMOKE, "save_every": 2}, stop_after=2)
    resumed = train(tmp_path / "resumed", steps=4, **SMOKE)
    a = torch.load(tmp_path / "straight" / "state.pt", weights_only=True)
    b = torch.load(tmp_path / "resumed" / "state.pt", weights_only=True)
    assert a["step"] == b["step"] == 4
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=0, atol=0)
    assert straight["loss"] == pytest.approx(resumed["loss"], abs=0)
    log = [json.loads(line) for line in (tmp_path / "straight" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4] and all(r["loss"] > 0 for r in log)
    assert 0.0 <= log[-1]["token_acc"] <= 1.0


@pytest.mark.timeout(300)
def test_the_training_command_runs_and_exports_a_loadable_artifact(tmp_path):
    from workbench.demo.export import expand, full_state_dict

    (tmp_path / "params.json").write_text(json.dumps(SMOKE_PARAMS))
    main(["--out", str(tmp_path / "run"), "--steps", "2", "--batch-size", "2", "--save-every", "1",
          "--params", str(tmp_path / "params.json"), "--vocab-sample", "20",
          "--export", str(tmp_path / "demo.pt"), "--export-sample", "4"])  # fmt: skip
    artifact = torch.load(tmp_path / "demo.pt", weights_only=True)
    assert artifact["check"]["min_gap"] > 0
    state = full_state_dict(artifact)
    assert state["output.weight"].shape == (202048, 64)
    # training continues from the shipped artifact too (a fresh checkout has no training folder)
    train(tmp_path / "warm", steps=1, init_from=tmp_path / "demo.pt", **SMOKE)
    warm = json.loads((tmp_path / "warm" / "config.json").read_text())
    assert warm["vocab"] == artifact["vocab"].tolist()
    folder = expand(tmp_path / "ckpt", tmp_path / "demo.pt")
    import workbench as wb

    engine = wb.load(str(folder), max_seq_len=256, max_batch_size=2)
    try:
        out = engine.completion("Hello", max_tokens=3, temperature=0.0)
        assert len(out.tokens) <= 3
    finally:
        wb.unload()

