"""The demo model's compact vocabulary: which of the 202048 Llama 4 token ids it is trained over.

Broad on purpose: the ``COMMON_IDS`` lowest ids (tiktoken ids follow merge rank, so these are the
most common pieces of text), every id met in a sample of dialogs of both splits, every id of the
argument pools' values, and the special tokens of the chat format.  A subset taken only from the
training corpus would make unseen words impossible to produce; this one leaves room to copy values
the model never saw as targets.  Deterministic, so export and training agree.
"""

from __future__ import annotations

from typing import Any

from workbench.demo import pools
from workbench.demo.data import DialogGenerator, encode
from workbench.formats import make_formatter

COMMON_IDS = 16000
SAMPLE_DIALOGS = 1500
SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|header_start|>",
    "<|header_end|>",
    "<|eot|>",
    "<|eom|>",
    "<|python_start|>",
    "<|python_end|>",
    "<|finetune_right_pad|>",
)


def build_compact_vocab(tokenizer: Any, sample_dialogs: int = SAMPLE_DIALOGS) -> list[int]:
    """Sorted full-vocabulary ids of the compact vocabulary."""
    ids: set[int] = set(range(COMMON_IDS))
    ids.update(tokenizer.encode_special(s) for s in SPECIALS)
    formatter = make_formatter(tokenizer, None)
    for split in ("train", "heldout"):
        gen = DialogGenerator(split, seed=12345)
        for _ in range(sample_dialogs):
            ids.update(encode(formatter, gen.dialog()).tokens)
    for name in (
        "CITIES",
        "COUNTRIES",
        "FIRST_NAMES",
        "LAST_NAMES",
        "CURRENCIES",
        "UNITS",
        "LANGUAGES",
        "WORDS",
        "REMINDERS",
    ):
        for value in getattr(pools, name):
            value = value.replace("_", " ")
            for text in (value, " " + value, f'"{value}")', f"={value}", value.lower(), " " + value.lower()):
                ids.update(tokenizer.encode(text))
    ids.update(tokenizer.encode(" ".join(pools.CAPITALS.values())))
    # numbers and short upper-case codes (amounts, tickers, currency codes) are split into these pieces
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    pieces = [str(n) for n in range(1000)] + [a + b for a in letters for b in letters] + list(letters)
    for piece in pieces:
        for text in (piece, " " + piece, "=" + piece, '"' + piece):
            ids.update(tokenizer.encode(text))
    return sorted(ids)


def spelling_words(tokenizer: Any, vocab: list[int]) -> list[str]:
    """Every word of the compact vocabulary that is one token after a space (' Oslo') and whose quoted
    form (``"Oslo"``: other tokens) lies in the vocabulary too: the words of the spelling exercise.

    The whole vocabulary, not a chosen pool: the compact vocabulary holds the argument pools of both
    splits, so held-out values are among these words (as a pretrained model knows every word's
    spelling), but the exercise never writes them as tool arguments.
    """
    allowed = set(vocab)
    quote = tokenizer.encode('"')
    words = []
    for token in vocab:
        text = tokenizer.decode([token])
        word = text[1:]
        if not (text.startswith(" ") and len(word) >= 2 and word.isascii() and word.isalpha()):
            continue
        quoted = tokenizer.encode(f'"{word}"')
        if quoted[:1] == quote and all(t in allowed for t in quoted):
            words.append(word)
    return words


def extend_vocab(vocab: list[int], extra: set[int], state: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    """``vocab`` with the ids of ``extra`` added (sorted), and a compact state dict whose embedding rows
    follow it: trained rows keep their values, new rows start as the mean trained row (a neutral start
    that a spelled run rebuilds from the word's pieces).  Unchanged when nothing is new."""
    new_vocab = sorted(set(vocab) | set(extra))
    if len(new_vocab) == len(vocab):
        return vocab, state
    old = state["tok_embeddings.weight"]  # [V_old, D]
    index = {t: i for i, t in enumerate(vocab)}
    rows = old.mean(0, keepdim=True).repeat(len(new_vocab), 1)  # [V_new, D]
    kept = [i for i, t in enumerate(new_vocab) if t in index]
    rows[kept] = old[[index[new_vocab[i]] for i in kept]]
    return new_vocab, {**state, "tok_embeddings.weight": rows, "output.weight": rows}
