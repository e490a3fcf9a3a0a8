"""The exact cache key of one generated row, built from plain values so every caller (the engine, the tool
loop, the Ray driver, the server) derives the same key for the same work.

A row's key hashes two halves:

* the **request identity** (:func:`request_identity`, the ``match`` of a stored row): what was asked —
  the exact prompt token ids after rendering (tools, response formats and chat templates are already in
  them), the images by content, every sampling setting, the kind of result (``completion`` / ``chat``,
  which parse the same tokens differently; ``score``: a teacher-forced scoring, its ``sampling`` the scored
  span's start) and any ``extra`` output-shaping option;
* the **engine identity**: the checkpoint's content identity (:mod:`workbench.runs.identity`), the load
  settings that change numbers (dtype, quantization, model-parallel size, device type: :func:`load_fields`)
  and :data:`NUMERICS_VERSION`.

Two runs of one request on two engines (bf16 and int4_mixed) share the request identity and differ in
the key: :func:`workbench.runs.compare` pairs rows by the first, the cache hits only on the second.

Sampled rows without a seed: the key is built from the sampling *as given* (seed absent), so re-running the
same call answers from the store; :func:`settle_seed` draws the seed the row is then generated with, and the
store records it, so the row can be replayed exactly with ``seed=``.  Identical unseeded sampled requests
within one call are distinct samples: :func:`request_keys` numbers their repeats (``occurrence``), so the
k-th repeat of a re-run finds the k-th stored sample.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import random
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import InputError
from workbench.runtime.settings import Settings

# Bump when a change to workbench makes the same request on the same checkpoint and settings produce
# different tokens or log-probabilities (a kernel, a sampler, a quantization recipe, a prompt renderer
# whose ids are not in the key): every stored row keyed with the old value then misses.
NUMERICS_VERSION = 1

KINDS = ("completion", "chat", "transcript", "score")

_SEED_RANGE = 2**63  # drawn seeds: non-negative 63-bit, valid for torch.Generator and SQLite integers


@dataclass(frozen=True)
class RowRequest:
    """The plain values that identify one row's work (see the module docstring)."""

    prompt_ids: Sequence[int]
    sampling: Mapping[str, Any] = field(default_factory=dict)
    kind: str = "completion"
    images: Sequence[Any] = ()
    extra: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class RowKey:
    """A row's exact cache ``key`` and its request identity ``match`` (both hex sha256), and its ``kind``."""

    key: str
    match: str
    kind: str

    def __str__(self) -> str:
        return self.key


# ------------------------------------------------------------------------------------------ canonical values
def canonical_sampling(sampling: Mapping[str, Any]) -> dict[str, Any]:
    """``sampling`` as canonical plain data: None values dropped (absent and None mean the same), numbers
    typed (``temperature=0`` and ``0.0`` are one setting), ``stop`` a list, ``response_format`` canonical
    JSON (a pydantic model class by its JSON schema), keys sorted."""
    if not isinstance(sampling, Mapping):
        raise InputError(f"sampling settings must be a dict of keyword -> value, got {type(sampling).__name__}")
    out: dict[str, Any] = {}
    for name in sorted(sampling):
        if not isinstance(name, str):
            raise InputError(f"sampling setting names must be strings, got {name!r}")
        value = sampling[name]
        if value is None:
            continue
        if name in ("temperature", "top_p") and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value)
        elif name == "stop":
            value = [value] if isinstance(value, str) else list(value)
            if not value:
                continue
        elif name == "logprobs" and isinstance(value, bool):
            value = int(value)
        elif name == "constrain_tools":
            value = bool(value)
        out[name] = canonical_value(value)
    return out


