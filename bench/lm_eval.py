"""lm-evaluation-harness through ``WorkbenchLM`` vs lm-eval's own ``hf`` model, on the same weights.

Both contenders run lm-eval's evaluator (``simple_evaluate``) on the same two inline tasks read from local
JSONL files (offline), in one process, side by side, float32 on CPU, the same threads:

- ``loglikelihood``: a multiple-choice task, ``--docs`` questions x 4 answers (>= 200 loglikelihood
  requests; the questions share a few-shot-style preamble, as real multiple-choice prompts do);
- ``generate_until``: ``--gen-docs`` prompts, greedy, ``until=["\\n\\n"]``, ``max_gen_toks`` 32, twice: short
  zero-shot prompts (~15 tokens), and the same questions after a 3-shot preamble (~150 tokens, the shape of
  few-shot generation tasks such as gsm8k's).

Contenders: ``workbench`` (``WorkbenchLM`` over ``wb.load(..., max_batch_size=B)``: memory-light scoring of
continuation positions only, shared contexts computed once, continuous batching) and ``lm-eval-hf``
(lm-eval's ``HFLM`` over the same checkpoint converted to ``LlamaForCausalLM`` by ``contenders.hf_llama``,
with the checkpoint's tiktoken file converted to a transformers fast tokenizer; ``batch_size=B``,
``add_bos_token=True`` so that both score BOS + context + continuation, and Llama 3's stop tokens as its
eos ids so that both stop generating at the same tokens).  The model is ``common.PEER_MODELS["llama3-d256"]``
(the real 128k vocabulary on a small transformer).  Equal numbers are checked, not assumed: the largest
log-likelihood difference, whether accuracy agrees, and how many generations are identical.

Times: CPU seconds of the benchmark process (``common.clock``; ``BENCH_CLOCK=wall`` for wall time), CPU
seconds of the whole process (``time.process_time``: transformers' fast tokenizer encodes batches on threads
of its own, which the thread clock misses) and wall seconds, each with its ratio.  Prints a table and one
JSON line.

    OMP_NUM_THREADS=1 python bench/lm_eval.py [--docs 64] [--gen-docs 64] [--batch 16] [--repeats 1]
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named after the package it measures; its own folder must not shadow ``lm_eval``.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import lm_eval  # noqa: E402
import torch  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

import workbench as wb  # noqa: E402
from workbench.evals.lm_eval import WorkbenchLM  # noqa: E402

sys.path.append(_HERE)
import contenders  # noqa: E402
from common import clock, median, peer_model_dir  # noqa: E402

MODEL = "llama3-d256"
MAX_SEQ_LEN = 512
SUBJECTS = ["llamas", "volcanoes", "prime numbers", "jazz", "the moon", "photosynthesis", "rivers", "chess"]


# --------------------------------------------------------------------------------------------- tasks
def write_tasks(folder: Path, docs: int, gen_docs: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    preamble = "The following are questions about general knowledge, each with four answers. Pick the best answer.\n\n"
    mc = [
        {
            "q": f"{preamble}Question {i}: which statement about {SUBJECTS[i % 8]} is true"
            f"{' in the long run' * (i % 5)}?\nAnswer:",
            "choices": [f"{SUBJECTS[(i + k) % 8]} are {'very ' * k}common" for k in range(4)],
            "label": i % 4,
        }
        for i in range(docs)
    ]
    gen = [
        {"prompt": f"Write one sentence about {SUBJECTS[i % 8]}{', please' * (i % 7)}.", "answer": "-"}
        for i in range(gen_docs)
    ]
    shots = "".join(
        f"Question: Write one sentence about {s}.\nAnswer: {s.capitalize()} are a topic people often "
        f"write about, and this sentence is about {s}, as asked.\n\n"
        for s in SUBJECTS[:3]
    )
    gen3 = [{"prompt": f"{shots}Question: {row['prompt']}\nAnswer:", "answer": "-"} for row in gen]
    for name, rows in (("mc", mc), ("gen", gen), ("gen3shot", gen3)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def task(name: str, **config: Any) -> dict[str, Any]:
        return {
            "task": f"bench_{name}",
            "dataset_path": "json",
            "test_split": "test",
            "dataset_kwargs": {
                "data_files": {"test": str(folder / f"{name}.jsonl")},
                "cache_dir": str(folder / "hf_cache"),
            },
            **config,
        }

    generation = dict(
        output_type="generate_until",
        doc_to_text="{{prompt}}",
        doc_to_target="{{answer}}",
        generation_kwargs={"until": ["\n\n"], "max_gen_toks": 32, "do_sample": False},
        metric_list=[{"metric": "exact_match"}],
    )
    return (
        task(
            "mc",
            output_type="multiple_choice",
            doc_to_text="{{q}}",
            doc_to_choice="{{choices}}",
            doc_to_target="{{label}}",
            metric_list=[{"metric": "acc"}],
        ),
        task("gen", **generation),
        task("gen3shot", **generation),
    )


# --------------------------------------------------------------------------------------------- contenders
def hf_tokenizer(ckpt: Path, engine: wb.Engine) -> Any:
    """The checkpoint's tiktoken file as a transformers fast tokenizer that adds BOS like Meta's."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from workbench.formats.tokenizer import LLAMA3_PATTERN

    specials = sorted(engine.tokenizer.special_tokens, key=engine.tokenizer.special_tokens.get)
    backend = TikTokenConverter(
        vocab_file=str(ckpt / "tokenizer.model"), pattern=LLAMA3_PATTERN, extra_special_tokens=specials
    ).converted()
    bos = engine.tokenizer.bos_id
    backend.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|> $A $B",
                special_tokens=[("<|begin_of_text|>", bos)],
            ),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
    )


