"""The shipped demo model, end to end through the public API: it expands deterministically, loads
through the normal loader as ``wb.load()``'s default, and really calls tools on held-out questions.

The targets (docs/demo-model.md): on held-out question templates and argument values, greedy, Llama 4
python-list format: >= 95% exact-match tool calls, >= 90% final answers that restate the tool result,
>= 90% direct answers when no offered tool fits.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

import workbench as wb
from workbench import evals
from workbench.demo.export import ARTIFACT, expand
from workbench.demo.tools import DEMO_TOOLS, get_weather
from workbench.factory import default_checkpoint_dir

HELDOUT_CASES = 150
HELDOUT_SEED = 2024


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_artifact_is_compact_and_expands_deterministically(tmp_path):
    assert ARTIFACT.stat().st_size <= 20 * 2**20
    a, b = expand(tmp_path / "a"), expand(tmp_path / "b")
    for name in ("consolidated.00.pth", "params.json", "tokenizer.model"):
        assert _digest(a / name) == _digest(b / name), name
    params = json.loads((a / "params.json").read_text())
    assert params["vocab_size"] == 202048 and params["moe_args"]["num_experts"] >= 2
    assert params["nope_layer_interval"] and params["attention_chunk_size"]
    shard = torch.load(a / "consolidated.00.pth", weights_only=True, mmap=True)
    assert "layers.0.attention.wqkv.weight" in shard  # published (fused) Llama 4 key layout


@pytest.fixture(scope="module")
def demo_engine():
    wb.unload()
    engine = wb.load(max_batch_size=32)
    yield engine
    wb.unload()


def test_default_load_is_the_demo_model(demo_engine):
    assert demo_engine.settings.checkpoint_dir == default_checkpoint_dir().resolve()
    params = json.loads((default_checkpoint_dir() / "params.json").read_text())
    artifact = torch.load(ARTIFACT, weights_only=True)
    assert params == {**artifact["params"], "vocab_size": 202048}
    assert demo_engine.formatter.default_tool_prompt_format == "python_list"


def test_the_demo_model_calls_a_tool_and_restates_the_result(demo_engine):
    transcript = wb.tools.run(demo_engine, "What's the weather in Reykjavik?", tools=[get_weather],
                              temperature=0.0, max_tokens=64)  # fmt: skip
    calls = [c for m in transcript for c in m.tool_calls]
    assert [(c.tool_name, c.arguments) for c in calls] == [("get_weather", {"city": "Reykjavik"})]
    assert transcript[-1].role == "assistant" and get_weather("Reykjavik") in transcript[-1].content


@pytest.mark.timeout(900)
def test_heldout_accuracy_meets_the_targets(demo_engine):
    cases = evals.synthetic_cases(HELDOUT_CASES, split="heldout", seed=HELDOUT_SEED)
    results = evals.run_cases(demo_engine, cases, tools=DEMO_TOOLS, temperature=0.0)
    summary = evals.summarize(results).iloc[0]
    report = summary.to_dict()
    assert summary["tool_call_exact"] >= 0.95, report
    assert summary["answer_restates_result"] >= 0.90, report
    assert summary["direct_answer"] >= 0.90, report
