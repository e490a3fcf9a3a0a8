"""Model arguments parsed from a checkpoint's ``params.json``.

Every field Meta ships for Llama 3.x and Llama 4 is known here; an unknown field or a value of the
wrong type raises :class:`ModelArgsError` naming the field, so a typo or a new format is noticed at
load time instead of silently changing the architecture.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from workbench.errors import MissingCheckpointFileError, ModelArgsError

Family = Literal["llama3", "llama4"]


@dataclass
class MoEArgs:
    num_experts: int = -1
    capacity_factor: float = 1.0
    auto_scale_F: bool = True  # noqa: N815  (Meta's field name)
    top_k: int = 1
    interleave_moe_layer_step: int = 1


@dataclass
class QuantizationArgs:
    scheme: str | None = None
    group_size: int | None = None
    spinquant: bool = False


@dataclass
class LoRAArgs:
    rank: int = 0
    scale: float = 1.0


@dataclass
class Size:
    height: int
    width: int


@dataclass
class VisionArgs:
    """The Llama 4 vision encoder's shape (``vision_args`` of params.json).

    Images are cut into ``image_size`` tiles of ``patch_size`` patches; the encoder (``dim``, ``n_layers``,
    ``n_heads``, ``mlp_ratio``) embeds every patch, pixel shuffle by ``pixel_shuffle_ratio`` merges neighbouring
    patches, and an MLP maps them to ``output_dim`` before the projection to the text model's ``dim``.
    """

    image_size: Size
    patch_size: Size
    dim: int
    n_layers: int
    n_heads: int
    mlp_ratio: float
    output_dim: int
    pixel_shuffle_ratio: float

    @property
    def tile_size(self) -> int:
        """Side of a square tile in pixels (Meta's preprocessing tiles on ``image_size.width``)."""
        return self.image_size.width

    @property
    def patches_per_tile(self) -> int:
        """Encoder patches per tile (before pixel shuffle)."""
        return (self.image_size.height // self.patch_size.height) * (self.image_size.width // self.patch_size.width)

    @property
    def tokens_per_tile(self) -> int:
        """``<|patch|>`` tokens per tile in the prompt: patches merged by pixel shuffle."""
        return self.patches_per_tile // int(round(1.0 / self.pixel_shuffle_ratio**2))


@dataclass
class ModelArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int = -1
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    ffn_exp: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    use_scaled_rope: bool = False
    rope_scaling_factor: float | None = None
    rope_high_freq_factor: float | None = None
    attention_chunk_size: int | None = None
    nope_layer_interval: int | None = None
    use_qk_norm: bool = False
    attn_temperature_tuning: bool = False
    floor_scale: float = 8192.0
    attn_scale: float = 0.1
    moe_args: MoEArgs | None = None
    quantization_args: QuantizationArgs | None = None
    lora_args: LoRAArgs | None = None
    vision_args: VisionArgs | None = None
    # Llama 3.2 vision fields (cross-attention models); parsed so such params.json load cleanly.
    vision_chunk_size: int = -1
    vision_max_num_chunks: int = 4
    vision_num_cross_attention_layers: int = -1
    vision_model: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    # --------------------------------------------------------------------- derived facts
    @property
    def family(self) -> Family:
        """Llama 4 checkpoints carry ``moe_args``; everything else is Llama 3.x."""
        return "llama4" if self.moe_args is not None else "llama3"

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def rope_head_dim(self) -> int:
        """Head size used by attention and RoPE (``dim // n_heads`` unless params give ``head_dim``)."""
        return self.head_dim if self.head_dim is not None else self.dim // self.n_heads

    def rope_scaling(self) -> tuple[float, float, float] | None:
        """(scale_factor, low_freq_factor, high_freq_factor) of scaled RoPE, or None when off.

        Llama 3.1+ always use (8, 1, 4): Meta's Llama 3 reference ignores any scaling fields in
        params.json, and we match the reference.  Llama 4 reads ``rope_scaling_factor`` and
        ``rope_high_freq_factor``, defaulting to Scout's (16, 1, 1).
        """
        if not self.use_scaled_rope:
            return None
        if self.family == "llama4":
            return (self.rope_scaling_factor or 16.0, 1.0, self.rope_high_freq_factor or 1.0)
        return (8.0, 1.0, 4.0)

    def is_nope_layer(self, layer_id: int) -> bool:
        """NoPE (no rotary embedding, global attention) every ``nope_layer_interval``-th layer."""
        return self.nope_layer_interval is not None and (layer_id + 1) % self.nope_layer_interval == 0

    def is_moe_layer(self, layer_id: int) -> bool:
        return self.moe_args is not None and (layer_id + 1) % self.moe_args.interleave_moe_layer_step == 0

    def dense_hidden_dim(self) -> int:
        """SwiGLU hidden size of a dense feed-forward: 2/3 * 4 * dim, scaled, rounded up to multiple_of."""
        hidden = int(2 * int(4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    def moe_hidden_dim(self) -> int:
        """Hidden size of each routed/shared expert of a Llama 4 MoE layer."""
        assert self.moe_args is not None and self.ffn_exp is not None
        hidden = int(2 * int(self.ffn_exp * self.dim) / 3)
        hidden = int((self.ffn_dim_multiplier if self.ffn_dim_multiplier is not None else 1.0) * hidden)
        if self.moe_args.auto_scale_F:
            hidden = int(hidden / (self.moe_args.capacity_factor + 1))
        hidden += -hidden % self.multiple_of
        return hidden

    def to_json_dict(self) -> dict[str, Any]:
        """The params.json form (None fields and the internal ``extra`` dropped)."""
        out = {k: v for k, v in asdict(self).items() if v is not None and k != "extra"}
        for key in ("vision_chunk_size", "vision_max_num_chunks", "vision_num_cross_attention_layers"):
            if out.get(key) == getattr(ModelArgs, key):
                out.pop(key)
        return out

    # --------------------------------------------------------------------- parsing
    @classmethod
    def from_dict(cls, params: dict[str, Any], source: str = "params.json") -> ModelArgs:
        """Validate and convert a params.json dict; errors name the field and the file."""
        known = {f.name: f for f in fields(cls) if f.name != "extra"}
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise ModelArgsError(
                f"{source}: unknown field(s) {unknown}; known fields are {sorted(known)}. "
                "Remove the field, or upgrade workbench if this is a newer Meta format."
            )
        for required in ("dim", "n_layers", "n_heads"):
            if required not in params:
                raise ModelArgsError(f"{source}: required field {required!r} is missing; add it to params.json")
        values: dict[str, Any] = {}
        for name, value in params.items():
            values[name] = _convert(name, value, known[name].type, source)
        args = cls(**values)
        args.validate(source)
        return args

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path) -> ModelArgs:
        path = Path(ckpt_dir) / "params.json"
        if not path.exists():
            raise MissingCheckpointFileError(
                f"{path} not found: a Meta checkpoint folder holds params.json, consolidated.NN.pth and "
                "tokenizer.model; point workbench.load() at that folder"
            )
        if not path.is_file():
            raise ModelArgsError(
                f"{path} is a folder, not a file; params.json must be the checkpoint's JSON "
                "file of model arguments — re-download it"
            )
        try:
            params = json.loads(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ModelArgsError(
                f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); params.json must be "
                "a JSON file — re-download it"
            ) from exc
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ModelArgsError(f"{path} is not valid JSON ({exc}); fix or re-download params.json") from exc
        except OSError as exc:
            raise ModelArgsError(f"cannot read {path} ({exc.strerror}); check its permissions") from exc
        if not isinstance(params, dict):
            raise ModelArgsError(f"{path} must hold a JSON object, got {type(params).__name__}")
        return cls.from_dict(params, source=str(path))

    def validate(self, source: str) -> None:
        """Semantic checks: every value in its range, finite, and the sizes consistent with each other."""

        def bad(msg: str) -> ModelArgsError:
            return ModelArgsError(f"{source}: {msg}")

        def check_range(
            name: str, value: float | int | None, low: float, high: float, *, low_open: bool = False, hint: str = ""
        ) -> None:
            if value is None:
                return
            if isinstance(value, float) and not math.isfinite(value):
                raise bad(f"{name} must be a finite number, got {value!r}{hint}")
            if value < low or (low_open and value == low) or value > high:
                lo = f"> {low:g}" if low_open else f">= {low:g}"
                raise bad(f"{name} must be {lo} and <= {high:g}, got {value!r}{hint}")

        for name, high in _INT_LIMITS.items():
            check_range(name, getattr(self, name), 1, high)
        check_range("head_dim", self.head_dim, 1, _MAX_HEAD_DIM)
        if self.vocab_size != -1:
            check_range("vocab_size", self.vocab_size, 1, _MAX_VOCAB, hint=" (or -1: taken from the tokenizer)")
        check_range("multiple_of", self.multiple_of, 1, _MAX_DIM)
        for name in (
            "ffn_dim_multiplier",
            "ffn_exp",
            "norm_eps",
            "rope_theta",
            "rope_scaling_factor",
            "rope_high_freq_factor",
            "floor_scale",
        ):
            check_range(name, getattr(self, name), 0.0, _MAX_FLOAT, low_open=True)
        check_range("attn_scale", self.attn_scale, -_MAX_FLOAT, _MAX_FLOAT)
        if self.n_kv_heads is not None:
            check_range("n_kv_heads", self.n_kv_heads, 1, _INT_LIMITS["n_heads"])
        if self.n_heads % self.kv_heads:
            raise bad(f"n_heads ({self.n_heads}) must be a positive multiple of n_kv_heads ({self.kv_heads})")
        if self.head_dim is None and self.dim % self.n_heads:
            raise bad(f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads}) (or give head_dim)")
        if self.rope_head_dim % 2:
            raise bad(f"head size {self.rope_head_dim} must be even for rotary embeddings")
        if self.moe_args is not None:
            moe = self.moe_args
            check_range("moe_args.num_experts", moe.num_experts, 1, _MAX_EXPERTS)
            if not 1 <= moe.top_k <= moe.num_experts:
                raise bad(f"moe_args.top_k ({moe.top_k}) must be in 1..num_experts ({moe.num_experts})")
            check_range("moe_args.interleave_moe_layer_step", moe.interleave_moe_layer_step, 1, _INT_LIMITS["n_layers"])
            check_range("moe_args.capacity_factor", moe.capacity_factor, 0.0, _MAX_FLOAT)
            if self.ffn_exp is None:
                raise bad("Llama 4 (moe_args present) needs 'ffn_exp' for the expert hidden size")
        check_range("attention_chunk_size", self.attention_chunk_size, 1, 2**40)
        check_range("nope_layer_interval", self.nope_layer_interval, 1, 2**31)
        if self.quantization_args is not None:
            check_range("quantization_args.group_size", self.quantization_args.group_size, 1, 2**31)
        if self.lora_args is not None:
            check_range("lora_args.rank", self.lora_args.rank, 0, 2**31)
            check_range("lora_args.scale", self.lora_args.scale, -_MAX_FLOAT, _MAX_FLOAT)
        if self.vision_args is not None:
            _validate_vision(self.vision_args, bad)
        sizes = [("the dense feed-forward hidden size", self.dense_hidden_dim(), "ffn_dim_multiplier, multiple_of")]
        if self.moe_args is not None:
            sizes.append(
                (
                    "the expert hidden size",
                    self.moe_hidden_dim(),
                    "ffn_exp, ffn_dim_multiplier, moe_args.capacity_factor, multiple_of",
                )
            )
        for what, size, fields_ in sizes:
            if not 1 <= size <= _MAX_HIDDEN:
                raise bad(
                    f"{what} computed from dim={self.dim} and {fields_} is {size}; it must be in 1..{_MAX_HIDDEN}"
                )


# Upper limits far above any published Llama (405B: dim 16384, 126 layers, 128 heads; vocab 202048) that keep
# arithmetic on sizes sane; a value past them is a typo or a corrupted file, not a model.
_INT_LIMITS = {"dim": 2**20, "n_layers": 4096, "n_heads": 4096}
_MAX_DIM = 2**20
_MAX_HEAD_DIM = 2**14
_MAX_VOCAB = 2**24
_MAX_EXPERTS = 2**14
_MAX_HIDDEN = 2**24
_MAX_FLOAT = 1e30


def _validate_vision(v: VisionArgs, bad: Any) -> None:
    for name in ("dim", "n_layers", "n_heads", "output_dim"):
        if getattr(v, name) <= 0:
            raise bad(f"vision_args.{name} must be positive, got {getattr(v, name)}")
    sizes = (v.image_size.height, v.image_size.width, v.patch_size.height, v.patch_size.width)
    if min(sizes) <= 0:
        raise bad("vision_args.image_size and patch_size must be positive")
    if v.image_size.height % v.patch_size.height or v.image_size.width % v.patch_size.width:
        raise bad(f"vision_args.image_size {v.image_size} is not a whole number of patches {v.patch_size}")
    if v.image_size.height != v.image_size.width or v.patch_size.height != v.patch_size.width:
        raise bad("vision_args: tiles and patches must be square (Meta's encoder assumes it)")
    if v.dim % v.n_heads or (v.dim // v.n_heads) % 4:
        raise bad(f"vision_args.dim ({v.dim}) must split into n_heads ({v.n_heads}) heads of a size divisible by 4")
    grid = v.image_size.width // v.patch_size.width
    ratio = v.pixel_shuffle_ratio
    if not 0 < ratio <= 1 or abs(grid * ratio - round(grid * ratio)) > 1e-9:
        raise bad(
            f"vision_args.pixel_shuffle_ratio ({ratio}) must shrink the {grid}x{grid} patch grid to whole patches"
        )


_NESTED = {
    "moe_args": MoEArgs,
    "quantization_args": QuantizationArgs,
    "lora_args": LoRAArgs,
    "vision_args": VisionArgs,
    "vision_args.image_size": Size,
    "vision_args.patch_size": Size,
}


def _convert(name: str, value: Any, annotation: Any, source: str) -> Any:
    """Check one field's JSON value against its declared type (ints accepted for floats)."""
    if name in _NESTED:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ModelArgsError(f"{source}: field {name!r} must be an object, got {value!r}")
        nested_cls = _NESTED[name]
        nested_known = {f.name: f for f in fields(nested_cls)}
        unknown = sorted(set(value) - set(nested_known))
        if unknown:
            raise ModelArgsError(f"{source}: unknown field(s) {unknown} in {name!r}; known: {sorted(nested_known)}")
        missing = sorted(k for k, f in nested_known.items() if k not in value and _required(f))
        if missing:
            raise ModelArgsError(f"{source}: field(s) {missing} missing in {name!r}; add them to params.json")
        return nested_cls(**{k: _convert(f"{name}.{k}", v, nested_known[k].type, source) for k, v in value.items()})

    text = str(annotation)
    if value is None:
        if "None" in text:
            return None
        raise ModelArgsError(f"{source}: field {name!r} may not be null")
    if text.startswith("dict"):
        if not isinstance(value, dict):
            raise ModelArgsError(f"{source}: field {name!r} must be an object, got {value!r}")
        return value
    if text.startswith("bool"):
        if not isinstance(value, bool):
            raise ModelArgsError(f"{source}: field {name!r} must be true/false, got {value!r}")
        return value
    if text.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelArgsError(f"{source}: field {name!r} must be an integer, got {value!r}")
        return value
    if text.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ModelArgsError(f"{source}: field {name!r} must be a number, got {value!r}")
        return float(value)
    if text.startswith("str"):
        if not isinstance(value, str):
            raise ModelArgsError(f"{source}: field {name!r} must be a string, got {value!r}")
        return value
    return value


def _required(f: Any) -> bool:
    from dataclasses import MISSING

    return f.default is MISSING and f.default_factory is MISSING
