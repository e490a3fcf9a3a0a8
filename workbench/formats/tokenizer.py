"""tiktoken-based tokenizer for Llama 3 and Llama 4 ``tokenizer.model`` files.

The BPE ranks come from the file; the special tokens (an interface fact of each family) are
numbered right after the base vocabulary: 256 of them for Llama 3, 2048 for Llama 4.
Text that merely *looks* like a special token is encoded as plain text, so user input can never
inject control tokens.
"""

from __future__ import annotations

import base64
import importlib.util
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import tiktoken

from workbench.errors import CheckpointError, MissingCheckpointFileError

Family = Literal["llama3", "llama4"]

# tiktoken panics on inputs over ~400k chars and is quadratic on very long runs of whitespace or
# non-whitespace (openai/tiktoken#195), so long inputs are cut into safe pieces first.
MAX_ENCODE_CHARS = 400_000
MAX_RUN_CHARS = 25_000

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA4_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

LLAMA3_BASE_VOCAB = 128_000
LLAMA4_BASE_VOCAB = 200_000


def _reserved(name: str, count: int, start: int = 0) -> list[str]:
    return [f"<|{name}_reserved_special_token_{i}|>" for i in range(start, start + count)]


def llama3_special_tokens() -> list[str]:
    """The 256 Llama 3 special tokens in id order (ids start at the base vocabulary size)."""
    named = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|step_id|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
        "<|image|>",
    ]
    return named + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(named))]


def llama4_special_tokens() -> list[str]:
    """The 2048 Llama 4 special tokens in id order (ids start at the base vocabulary size)."""
    basic = ["<|begin_of_text|>", "<|end_of_text|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"]
    post_train = [
        "<|header_start|>",
        "<|header_end|>",
        "<|eom|>",
        "<|eot|>",
        "<|step|>",
        *_reserved("text_post_train", 6),
        "<|python_start|>",
        "<|python_end|>",
        "<|finetune_right_pad|>",
        *_reserved("text_post_train", 61, 8),
    ]
    vision = [
        "<|image_start|>",
        "<|image_end|>",
        "<|vision_reserved_special_token_0|>",
        "<|vision_reserved_special_token_1|>",
        "<|tile_x_separator|>",
        "<|tile_y_separator|>",
        *_reserved("vision", 4, 2),
        "<|image|>",
        "<|vision_reserved_special_token_6|>",
        "<|patch|>",
        *_reserved("vision", 1041, 7),
    ]
    reasoning = [*_reserved("reasoning", 8), "<|reasoning_thinking_start|>", "<|reasoning_thinking_end|>"]
    named = basic + post_train + vision + reasoning
    return named + [f"<|reserved_special_token_{i}|>" for i in range(2048 - len(named))]


def bundled_tokenizer_path(family: Family) -> Path:
    """Path of the ``tokenizer.model`` shipped inside the ``llama-models`` package (data only: no import)."""
    spec = importlib.util.find_spec("llama_models")
    if spec is None or not spec.submodule_search_locations:
        raise MissingCheckpointFileError(
            "no tokenizer.model in the checkpoint folder and the llama-models package (which bundles "
            "one) is not installed; copy tokenizer.model next to params.json or `pip install llama-models`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / family / "tokenizer.model"
    if not path.exists():
        raise MissingCheckpointFileError(f"bundled tokenizer not found at {path}; reinstall llama-models")
    return path


def load_bpe_ranks(path: Path) -> dict[bytes, int]:
    """Read a tiktoken BPE file: one ``base64(token) rank`` pair per line (errors name the file and line)."""
    if path.is_dir():
        raise CheckpointError(
            f"{path} is a folder, not a tokenizer file; tokenizer.model must be the tiktoken BPE file of the checkpoint"
        )
    hint = (
        "is this a SentencePiece (Llama 2) tokenizer.model or a corrupted download? Llama 3/4 need the tiktoken "
        "file (copy it from the checkpoint's original download)"
    )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"cannot read {path} ({exc.strerror}); check its permissions") from exc
    try:
        text = data.decode("ascii")  # base64 and decimal ranks only
    except UnicodeDecodeError as exc:
        line_no = data.count(b"\n", 0, exc.start) + 1
        raise CheckpointError(
            f"{path}:{line_no} holds binary data (byte {exc.start}), not '<base64> <rank>' lines; {hint}"
        ) from exc
    ranks: dict[bytes, int] = {}
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            token_b64, rank = line.split()
            token = base64.b64decode(token_b64, validate=True)
            if token in ranks:
                raise ValueError(f"token {token!r} appears twice")
            ranks[token] = int(rank)
        except ValueError as exc:
            raise CheckpointError(
                f"{path}:{line_no} is not a tiktoken BPE line ('<base64> <rank>'): {exc}; {hint}"
            ) from exc
    if not ranks:
        raise CheckpointError(f"{path} holds no BPE ranks (empty file); {hint}")
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise CheckpointError(f"{path}: the BPE ranks are not 0..{len(ranks) - 1} without gaps or repeats; {hint}")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:  # byte-level BPE must be able to encode any byte (tiktoken panics otherwise)
        raise CheckpointError(
            f"{path} has no token for {len(missing)} single byte(s) (e.g. {bytes([missing[0]])!r}); {hint}"
        )
    return ranks


