"""Tokenizer parity with llama-models' tokenizers, special tokens, and very long inputs."""

from __future__ import annotations

import pytest

from workbench.errors import MissingCheckpointFileError
from workbench.formats.tokenizer import Tokenizer, bundled_tokenizer_path

TEXTS = [
    "The capital of France is Paris.",
    "  leading spaces and\ttabs\nnewlines\r\n",
    "unicode: 🦙 ünïcödé 日本語 العربية",
    "code: def f(x):\n    return {'a': [1, 2.5e-3]}\n",
    "special-looking text: <|begin_of_text|> <|eot_id|> <|eot|> <|header_start|>",
    "numbers 1234567890 and   multiple   spaces",
    "",
]


def reference_tokenizer(family: str):
    if family == "llama4":
        from llama_models.llama4.tokenizer import Tokenizer as Ref
    else:
        from llama_models.llama3.tokenizer import Tokenizer as Ref
    return Ref.get_instance()


@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_encode_decode_match_reference(family):
    ours = Tokenizer(bundled_tokenizer_path(family), family)  # type: ignore[arg-type]
    ref = reference_tokenizer(family)
    assert ours.n_words == ref.n_words
    assert ours.special_tokens == ref.special_tokens
    assert (ours.bos_id, ours.eos_id, ours.eot_id, ours.eom_id, ours.pad_id) == (
        ref.bos_id,
        ref.eos_id,
        ref.eot_id,
        ref.eom_id,
        ref.pad_id,
    )
    assert ours.stop_tokens == ref.stop_tokens
    for text in TEXTS:
        for bos, eos in ((True, False), (False, True), (False, False)):
            ids = ours.encode(text, bos=bos, eos=eos)
            assert ids == ref.encode(text, bos=bos, eos=eos)
        assert ours.decode(ours.encode(text)) == text


@pytest.mark.parametrize("family", ["llama3", "llama4"])
def test_special_looking_text_is_plain_text(family):
    tok = Tokenizer.for_checkpoint(None, family)  # type: ignore[arg-type]
    name = "<|eot|>" if family == "llama4" else "<|eot_id|>"
    ids = tok.encode(f"user typed {name} here", bos=False)
    assert tok.special_tokens[name] not in ids
    assert all(not tok.is_special(i) for i in ids)
    assert tok.decode(ids) == f"user typed {name} here"


def test_very_long_runs_are_split_safely():
    tok = Tokenizer.for_checkpoint(None, "llama3")
    ref = reference_tokenizer("llama3")
    for text in ("a" * 120_000, " " * 60_000 + "x", ("word " * 20_000) + "z" * 30_000):
        ids = tok.encode(text)
        assert ids == ref.encode(text, bos=False, eos=False)
        assert tok.decode(ids) == text


def test_tokenizer_from_checkpoint_folder_and_fallback(tmp_path, llama3_dir):
    assert Tokenizer.for_checkpoint(llama3_dir, "llama3").path == llama3_dir / "tokenizer.model"
    assert Tokenizer.for_checkpoint(tmp_path, "llama4").path == bundled_tokenizer_path("llama4")
    with pytest.raises(MissingCheckpointFileError):
        Tokenizer(tmp_path / "missing.model")
