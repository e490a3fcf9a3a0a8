"""Train the demo model: ``python -m workbench.training.train [--steps N] [--out DIR]``.

A small Llama 4 (MoE and NoPE layers, chunked attention) learns the official python-list tool-call
format from synthetic dialogs (:mod:`workbench.demo.data`), on CPU or a GPU (``--device cuda
--workers 14``), deterministic from ``--seed``.
Design choices, and why:

* Compact vocabulary: the model is trained over the few tens of thousands of token ids it can meet
  (common ids, every id of the dialog material), with tied input/output embeddings so that copying a
  value from the question generalises to tokens seen rarely; ``export`` expands it to the full
  202048-token vocabulary.
* Loss on assistant tokens only, computed only at those positions (the output matrix is the
  expensive part); the system-prompt prefix shared by a batch is computed once.
* A curriculum: few tools and short prompts first, the full mix afterwards.
* AdamW with warm-up and cosine decay; state saved every ``--save-every`` steps and resumed
  automatically, so an interrupted run continues where it stopped with identical results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from workbench.checkpoints.factory import TINY_LLAMA4
from workbench.demo.data import COPY_MIX, DialogGenerator, encode, spelling_mix
from workbench.demo.generated import GeneratedDialogs, generated_token_ids
from workbench.formats import make_formatter
from workbench.formats.tokenizer import Tokenizer, bundled_tokenizer_path
from workbench.training.export import export_compact
from workbench.training.forward import build_model, common_prefix_length, hidden_states
from workbench.training.spelled import SpelledEmbeddings, spelling_table
from workbench.training.vocab import build_compact_vocab, extend_vocab, spelling_words

# The shipped demo model's shape: the tiny Llama 4 code paths (MoE, NoPE, QK-norm, temperature tuning),
# widened to dim 192 and 6 layers (the largest whose compact artifact stays under 20 MB), with chunked
# attention over 1024 tokens, longer than any training dialog, so dialogs are not cut into 32-token chunks.
DEMO_PARAMS: dict[str, Any] = {**TINY_LLAMA4, "attention_chunk_size": 1024, "dim": 192, "n_layers": 6, "n_heads": 6}


class Batcher:
    """Deterministic batches: batch ``step`` depends only on (seed, step), so resuming is exact.

    Dialogs are drawn in groups of ``GROUP`` batches and sorted by length before being cut into
    batches, so a batch pads little.
    """

    GROUP = 4

    def __init__(
        self,
        formatter: Any,
        to_compact: dict[int, int],
        unk: int,
        batch_size: int,
        seed: int,
        curriculum_steps: int,
        synthetic: float = 0.35,
        aux_positions: int = 0,
        copy_exercise: bool = False,
        shared_tools: bool = False,
        composed: float = 0.0,
        spell: float = 0.0,
        spelling: list[str] | None = None,
        generated: float = 0.0,
    ) -> None:
        self.composed, self.spell, self.spelling = composed, spell, spelling or []
        self.generated = generated  # share of dialogs (or shared-tool batches) over generated tools
        self.formatter, self.to_compact, self.unk = formatter, to_compact, unk
        self.batch_size, self.seed, self.curriculum_steps = batch_size, seed, curriculum_steps
        self.synthetic, self.aux_positions, self.copy_exercise = synthetic, aux_positions, copy_exercise
        self.shared_tools = shared_tools
        self._group: tuple[int, list[tuple[list[int], list[bool]]]] | None = None

    def _dialogs(self, group: int) -> list[tuple[list[int], list[bool]]]:
        if self._group is None or self._group[0] != group:
            max_tools = 2 if group * self.GROUP < self.curriculum_steps else 4
            mix = COPY_MIX if self.copy_exercise else None
            if self.spell:
                mix = spelling_mix(self.spell, self.copy_exercise)
            gen = DialogGenerator(
                "train",
                seed=self.seed * 1_000_003 + group,
                max_tools=max_tools,
                synthetic=self.synthetic,
                mix=mix,
                composed=self.composed,
                spelling_words=self.spelling,
            )
            tools_gen = GeneratedDialogs("train", seed=self.seed * 1_000_003 + group, max_tools=max_tools)
            coin = random.Random(self.seed * 104_729 + group)

            def source() -> DialogGenerator | GeneratedDialogs:  # generated tools for ``generated`` of the draws
                return tools_gen if self.generated and coin.random() < self.generated else gen

            if self.shared_tools:  # one tool set per batch: the whole system prompt is computed once
                encoded = []
                for _ in range(self.GROUP):
                    src = source()
                    offered = src.offer()
                    encoded += [encode(self.formatter, src.dialog(offered=offered)) for _ in range(self.batch_size)]
                rows = [([self.to_compact.get(t, self.unk) for t in e.tokens], e.targets) for e in encoded]
                self._group = (group, rows)
                return rows
            encoded = [encode(self.formatter, source().dialog()) for _ in range(self.batch_size * self.GROUP)]
            rows = [([self.to_compact.get(t, self.unk) for t in e.tokens], e.targets) for e in encoded]
            rows.sort(key=lambda r: len(r[0]))
            self._group = (group, rows)
        return self._group[1]

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor]:
        """tokens [B, T], assistant targets [B, T] (-100 elsewhere), shared prefix length, auxiliary
        targets [B, T] (up to ``aux_positions`` other, non-prefix tokens per row, for a small
        language-modelling loss that teaches the model to read the prompt) and which assistant targets are
        *copied* [B, T]: the token occurs earlier in the dialog's own messages (an argument value or a
        result to restate: the rare, hard tokens that exact match hinges on)."""
        group, index = divmod(step, self.GROUP)
        order = list(range(self.GROUP))
        # a fixed permutation per group, so short and long batches alternate
        order = order[group % self.GROUP :] + order[: group % self.GROUP]
        chosen = self._dialogs(group)[order[index] * self.batch_size : (order[index] + 1) * self.batch_size]
        rows = [r for r, _ in chosen]
        prefix = common_prefix_length(rows)
        width = max(len(r) for r in rows)
        tokens = torch.zeros(len(rows), width, dtype=torch.long)
        targets = torch.full((len(rows), width), -100, dtype=torch.long)  # target of position t is token t+1
        aux = torch.full((len(rows), width), -100, dtype=torch.long)
        copied = torch.zeros(len(rows), width, dtype=torch.bool)
        pick = random.Random(self.seed * 7919 + step)
        for i, (row, mask) in enumerate(chosen):
            tokens[i, : len(row)] = torch.tensor(row)
            others, seen = [], set()
            for t in range(1, len(row)):
                if row[t] == self.unk:  # a token outside the compact vocabulary is no target
                    continue
                if mask[t]:
                    targets[i, t - 1] = row[t]
                    copied[i, t - 1] = row[t] in seen
                elif t > prefix:
                    others.append(t)
                    seen.add(row[t])
            for t in pick.sample(others, min(self.aux_positions, len(others))):
                aux[i, t - 1] = row[t]
        return tokens, targets, min(prefix, width - 1), aux, copied


def _initial_weights(source: Path) -> tuple[list[int], dict[str, Any], dict[str, torch.Tensor]]:
    """(vocabulary, params, compact state dict) of a training folder or of a shipped compact artifact,
    so training can continue from either (the artifact is what a fresh checkout has)."""
    if source.is_dir():
        config = json.loads((source / "config.json").read_text())
        return config["vocab"], config["params"], torch.load(source / "state.pt", weights_only=True)["model"]
    artifact = torch.load(source, weights_only=True)
    embeddings = artifact["embeddings"].float()
    state = {k: v.float() for k, v in artifact["body"].items()}
    state.update({"tok_embeddings.weight": embeddings, "output.weight": embeddings})
    return artifact["vocab"].tolist(), artifact["params"], state


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    out_dir: Path,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    save_every: int,
    params: dict[str, Any] | None = None,
    log_every: int = 10,
    progress: bool = True,
    vocab_sample: int | None = None,
    stop_after: int | None = None,
    synthetic: float = 0.35,
    aux_weight: float = 0.0,
    aux_positions: int = 32,
    copy_exercise: bool = False,
    shared_tools: bool = False,
    init_from: Path | None = None,
    warmup: int = 200,
    copy_weight: float = 1.0,
    composed: float = 0.0,
    spell: float = 0.0,
    spelled: bool = False,
    device: str = "cpu",
    workers: int = 0,
    max_minutes: float | None = None,
    generated_tools: float = 0.0,
) -> dict[str, Any]:
    """Train (or resume) into ``out_dir``; returns the last logged metrics.

    ``stop_after`` ends the run early after that step (saving first), as an interruption would;
    ``max_minutes`` does the same once that much wall time has passed (a leased GPU's time limit).
    ``device`` runs the model there (the data stays a function of (seed, step), but GPU arithmetic is
    not bit-identical to the CPU's); ``workers`` processes prepare batches ahead, which a GPU needs to
    stay busy.  ``generated_tools`` is the share of dialogs over generated tools (workbench.demo.generated);
    their tokens join the compact vocabulary (a warm start's rows for them begin as the mean trained row).
    """
    from tqdm.auto import tqdm

    params = params or DEMO_PARAMS
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(bundled_tokenizer_path("llama4"))
    formatter = make_formatter(tokenizer, None)
    init = _initial_weights(Path(init_from)) if init_from is not None else None
    extra = generated_token_ids(formatter, vocab_sample or 1000) if generated_tools else set()
    if init is not None:  # a warm start keeps the vocabulary it was trained with (plus generated tools' tokens)
        vocab, state0 = extend_vocab(init[0], extra, init[2])
        init = (vocab, init[1], state0)
    elif (out_dir / "config.json").exists():  # a resumed run keeps its own
        vocab = json.loads((out_dir / "config.json").read_text())["vocab"]
    else:
        vocab = build_compact_vocab(tokenizer) if vocab_sample is None else build_compact_vocab(tokenizer, vocab_sample)
        vocab = sorted(set(vocab) | extra)
    to_compact = {t: i for i, t in enumerate(vocab)}
    torch.manual_seed(seed)
    model = build_model(params, len(vocab), seed).to(device)
    decay = [p for n, p in model.named_parameters() if not n.endswith("norm.weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    speller = None
    if spelled:  # word rows built from their spelling while training (workbench.training.spelled)
        speller = SpelledEmbeddings(model.tok_embeddings.weight, *spelling_table(tokenizer, vocab), seed=seed)
        speller.to(device)
        no_decay.append(speller.space)

    def table() -> torch.Tensor:  # [V, D]: the embedding (and tied output) rows the model uses
        return model.tok_embeddings.weight if speller is None else speller()

    def snapshot(step: int) -> dict[str, Any]:
        weights = model.state_dict()
        extra: dict[str, Any] = {}
        if speller is not None:  # the materialised rows for export; the free rows and space to resume
            with torch.no_grad():
                rows = table().detach().clone()
            free = weights["tok_embeddings.weight"].clone()
            extra = {"free_embeddings": free, "space": speller.space.detach().clone()}
            weights = {**weights, "tok_embeddings.weight": rows, "output.weight": rows}
        return _on_cpu({"model": weights, "optimizer": optimizer.state_dict(), "step": step, **extra})

    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95)
    )
    state_path = out_dir / "state.pt"
    start = 0
    if init is not None and not state_path.exists():  # warm start: weights only, new optimizer and schedule
        if init[1] != params:
            raise ValueError(f"{init_from} has another model shape than --params")
        model.load_state_dict(init[2])
        model.output.weight = model.tok_embeddings.weight
        if speller is not None:  # the loaded rows become spelling + free rest
            speller.adopt(model.tok_embeddings.weight)
    if state_path.exists():
        state = torch.load(state_path, weights_only=True, map_location="cpu")
        model.load_state_dict(state["model"])
        model.output.weight = model.tok_embeddings.weight
        if speller is not None:
            with torch.no_grad():
                model.tok_embeddings.weight.copy_(state["free_embeddings"])
                speller.space.copy_(state["space"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
    (out_dir / "config.json").write_text(
        json.dumps(
            {
                "params": params,
                "vocab": vocab,
                "seed": seed,
                "batch_size": batch_size,
                "lr": lr,
                "steps": steps,
                "synthetic": synthetic,
                "aux_weight": aux_weight,
                "copy_exercise": copy_exercise,
                "shared_tools": shared_tools,
                "copy_weight": copy_weight,
                "composed": composed,
                "spell": spell,
                "spelled": spelled,
                "generated_tools": generated_tools,
                "init_from": str(init_from) if init_from else None,
            }
        )
    )
    batcher = Batcher(
        formatter,
        to_compact,
        to_compact[tokenizer.encode_special("<|finetune_right_pad|>")],
        batch_size,
        seed,
        curriculum_steps=steps // 5,
        synthetic=synthetic,
        aux_positions=aux_positions if aux_weight > 0 else 0,
        copy_exercise=copy_exercise,
        shared_tools=shared_tools,
        composed=composed,
        spell=spell,
        spelling=spelling_words(tokenizer, vocab) if spell else None,
        generated=generated_tools,
    )
    log_path = out_dir / "log.jsonl"
    metrics: dict[str, Any] = {}
    bar = tqdm(range(start, steps), initial=start, total=steps, desc="training demo model", disable=not progress)
    window_loss, window_acc, window_copy, window_n, t0 = 0.0, 0.0, 0.0, 0, time.time()
    started = time.time()
    # closing() stops batch workers on any exit, Ctrl-C in a notebook included (a traceback keeps the generator alive)
    with contextlib.closing(_batches(batcher, start, steps, workers)) as batches:
        for step in bar:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, steps, lr, warmup=min(warmup, steps // 10 + 1))
            tokens, targets, prefix, aux, copied = (
                t.to(device) if isinstance(t, torch.Tensor) else t for t in next(batches)
            )
            rows = table()  # [V, D]
            h = hidden_states(model, tokens, prefix, rows)  # [B, T, D]
            where = targets != -100
            logits = h[where] @ rows.T  # [N, V]
            # copied tokens (argument values, restated results) weigh ``copy_weight``, the format 1
            token_weights = 1.0 + (copy_weight - 1.0) * copied[where].float()  # [N]
            per_token = F.cross_entropy(logits, targets[where], reduction="none")  # [N]
            loss = (per_token * token_weights).sum() / token_weights.sum()
            if aux_weight > 0 and bool((aux != -100).any()):
                aux_where = aux != -100
                aux_logits = h[aux_where] @ rows.T  # [M, V]
                loss = loss + aux_weight * F.cross_entropy(aux_logits, aux[aux_where])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            window_loss += F.cross_entropy(logits.detach(), targets[where]).item()
            right = logits.argmax(-1) == targets[where]  # [N]
            window_acc += right.float().mean().item()
            window_copy += right[copied[where]].float().mean().nan_to_num(1.0).item()
            window_n += 1
            if (step + 1) % log_every == 0 or step + 1 == steps:
                metrics = {
                    "step": step + 1,
                    "loss": window_loss / window_n,
                    "token_acc": window_acc / window_n,
                    "copy_acc": window_copy / window_n,
                    "lr": optimizer.param_groups[0]["lr"],
                    "s_per_step": (time.time() - t0) / window_n,
                }
                with log_path.open("a") as f:
                    f.write(json.dumps(metrics) + "\n")
                bar.set_postfix(
                    loss=f"{metrics['loss']:.3f}", acc=f"{metrics['token_acc']:.3f}", copy=f"{metrics['copy_acc']:.3f}"
                )
                window_loss, window_acc, window_copy, window_n, t0 = 0.0, 0.0, 0.0, 0, time.time()
            if (step + 1) % save_every == 0 or step + 1 == steps:
                tmp = state_path.with_suffix(".tmp")
                torch.save(snapshot(step + 1), tmp)
                tmp.replace(state_path)
            out_of_time = max_minutes is not None and time.time() - started > 60 * max_minutes
            if (stop_after is not None and step + 1 >= stop_after) or out_of_time:
                if (step + 1) % save_every and step + 1 != steps:
                    torch.save(snapshot(step + 1), state_path)
                break
    bar.close()
    return metrics


def _on_cpu(obj: Any) -> Any:
    """``obj`` with every tensor moved to the CPU, so a state saved on a GPU resumes anywhere."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _on_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_on_cpu(v) for v in obj)
    return obj


def _batch_worker(batcher: Batcher, first_group: int, start: int, steps: int, every: int, queue: Any) -> None:
    """Worker process: the batches of groups ``first_group``, ``first_group + every``, ... in step order.
    numpy crosses the process boundary by plain pickling (torch tensors would take shared-memory handles)."""
    for group in range(first_group, (steps + Batcher.GROUP - 1) // Batcher.GROUP, every):
        for step in range(max(start, group * Batcher.GROUP), min(steps, (group + 1) * Batcher.GROUP)):
            queue.put(tuple(t.numpy() if isinstance(t, torch.Tensor) else t for t in batcher(step)))


def _batches(batcher: Batcher, start: int, steps: int, workers: int) -> Generator[tuple[Any, ...], None, None]:
    """Batches ``start``..``steps`` in order, made here or, with ``workers``, by that many forked
    processes ahead of the training loop.  Each batch is a function of (seed, step), so worker ``k``
    simply draws every ``workers``-th group of ``Batcher.GROUP`` steps into its own bounded queue and
    the loop reads the queues in turn; closing the generator kills the workers."""
    if workers <= 0:
        for step in range(start, steps):
            yield batcher(step)
        return
    import multiprocessing
    import queue as queue_module

    ctx = multiprocessing.get_context("fork")
    first = start // Batcher.GROUP
    queues = [ctx.Queue(maxsize=2 * Batcher.GROUP) for _ in range(workers)]
    procs = [
        ctx.Process(target=_batch_worker, args=(batcher, first + k, start, steps, workers, queues[k]), daemon=True)
        for k in range(workers)
    ]
    for proc in procs:
        proc.start()
    try:
        for step in range(start, steps):
            k = (step // Batcher.GROUP - first) % workers
            while True:
                try:
                    batch = queues[k].get(timeout=5)
                    break
                except queue_module.Empty:
                    if not procs[k].is_alive():  # a crashed worker must not hang the run
                        raise RuntimeError(
                            f"batch worker {k} died (exit code {procs[k].exitcode}); its traceback is "
                            "printed above, or rerun with --workers 0 to raise it here"
                        ) from None
            yield tuple(torch.from_numpy(t) if hasattr(t, "dtype") else t for t in batch)
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.join(timeout=10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workbench.training.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("demo-train"), help="folder for state, log and config")
    parser.add_argument("--steps", type=int, default=3000, help="total optimizer steps")
    parser.add_argument("--batch-size", type=int, default=16, help="dialogs per step")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and data")
    parser.add_argument("--save-every", type=int, default=50, help="save state every N steps (resumes from it)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared machine)")
    parser.add_argument(
        "--params",
        type=Path,
        default=None,
        help="params.json-style model shape (default: the shipped demo model's shape)",
    )
    parser.add_argument(
        "--vocab-sample",
        type=int,
        default=None,
        help="dialogs sampled per split to build the compact vocabulary (default 1500)",
    )
    parser.add_argument(
        "--synthetic",
        type=float,
        default=0.35,
        help="share of training argument values that are made-up words (teaches copying)",
    )
    parser.add_argument(
        "--aux-weight",
        type=float,
        default=0.0,
        help="weight of a language-modelling loss on sampled prompt tokens (0 = off)",
    )
    parser.add_argument("--aux-positions", type=int, default=32, help="prompt tokens per row for that loss")
    parser.add_argument(
        "--copy-exercise",
        action="store_true",
        help="mix in 'repeat after me' dialogs (15%%), which teach copying arbitrary words",
    )
    parser.add_argument(
        "--shared-tools",
        action="store_true",
        help="offer one tool set per batch, so the whole system prompt is computed once per step",
    )
    parser.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="start from the weights of a training folder or of a compact artifact "
        "(e.g. workbench/demo/weights/demo-llama4.pt): same shape, its vocabulary",
    )
    parser.add_argument(
        "--copy-weight",
        type=float,
        default=1.0,
        help="loss weight of assistant tokens copied from the dialog (argument values, results)",
    )
    parser.add_argument(
        "--composed",
        type=float,
        default=0.0,
        help="share of training questions composed from parts (workbench.demo.phrasing) "
        "instead of drawn from the fixed templates",
    )
    parser.add_argument(
        "--spell",
        type=float,
        default=0.0,
        help="share of spelling exercises: vocabulary words written in quotes and back "
        "(a word after a space is other tokens than inside a call's quotes)",
    )
    parser.add_argument(
        "--spelled",
        action="store_true",
        help="build the rows of word tokens after a space from their spelling's pieces while "
        "training (workbench.training.spelled), so writing an unseen word in a call generalises",
    )
    parser.add_argument(
        "--generated-tools",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="share of dialogs over thousands of generated tools (workbench.demo.generated), so "
        "the model learns to read a tool's schema; their tokens join the vocabulary",
    )
    parser.add_argument(
        "--stop-after",
        type=int,
        default=None,
        help="end the run after this step (saved; a later run with other --steps resumes from it)",
    )
    parser.add_argument("--warmup", type=int, default=200, help="learning-rate warm-up steps")
    parser.add_argument("--device", default="cpu", help="where the model trains: cpu, cuda, cuda:1 ...")
    parser.add_argument(
        "--workers", type=int, default=0, help="processes that prepare batches ahead of training (a GPU needs several)"
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="save and stop after this much wall time (resume later with the same command)",
    )
    parser.add_argument("--export", type=Path, default=None, help="after training, write the compact artifact here")
    parser.add_argument(
        "--export-sample", type=int, default=256, help="dialogs whose hidden states fit the never-win output row"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    params = json.loads(args.params.read_text()) if args.params is not None else None
    metrics = train(
        args.out,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        save_every=args.save_every,
        params=params,
        vocab_sample=args.vocab_sample,
        synthetic=args.synthetic,
        aux_weight=args.aux_weight,
        aux_positions=args.aux_positions,
        copy_exercise=args.copy_exercise,
        shared_tools=args.shared_tools,
        init_from=args.init_from,
        warmup=args.warmup,
        copy_weight=args.copy_weight,
        stop_after=args.stop_after,
        composed=args.composed,
        spell=args.spell,
        spelled=args.spelled,
        device=args.device,
        workers=args.workers,
        max_minutes=args.max_minutes,
        generated_tools=args.generated_tools,
    )
    print(json.dumps(metrics))
    if args.export is not None:
        check = export_compact(args.out, args.export, sample_dialogs=args.export_sample)
        print(f"wrote {args.export}: {json.dumps(check)}")


if __name__ == "__main__":
    main()