class Tokenizer:
    """Encode/decode text for one Llama family; exposes the family's special and stop tokens."""

    def __init__(self, path: str | Path, family: Family | None = None) -> None:
        path = Path(path)
        if not path.exists():
            raise MissingCheckpointFileError(f"tokenizer file not found: {path}")
        ranks = load_bpe_ranks(path)
        n_base = len(ranks)
        if family is None:
            family = "llama4" if n_base >= LLAMA4_BASE_VOCAB else "llama3"
        self.family: Family = family
        self.path = path
        specials = llama4_special_tokens() if family == "llama4" else llama3_special_tokens()
        self.special_tokens: dict[str, int] = {tok: n_base + i for i, tok in enumerate(specials)}
        # the BPE table and split pattern, public for tools that build their own view of the vocabulary (llguidance)
        self.bpe_ranks: dict[bytes, int] = ranks
        self.pattern: str = LLAMA4_PATTERN if family == "llama4" else LLAMA3_PATTERN
        self._model = tiktoken.Encoding(
            name=f"{family}:{path.name}",
            pat_str=self.pattern,
            mergeable_ranks=ranks,
            special_tokens=self.special_tokens,
        )
        self.n_words: int = n_base + len(specials)
        self.bos_id = self.special_tokens["<|begin_of_text|>"]
        self.eos_id = self.special_tokens["<|end_of_text|>"]
        if family == "llama4":
            self.eot_id = self.special_tokens["<|eot|>"]
            self.eom_id = self.special_tokens["<|eom|>"]
            self.pad_id = self.special_tokens["<|finetune_right_pad|>"]
        else:
            self.eot_id = self.special_tokens["<|eot_id|>"]
            self.eom_id = self.special_tokens["<|eom_id|>"]
            self.pad_id = self.special_tokens["<|finetune_right_pad_id|>"]
        self.stop_tokens: list[int] = [self.eos_id, self.eom_id, self.eot_id]

    @classmethod
    def for_checkpoint(cls, ckpt_dir: str | Path | None, family: Family) -> Tokenizer:
        """The checkpoint folder's ``tokenizer.model`` if present, else the family's bundled file."""
        if ckpt_dir is not None and (Path(ckpt_dir) / "tokenizer.model").exists():
            return cls(Path(ckpt_dir) / "tokenizer.model", family)
        return cls(bundled_tokenizer_path(family), family)

    @property
    def vocab_size(self) -> int:
        return self.n_words

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        """Token ids of ``text``; special-looking substrings are plain text (never control tokens)."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        ids: list[int] = [self.bos_id] if bos else []
        for start in range(0, len(text), MAX_ENCODE_CHARS):
            for piece in _split_long_runs(text[start : start + MAX_ENCODE_CHARS], MAX_RUN_CHARS):
                ids.extend(self._model.encode(piece, allowed_special=set(), disallowed_special=()))
        if eos:
            ids.append(self.eos_id)
        return ids

    def encode_special(self, token: str) -> int:
        """Id of one special token given by name, e.g. ``"<|eot|>"``."""
        return self.special_tokens[token]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (special tokens render as their names)."""
        return self._model.decode([int(i) for i in ids])

    def decode_token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (streaming needs them to avoid splitting UTF-8 sequences)."""
        return self._model.decode_single_token_bytes(int(token_id))

    def is_special(self, token_id: int) -> bool:
        return int(token_id) >= self.n_words - len(self.special_tokens)

    def __repr__(self) -> str:
        return f"Tokenizer(family={self.family!r}, n_words={self.n_words}, path={str(self.path)!r})"


def _split_long_runs(text: str, max_run: int) -> Iterator[str]:
    """Cut ``text`` so no piece holds more than ``max_run`` consecutive (non-)whitespace characters."""
    if not text:
        yield text
        return
    run_len = 0
    run_is_space = text[0].isspace()
    piece_start = 0
    for i, ch in enumerate(text):
        is_space = ch.isspace()
        if is_space != run_is_space:
            run_is_space, run_len = is_space, 1
            continue
        run_len += 1
        if run_len > max_run:
            yield text[piece_start:i]
            piece_start, run_len = i, 1
    yield text[piece_start:]
