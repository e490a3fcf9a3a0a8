"""lm-evaluation-harness over WorkbenchLM: lm-eval's own evaluator (``simple_evaluate``) on inline tasks read
from local JSONL files (offline), every number checked against Meta's reference model (llama-models 0.3.0,
float32 on CPU, ``tests/oracle.py``) on tiny checkpoints of both families.

The expected token sequences are built here independently of the adapter, from lm-eval's documented rules:
the context's trailing whitespace moves to the continuation, the pair is encoded whole and split, an empty
context becomes BOS, every scored sequence starts with exactly one BOS, rolling windows are BOS + at most
``max_seq_len - 1`` document tokens, each predicting the tokens after the previous window's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from oracle import reference_greedy, reference_logits

from workbench import runs as wb_runs
from workbench.demo.tools import get_weather
from workbench.errors import ConfigError, InputError, PromptTooLongError
from workbench.progress import tqdm_bars_off

lm_eval = pytest.importorskip("lm_eval", reason="the lm-eval extra is not installed: pip install -e '.[lm-eval]'")

from lm_eval import evaluator as lm_eval_evaluator  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from workbench.evals.lm_eval import RequestTooLongError, TaskOptionError, WorkbenchLM  # noqa: E402
from workbench.evals.lm_eval.__main__ import with_defaults  # noqa: E402


@pytest.fixture(autouse=True)
def _hide_the_torchvision_standin():
    """The vision tests' torchvision stand-in (tests/torchvision_standin.py) stays in ``sys.modules`` and has no
    ``__spec__``, which transformers' package probing (run by lm-eval) cannot take: hide it while lm-eval runs."""
    standin = getattr(sys.modules.get("torchvision"), "__workbench_standin__", False)
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if standin and k.split(".")[0] == "torchvision"}
    yield
    sys.modules.update(saved)


@pytest.fixture(scope="module", autouse=True)
def _environment_described_once():
    """lm-eval's evaluator describes the machine in every result (``add_env_info``: torch's ``collect_env``,
    which runs ``pip list``, 1.3 s of CPU); the description is the same for every evaluation of this module, so it
    is made once and copied into each result (what these tests check does not read it)."""
    real = lm_eval_evaluator.add_env_info
    described: dict[str, Any] = {}

    def add_env_info(storage: dict[str, Any]) -> None:
        if not described:
            real(described)
        storage.update(described)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lm_eval_evaluator, "add_env_info", add_env_info)
        yield


ATOL = 1e-4
MAX_SEQ_LEN = 32  # small, so rolling documents span several windows