def canonical_value(value: Any) -> Any:
    """Plain JSON data for hashing: tuples as lists, enums by value, pydantic classes and objects by their
    JSON schema / dump; anything else by its type and repr (a value whose repr changes misses, never hits)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Mapping):
        return {str(k): canonical_value(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, (list, tuple)):
        return [canonical_value(v) for v in value]
    if isinstance(value, type) and hasattr(value, "model_json_schema"):  # a pydantic model class
        return {"pydantic_schema": canonical_value(value.model_json_schema())}
    if hasattr(value, "model_dump"):
        return canonical_value(value.model_dump(mode="json"))
    if isinstance(value, enum.Enum):
        return canonical_value(value.value)
    return {"type": f"{type(value).__module__}.{type(value).__qualname__}", "repr": repr(value)}


def pack_ids(ids: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32 (4 bytes each), or ``q`` and int64 when an id needs it (8k + 1 bytes)."""
    ids = [int(i) for i in ids]
    if ids and (min(ids) < 0 or max(ids) >= 2**32):
        return b"q" + struct.pack(f"<{len(ids)}q", *ids)
    return struct.pack(f"<{len(ids)}I", *ids)


def unpack_ids(blob: bytes) -> list[int]:
    """The ids :func:`pack_ids` packed."""
    if blob[:1] == b"q" and len(blob) % 8 == 1:
        return list(struct.unpack(f"<{(len(blob) - 1) // 8}q", blob[1:]))
    return list(struct.unpack(f"<{len(blob) // 4}I", blob))


def _digest(obj: Any, ids: Sequence[int] = ()) -> str:
    """sha256 of canonical JSON plus the ids as :func:`pack_ids` packs them (uint32 runs marked ``I``)."""
    h = hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
    packed = pack_ids(ids)
    h.update(packed if len(packed) % 4 else b"I" + packed)  # an int64 run is 8k + 1 bytes and starts with q
    return h.hexdigest()


def _check_ids(prompt_ids: Sequence[int]) -> list[int]:
    try:
        ids = [int(i) for i in prompt_ids]
    except (TypeError, ValueError):
        raise InputError(f"prompt_ids must be a sequence of token ids (ints), got {prompt_ids!r:.80}") from None
    if any(i < -(2**63) or i >= 2**63 for i in ids):
        raise InputError("prompt_ids hold an id outside the 64-bit range")
    return ids


def image_digest(image: Any) -> str:
    """An image's content hash: a PIL image by its mode, size and pixels (so the same picture hits whatever
    file format it came in, once opened), encoded bytes by their bytes, a numpy array by dtype, shape and
    data; a string is taken as an already computed digest."""
    if isinstance(image, str):
        return image
    h = hashlib.sha256()
    if isinstance(image, (bytes, bytearray, memoryview)):
        h.update(b"bytes:")
        h.update(bytes(image))
    elif hasattr(image, "mode") and hasattr(image, "size") and hasattr(image, "tobytes"):  # PIL.Image.Image
        h.update(f"pil:{image.mode}:{tuple(image.size)}:".encode())
        h.update(image.tobytes())
    elif hasattr(image, "dtype") and hasattr(image, "shape") and hasattr(image, "tobytes"):  # numpy array
        h.update(f"array:{image.dtype}:{tuple(image.shape)}:".encode())
        h.update(image.tobytes())
    else:
        raise InputError(
            f"cannot hash an image given as {type(image).__name__}; give a PIL image, encoded bytes, "
            "a numpy array or a precomputed digest string"
        )
    return "sha256:" + h.hexdigest()


# ------------------------------------------------------------------------------------------ keys
def request_identity(
    prompt_ids: Sequence[int],
    sampling: Mapping[str, Any],
    *,
    kind: str = "completion",
    images: Sequence[Any] = (),
    extra: Mapping[str, Any] | None = None,
    occurrence: int = 0,
) -> str:
    """The request half of a key (hex sha256): prompt ids, images by content, canonical sampling, kind,
    ``extra`` options and the repeat number of an unseeded sampled request.  Independent of the engine, so
    the same request on bf16 and on int4_mixed has the same identity."""
    if kind not in KINDS:
        raise InputError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    ids = _check_ids(prompt_ids)
    body = {
        "kind": kind,
        "sampling": canonical_sampling(sampling),
        "images": [image_digest(i) for i in images],
        "extra": canonical_value(dict(extra or {})),
    }
    if occurrence:
        body["occurrence"] = int(occurrence)
    return _digest(body, ids)