def check_tokenizers(hf_tok: Any, engine: wb.Engine, texts: list[str]) -> None:
    for text in texts:
        ours = engine.tokenizer.encode(text)
        theirs = hf_tok.encode(text, add_special_tokens=False)
        if ours != theirs:
            raise SystemExit(f"the converted tokenizer disagrees with workbench's on {text[:60]!r}")


def evaluate(lm: Any, task: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    start = {"cpu": clock(), "process": time.process_time(), "wall": time.perf_counter()}
    out = lm_eval.simple_evaluate(
        model=lm, tasks=[task], log_samples=True, bootstrap_iters=0, task_manager=TaskManager(include_defaults=False)
    )
    end = {"cpu": clock(), "process": time.process_time(), "wall": time.perf_counter()}
    return out, {k: end[k] - start[k] for k in start}


def responses(result: dict[str, Any], task: dict[str, Any]) -> list[Any]:
    rows = sorted(result["samples"][task["task"]], key=lambda s: s["doc_id"])
    return [[r[0] for r in s["resps"]] for s in rows]


# --------------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=64, help="multiple-choice questions (4 requests each)")
    parser.add_argument("--gen-docs", type=int, default=64, help="generate_until prompts")
    parser.add_argument("--batch", type=int, default=16, help="engine max_batch_size and hf batch_size")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    torch.manual_seed(0)
    ckpt = peer_model_dir(MODEL)
    folder = Path(tempfile.mkdtemp(prefix="bench-lm-eval-"))
    mc_task, gen_task, gen3_task = write_tasks(folder, args.docs, args.gen_docs)

    engine = wb.load(ckpt, max_seq_len=MAX_SEQ_LEN, max_batch_size=args.batch, dtype="float32", device="cpu")
    ours = WorkbenchLM(engine)
    hf_model = contenders.hf_llama(ckpt, MAX_SEQ_LEN)
    hf_model.generation_config.eos_token_id = list(engine.tokenizer.stop_tokens)
    hf_model.generation_config.pad_token_id = engine.tokenizer.pad_id
    hf_tok = hf_tokenizer(ckpt, engine)
    check_tokenizers(
        hf_tok,
        engine,
        [json.loads(line)["q"] for line in (folder / "mc.jsonl").open()][:8]
        + [json.loads(line)["prompt"] for line in (folder / "gen.jsonl").open()][:8],
    )
    theirs = HFLM(
        pretrained=hf_model,
        tokenizer=hf_tok,
        batch_size=args.batch,
        max_length=MAX_SEQ_LEN,
        add_bos_token=True,
        device="cpu",
    )

    times: dict[str, dict[str, list[float]]] = {}
    results: dict[str, dict[str, Any]] = {}
    for _ in range(args.repeats):
        for task in (mc_task, gen_task, gen3_task):
            for name, lm in (("workbench", ours), ("lm-eval-hf", theirs)):
                engine._runner.scheduler.forget_prefixes()  # every run starts cold
                out, spent = evaluate(lm, task)
                slot = times.setdefault(f"{task['task']}/{name}", {"cpu": [], "process": [], "wall": []})
                for clock_name, seconds in spent.items():
                    slot[clock_name].append(seconds)
                results.setdefault(task["task"], {})[name] = out

    mc_ours, mc_hf = (responses(results[mc_task["task"]][n], mc_task) for n in ("workbench", "lm-eval-hf"))
    ll_diff = max(abs(a[0] - b[0]) for ra, rb in zip(mc_ours, mc_hf) for a, b in zip(ra, rb))
    acc = {n: results[mc_task["task"]][n]["results"][mc_task["task"]]["acc,none"] for n in ("workbench", "lm-eval-hf")}
    same_gen, total_gen = 0, 0
    for task in (gen_task, gen3_task):
        gen_ours, gen_hf = (responses(results[task["task"]][n], task) for n in ("workbench", "lm-eval-hf"))
        same_gen += sum(a == b for a, b in zip(gen_ours, gen_hf))
        total_gen += len(gen_ours)

    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, float32, CPU; model {MODEL} "
        f"(dim 256, 4 layers, 128k vocab), batch {args.batch}, repeats {args.repeats} (medians)"
    )
    print(f"  {'task':>16} {'contender':>11} {'requests':>8} {'cpu s':>7} {'proc s':>7} {'wall s':>7}")
    ratios: dict[str, dict[str, float]] = {}
    for task, requests in ((mc_task, 4 * args.docs), (gen_task, args.gen_docs), (gen3_task, args.gen_docs)):
        for name in ("workbench", "lm-eval-hf"):
            t = {k: median(v) for k, v in times[f"{task['task']}/{name}"].items()}
            print(f"  {task['task']:>16} {name:>11} {requests:8d} {t['cpu']:7.2f} {t['process']:7.2f} {t['wall']:7.2f}")
        ours_t, hf_t = times[f"{task['task']}/workbench"], times[f"{task['task']}/lm-eval-hf"]
        ratios[task["task"]] = {k: median(hf_t[k]) / median(ours_t[k]) for k in ours_t}
        r = ratios[task["task"]]
        print(
            f"  {'':>16} workbench is {r['cpu']:.2f}x (cpu) / {r['process']:.2f}x (process) / {r['wall']:.2f}x "
            "(wall) faster"
        )
    print(
        f"  equal numbers: max |loglikelihood difference| {ll_diff:.2e}, acc {acc['workbench']:.4f} vs "
        f"{acc['lm-eval-hf']:.4f}, identical generations {same_gen}/{total_gen}"
    )
    print(
        json.dumps(
            {
                "bench": "lm_eval",
                "model": MODEL,
                "threads": torch.get_num_threads(),
                "batch": args.batch,
                "repeats": args.repeats,
                "clock": os.environ.get("BENCH_CLOCK", "cpu"),
                "loglikelihood_requests": 4 * args.docs,
                "generate_until_requests": args.gen_docs,
                "seconds": {k: {c: median(s) for c, s in v.items()} for k, v in times.items()},
                "speedup": ratios,
                "max_loglikelihood_diff": ll_diff,
                "acc": acc,
                "identical_generations": same_gen,
            }
        )
    )


if __name__ == "__main__":
    main()