MC_DOCS = [
    {"q": "The capital of France is", "choices": ["Paris", "a large city", "Berlin"], "label": 0},
    {"q": "Two plus two equals", "choices": ["four", "5", "twenty two"], "label": 1},
    {"q": "Llamas live in  ", "choices": ["the Andes", "the sea"], "label": 0},  # trailing spaces move
]
LL_DOCS = [
    {"context": "Once upon a time", "target": " there was a llama."},
    {"context": "", "target": "An empty context scores after BOS."},
    {"context": "Numbers: 1, 2, 3,", "target": " 4"},
]
ROLLING_DOCS = [
    {"text": "The quick brown fox jumps over the lazy dog. " * 8},  # 81 tokens: three windows
    {"text": "Short one."},
]
GEN_DOCS = [{"prompt": "Tell me about llamas.", "answer": "x"}, {"prompt": "Count: 1 2 3", "answer": "y"}]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("lm_eval_data")
    for name, docs in (("mc", MC_DOCS), ("ll", LL_DOCS), ("rolling", ROLLING_DOCS), ("gen", GEN_DOCS)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return folder


def task(data_dir: Path, name: str, **config: Any) -> dict[str, Any]:
    """An inline lm-eval task config over ``data_dir/<name>.jsonl`` (json builder: no network)."""
    return {
        "task": f"wb_{name}_{abs(hash(json.dumps(config, sort_keys=True))) % 10**8}",
        "dataset_path": "json",
        "dataset_kwargs": {
            "data_files": {"test": str(data_dir / f"{name}.jsonl")},
            "cache_dir": str(data_dir / "hf_cache"),
        },
        "test_split": "test",
        **config,
    }


MC_TASK = {
    "output_type": "multiple_choice",
    "doc_to_text": "{{q}}",
    "doc_to_choice": "{{choices}}",
    "doc_to_target": "{{label}}",
    "metric_list": [{"metric": "acc"}],
}
LL_TASK = {
    "output_type": "loglikelihood",
    "doc_to_text": "{{context}}",
    "doc_to_target": "{{target}}",
    "target_delimiter": "",
    "metric_list": [{"metric": "perplexity"}, {"metric": "acc"}],
}
ROLLING_TASK = {
    "output_type": "loglikelihood_rolling",
    "doc_to_text": "",
    "doc_to_target": "{{text}}",
    "metric_list": [{"metric": "word_perplexity"}],
}
GEN_TASK = {
    "output_type": "generate_until",
    "doc_to_text": "{{prompt}}",
    "doc_to_target": "{{answer}}",
    "generation_kwargs": {"until": ["\n\n", "."], "max_gen_toks": 6, "do_sample": False},
    "metric_list": [{"metric": "exact_match"}],
}


def evaluate(lm: WorkbenchLM, tasks: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    return lm_eval.simple_evaluate(
        model=lm,
        tasks=tasks,
        log_samples=True,
        bootstrap_iters=0,
        task_manager=TaskManager(include_defaults=False),
        **kwargs,
    )


def samples(results: dict[str, Any], config: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(results["samples"][config["task"]], key=lambda s: (s["doc_id"], s.get("target")))


@pytest.fixture(scope="module", params=["llama3", "llama4"])
def family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def ckpt(family: str, llama3_dir: Path, llama4_dir: Path) -> Path:
    return llama3_dir if family == "llama3" else llama4_dir


@pytest.fixture(scope="module")
def lm(ckpt: Path) -> WorkbenchLM:
    return WorkbenchLM(checkpoint=str(ckpt), max_seq_len=MAX_SEQ_LEN, max_batch_size=4)


def split_pair(tok: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split, written out: trailing whitespace to the continuation, encode whole, split."""
    if context == "":
        return [tok.bos_id], tok.encode(continuation)
    stripped = context.rstrip()
    continuation = context[len(stripped) :] + continuation
    whole, head = tok.encode(stripped + continuation), tok.encode(stripped)
    return [tok.bos_id, *head], whole[len(head) :]


def reference_score(ckpt: Path, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """Sum of the reference's log P(continuation | context) and whether every token is its argmax."""
    logits = reference_logits(ckpt, [context + continuation[:-1]])[0][len(context) - 1 :]  # [len(cont), V]
    logp = torch.log_softmax(logits, dim=-1)
    target = torch.tensor(continuation)
    return float(logp[torch.arange(len(continuation)), target].sum()), bool((logits.argmax(-1) == target).all())


# --------------------------------------------------------------------------------------------- scoring
def test_loglikelihood_and_multiple_choice_equal_the_reference(lm: WorkbenchLM, ckpt: Path, data_dir: Path) -> None:
    mc, ll = task(data_dir, "mc", **MC_TASK), task(data_dir, "ll", **LL_TASK)
    results = evaluate(lm, [mc, ll])
    tok = lm.engine.tokenizer
    correct = []
    for sample in samples(results, mc):
        scores = []
        for (context, continuation), (resp,) in zip(sample["arguments"], sample["resps"]):
            want = reference_score(ckpt, *split_pair(tok, context, continuation))
            assert resp[0] == pytest.approx(want[0], abs=ATOL) and resp[1] == want[1]
            scores.append(want[0])
        correct.append(max(range(len(scores)), key=scores.__getitem__) == sample["target"])
    assert results["results"][mc["task"]]["acc,none"] == pytest.approx(sum(correct) / len(correct))
    assert MC_DOCS[2]["q"].endswith("  ")  # the case where whitespace moves is really exercised
    for sample in samples(results, ll):
        ((context, continuation),) = sample["arguments"]
        ((resp,),) = sample["resps"]
        want = reference_score(ckpt, *split_pair(tok, context, continuation))
        assert resp[0] == pytest.approx(want[0], abs=ATOL) and resp[1] == want[1]


def test_loglikelihood_rolling_scores_each_document_in_bos_windows(lm: WorkbenchLM, ckpt: Path, data_dir: Path) -> None:
    config = task(data_dir, "rolling", **ROLLING_TASK)
    results = evaluate(lm, [config])
    tok, width = lm.engine.tokenizer, MAX_SEQ_LEN - 1
    got = {s["doc_id"]: s["resps"][0][0] for s in samples(results, config)}
    assert len(tok.encode(ROLLING_DOCS[0]["text"])) > 2 * width  # at least three windows
    for doc_id, doc in enumerate(ROLLING_DOCS):
        tokens = tok.encode(doc["text"])
        total = 0.0
        for start in range(0, len(tokens), width):
            end = min(start + width, len(tokens))
            # after the first window, the context fills the window: one token, more for a short last window
            context = [tok.bos_id] + (tokens[end - width - 1 : start] if start else [])
            total += reference_score(ckpt, context, tokens[start:end])[0]
        assert got[doc_id] == pytest.approx(total, abs=ATOL)


def test_requests_are_scored_in_sorted_engine_batches(lm: WorkbenchLM, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[list[list[int]], list[int]]] = []
    real = lm.engine.score
    monkeypatch.setattr(lm.engine, "score", lambda rows, starts: calls.append((rows, starts)) or real(rows, starts))
    tok = lm.engine.tokenizer
    requests = [(None, [tok.bos_id], tok.encode(" a" * n)) for n in (3, 9, 1, 7, 5, 2)]
    requests.append((("x", " a b"), tok.encode("x"), tok.encode(" a b")))  # a plain context gets BOS in front
    out = lm._loglikelihood_tokens(requests, disable_tqdm=True)
    assert [len(rows) for rows, _ in calls] == [4, 3]  # batches of max_batch_size
    lengths = [len(row) for rows, _ in calls for row in rows]
    assert lengths == sorted(lengths, reverse=True)
    assert all(row[0] == tok.bos_id and tok.bos_id not in row[1:] for rows, _ in calls for row in rows)
    assert [tok.bos_id, *tok.encode("x"), *tok.encode(" a b")] in calls[0][0]
    direct = real([[tok.bos_id, *c] for _, _, c in requests[:6]], 1)
    assert [score for score, _ in out[:6]] == pytest.approx([row.logprob for row in direct], abs=1e-5)


# --------------------------------------------------------------------------------------------- generation
def test_generate_until_equals_reference_greedy(lm: WorkbenchLM, ckpt: Path, data_dir: Path) -> None:
    config = task(data_dir, "gen", **GEN_TASK)
    results = evaluate(lm, [config])
    tok = lm.engine.tokenizer
    for sample in samples(results, config):
        ((context, gen_kwargs),) = sample["arguments"]
        want_ids = reference_greedy(ckpt, tok.encode(context, bos=True), 6, tok.stop_tokens)
        want = tok.decode([t for t in want_ids if not tok.is_special(t)])  # as lm-eval's hf
        for stop in gen_kwargs["until"]:
            want = want.split(stop)[0]
        assert sample["resps"][0][0] == want


def test_gen_kwargs_map_to_engine_sampling(lm: WorkbenchLM) -> None:
    assert lm._sampling({"until": "\n", "max_gen_toks": 5}) == (["\n"], {"max_tokens": 5, "temperature": 0.0})
    assert lm._sampling({"do_sample": False, "temperature": 0.7}) == ([], {"max_tokens": 256, "temperature": 0.0})
    until, sampling = lm._sampling(
        {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 3, "max_new_tokens": 4}
    )
    assert sampling == {"max_tokens": 4, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 3}
    assert lm._sampling({"do_sample": True})[1]["temperature"] == 1.0  # transformers' default
    assert lm._sampling({"temperature": 0.5})[1]["temperature"] == 0.5  # do_sample inferred from temperature


def test_sampled_generation_runs_the_engine_sampler(lm: WorkbenchLM, data_dir: Path) -> None:
    kwargs = {"until": ["\n\n"], "max_gen_toks": 6, "do_sample": True, "temperature": 1.5, "top_k": 50, "seed": 11}
    config = task(data_dir, "gen", **{**GEN_TASK, "generation_kwargs": kwargs})
    got = [s["resps"][0][0] for s in samples(evaluate(lm, [config]), config)]
    tok = lm.engine.tokenizer
    prompts = [tok.encode(doc["prompt"], bos=True) for doc in GEN_DOCS]
    want = lm.engine.batch_completion(prompts, max_tokens=6, temperature=1.5, top_k=50, seed=11, stop=["\n\n"])
    assert got == [tok.decode([t for t in c.tokens if not tok.is_special(t)]).split("\n\n")[0] for c in want]
    greedy = lm.engine.batch_completion(prompts, max_tokens=6)
    assert [c.tokens for c in want] != [c.tokens for c in greedy]  # really sampled


# --------------------------------------------------------------------------------------------- chat template
def test_chat_template_renders_the_official_format(lm: WorkbenchLM) -> None:
    dialogs = [
        [{"role": "user", "content": "Hi"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1"},
            {"role": "user", "content": "!Q2, with punctuation"},
        ],
    ]
    for dialog in dialogs:
        official = lm.engine.formatter.encode_dialog(dialog)
        text = lm.apply_chat_template(dialog)
        assert lm.tok_encode(text) == official and official.count(lm.engine.tokenizer.bos_id) == 1
    prefill = lm.apply_chat_template(dialogs[0] + [{"role": "assistant", "content": "Answer:"}], False)
    assert prefill == lm.apply_chat_template(dialogs[0]) + "Answer:"
    # special-looking text outside a rendered prompt stays plain text
    assert lm.tok_encode("<|begin_of_text|>x") == lm.engine.tokenizer.encode("<|begin_of_text|>x")
    assert lm.tokenizer_name.startswith("workbench-") and lm.chat_template(True) and lm.chat_template(False) is None


def test_tools_given_to_workbenchlm_are_offered_in_every_chat_prompt(lm: WorkbenchLM) -> None:
    dialog = [{"role": "user", "content": "What's the weather in Paris?"}]
    with_tools = WorkbenchLM(lm.engine, tools=[get_weather])
    official = lm.engine.formatter.encode_dialog(dialog, tools=[get_weather])
    text = with_tools.apply_chat_template(dialog)
    assert "get_weather" in text and "get_weather" not in lm.apply_chat_template(dialog)
    assert with_tools.tok_encode(text) == official


def test_apply_chat_template_scores_and_generates_like_the_reference(
    lm: WorkbenchLM, ckpt: Path, data_dir: Path
) -> None:
    mc, gen = task(data_dir, "mc", **MC_TASK), task(data_dir, "gen", **GEN_TASK)
    results = evaluate(lm, [mc, gen], apply_chat_template=True)
    tok, formatter = lm.engine.tokenizer, lm.engine.formatter
    for sample in samples(results, mc):
        prompt = formatter.encode_dialog([{"role": "user", "content": MC_DOCS[sample["doc_id"]]["q"]}])
        assert tok.decode(prompt[-1:]) == "\n\n"  # lm-eval moves it to the continuation
        for (context, continuation), (resp,) in zip(sample["arguments"], sample["resps"]):
            assert context == tok.decode(prompt) and not continuation.startswith(" ")
            want = reference_score(ckpt, prompt[:-1], tok.encode("\n\n" + continuation))
            assert resp[0] == pytest.approx(want[0], abs=ATOL)
    for sample in samples(results, gen):
        prompt = formatter.encode_dialog([{"role": "user", "content": GEN_DOCS[sample["doc_id"]]["prompt"]}])
        want = tok.decode([t for t in reference_greedy(ckpt, prompt, 6, tok.stop_tokens) if not tok.is_special(t)])
        for stop in GEN_TASK["generation_kwargs"]["until"]:
            want = want.split(stop)[0]
        assert sample["resps"][0][0] == want


def test_lm_evals_bars_go_quiet_inside_tqdm_bars_off(
    lm: WorkbenchLM, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """lm-eval draws tqdm bars that none of its options turns off (building each task's requests, tokenizing,
    running them): a notebook stores them as stderr.  Inside ``tqdm_bars_off`` there are none; the results
    are the same."""
    mc = task(data_dir, "mc", **MC_TASK)
    loud = evaluate(lm, [mc])
    assert "%|" in capsys.readouterr().err  # lm-eval's own bars, by default
    with tqdm_bars_off():
        quiet = evaluate(lm, [mc])
    assert "%|" not in capsys.readouterr().err
    assert quiet["results"][mc["task"]] == loud["results"][mc["task"]]


# --------------------------------------------------------------------------------------------- bad input
def test_unknown_generation_option_is_a_task_option_error(lm: WorkbenchLM, data_dir: Path) -> None:
    config = task(data_dir, "gen", **{**GEN_TASK, "generation_kwargs": {"until": ["."], "num_beams": 4}})
    with pytest.raises(TaskOptionError, match="num_beams.*not supported"):
        evaluate(lm, [config])


def test_requests_longer_than_max_seq_len_raise(lm: WorkbenchLM, data_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "long.jsonl").write_text(
        json.dumps({"q": "word " * 40, "choices": ["a", "b"], "label": 0, "prompt": "word " * 40, "answer": "a"}) + "\n"
    )
    with pytest.raises(RequestTooLongError, match="max_seq_len is 32.*larger max_seq_len"):
        evaluate(lm, [task(tmp_path, "long", **MC_TASK)])
    with pytest.raises(PromptTooLongError, match="no room to generate"):
        evaluate(lm, [task(tmp_path, "long", **GEN_TASK)])


def test_a_second_evaluation_is_answered_from_the_run_store(
    lm: WorkbenchLM, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "runs.sqlite"))
    tasks = [task(data_dir, "mc", **MC_TASK), task(data_dir, "gen", **GEN_TASK)]
    first_lm = WorkbenchLM(lm.engine, run="lm-eval")
    first = evaluate(first_lm, tasks)
    assert first_lm.rows_computed == 8 + 2 and first_lm.rows_from_store == 0  # 8 choices scored, 2 generations
    second_lm = WorkbenchLM(lm.engine, run="lm-eval")
    second = evaluate(second_lm, tasks)
    assert second_lm.rows_computed == 0 and second_lm.rows_from_store == first_lm.rows_computed
    assert second["results"] == first["results"]
    for config in tasks:
        assert [s["resps"] for s in samples(second, config)] == [s["resps"] for s in samples(first, config)]
    kinds = {row.kind for row in wb_runs.store().rows("lm-eval")}
    assert kinds == {"score", "completion"}
    assert WorkbenchLM(lm.engine, run="x", refresh="True").stored == {"run": "x", "refresh": True}  # --model_args


def test_bad_model_arguments_are_clear(lm: WorkbenchLM, ckpt: Path) -> None:
    with pytest.raises(ConfigError, match="bogus"):
        WorkbenchLM(checkpoint=str(ckpt), bogus=1)
    with pytest.raises(InputError, match="either a loaded engine or the settings"):
        WorkbenchLM(lm.engine, max_seq_len=64)
    with pytest.raises(InputError, match="batch_size"):
        WorkbenchLM(lm.engine, batch_size=0)
    assert WorkbenchLM(lm.engine, batch_size="auto:4").batch_size is None
    assert WorkbenchLM(lm.engine, batch_size="8").batch_size == 8


# --------------------------------------------------------------------------------------------- registry, CLI
def test_registered_with_lm_eval_next_to_its_own_models() -> None:
    from lm_eval.api.registry import get_model

    assert get_model("workbench") is WorkbenchLM
    assert get_model("dummy").__name__ == "DummyLM"  # lm-eval's own models stay registered


def test_command_line_defaults() -> None:
    assert with_defaults(["--tasks", "x"]) == [
        "run",
        "--model",
        "workbench",
        "--tasks",
        "x",
        "--batch_size",
        "auto",
        "--device",
        "auto",
    ]
    given = ["run", "-M", "hf", "-b", "2", "--device=cpu"]
    assert with_defaults(given) == given
    assert with_defaults(["ls", "tasks"]) == ["ls", "tasks"]


@pytest.mark.slow
def test_command_line_runs_a_task_file(llama3_dir: Path, data_dir: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    import yaml

    config = task(data_dir, "mc", **MC_TASK)
    (tmp_path / "wb_mc.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    store = tmp_path / "runs.sqlite"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "WORKBENCH_STORE": str(store)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "workbench.evals.lm_eval",
            "--model_args",
            f"checkpoint={llama3_dir},max_seq_len={MAX_SEQ_LEN},max_batch_size=4,run=cli-mc",
            "--tasks",
            config["task"],
            "--include_path",
            str(tmp_path),
            "--output_path",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert config["task"] in proc.stdout and "acc" in proc.stdout
    assert any(out.rglob("results_*.json"))
    assert {row.kind for row in wb_runs.store(store).rows("cli-mc")} == {"score"}  # --model_args ...,run=name