def cache_key(identity: str, load: Mapping[str, Any], match: str) -> str:
    """The exact key (hex sha256) of request identity ``match`` on the checkpoint ``identity`` with the load
    settings ``load`` (see :func:`load_fields`) under this workbench's :data:`NUMERICS_VERSION`."""
    if not isinstance(identity, str) or not identity:
        raise InputError(f"checkpoint identity must be a non-empty string, got {identity!r}")
    return _digest(
        {"numerics": NUMERICS_VERSION, "checkpoint": identity, "load": canonical_value(dict(load)), "request": match}
    )


def row_key(identity: str, load: Mapping[str, Any], request: RowRequest, occurrence: int = 0) -> RowKey:
    """One row's :class:`RowKey` (``occurrence``: the repeat number of an unseeded sampled request)."""
    match = request_identity(
        request.prompt_ids,
        request.sampling,
        kind=request.kind,
        images=request.images,
        extra=request.extra,
        occurrence=occurrence,
    )
    return RowKey(cache_key(identity, load, match), match, request.kind)


def request_keys(identity: str, load: Mapping[str, Any], requests: Sequence[RowRequest]) -> list[RowKey]:
    """The keys of one call's rows, in order.  Repeats of one unseeded sampled request are numbered (0, 1,
    ...) so they stay distinct samples; repeats of a greedy or seeded request share their key (same output)."""
    seen: dict[str, int] = {}
    keys = []
    for request in requests:
        match = request_identity(
            request.prompt_ids, request.sampling, kind=request.kind, images=request.images, extra=request.extra
        )
        if needs_seed(request.sampling):
            occurrence = seen.get(match, 0)
            seen[match] = occurrence + 1
            if occurrence:  # the first sample keeps the plain identity (occurrence 0 adds nothing to it)
                match = request_identity(
                    request.prompt_ids,
                    request.sampling,
                    kind=request.kind,
                    images=request.images,
                    extra=request.extra,
                    occurrence=occurrence,
                )
        keys.append(RowKey(cache_key(identity, load, match), match, request.kind))
    return keys


# ------------------------------------------------------------------------------------------ seeds
def needs_seed(sampling: Mapping[str, Any]) -> bool:
    """True for a sampled row (temperature > 0) that was given no seed."""
    temperature = sampling.get("temperature") or 0.0
    return float(temperature) > 0.0 and sampling.get("seed") is None


def draw_seed() -> int:
    """A fresh seed from the OS's randomness (non-negative, 63 bits)."""
    return random.SystemRandom().randrange(_SEED_RANGE)


def settle_seed(sampling: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """``(sampling with a seed, drawn)``: a sampled row without a seed gets a drawn one, which the caller
    generates with and stores (``put(..., sampling=settled, seed_drawn=drawn)``) so the row can be replayed."""
    settled = dict(sampling)
    if needs_seed(sampling):
        settled["seed"] = draw_seed()
        return settled, True
    return settled, False


# ------------------------------------------------------------------------------------------ load settings
def load_fields(settings: Settings | Mapping[str, Any]) -> dict[str, Any]:
    """The load settings that change numbers, as plain data: dtype, quantization, model-parallel size and
    device *type* (``cuda:1`` and ``cuda:0`` compute alike).  Batch size and sequence length are left out:
    a row's tokens do not depend on them."""
    if isinstance(settings, Settings):
        dtype, quantization = str(settings.dtype).replace("torch.", ""), settings.quantization
        mp, device = settings.model_parallel_size, settings.device
    elif isinstance(settings, Mapping):
        dtype = str(settings.get("dtype")).replace("torch.", "")
        quantization, mp, device = (
            settings.get("quantization"),
            settings.get("model_parallel_size"),
            settings.get("device"),
        )
    else:
        raise InputError(f"load settings must be a Settings record or a dict, got {type(settings).__name__}")
    return {
        "dtype": dtype,
        "quantization": quantization or None,
        "model_parallel_size": int(mp or 1),
        "device_type": str(device or "cpu").split(":")[0],
    }
