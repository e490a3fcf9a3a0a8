"""The Llama 3.2 Vision image encoder and projection (Meta's ``vision_model.vision_encoder.*`` / ``vision_projection``).

Each image arrives as ``max_num_chunks`` tiles (its ``rows x cols`` real tiles, then black padding tiles) and its
aspect ratio ``(rows, cols)``.  Every tile is cut into ``p x p`` patches embedded by one linear map (``conv1._linear``,
a stride-p convolution), a gated *tile* position embedding (``pre_tile_pos_embed``: one vector per tile of the
``rows x cols`` grid) is added, a class token is put *first*, and the per-patch position embedding is mixed with
a gated per-(tile, patch) one (``gated_positional_embedding``).  After ``ln_pre`` the tokens of each tile are
padded to a multiple of 8 and all tiles of an image run together through the *local* transformer (32 layers in
Meta's models) and, after ``ln_post`` and a second gated tile embedding, the *global* transformer (8 gated layers).
Attention spans the whole image; only pairs of two padding tokens are masked (Meta's rule: real tokens also
see the padding, so the padding tiles change real outputs and must be run exactly as the reference runs them).
The output per token is the global transformer's output followed by the local transformer's inputs to
layers 3, 7, 15, 23 and 30, interleaved feature by feature (Meta stacks them on a last axis and flattens), and
``vision_projection`` maps that to the text model's ``dim``.

Meta's encoder has dimensions that params.json does not carry (width 1280, 32 + 8 layers, patch 14, 16 heads,
the intermediate layers): :meth:`VisionDims.from_shapes` reads them from the checkpoint's tensor shapes, so tiny
test checkpoints can shrink the width.  The head count (16) and the intermediate layers are Meta's constants.

Model parallel like the reference: q/k/v, ``c_fc``, the patch embedding and the projection are column-parallel
(the projection's bias split with its outputs); ``wo`` and ``c_proj`` are row-parallel; norms, embeddings and
gates are replicated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workbench.errors import CheckpointError
from workbench.models.distributed import model_parallel_size
from workbench.models.layers import ColumnParallel, RowParallel, divide
from workbench.models.vision import EncoderMLP, LayerNorm, PatchEmbedding

VISION_HEADS = 16  # Meta's VisionEncoder default; not recoverable from tensor shapes
INTERMEDIATE_LAYERS = (3, 7, 15, 23, 30)  # Meta's return_intermediate: inputs of these local layers
ENCODER_PREFIX = "vision_model.vision_encoder."


@dataclass(frozen=True)
class VisionDims:
    """The 3.2 encoder's shape, as read from a checkpoint (see the module docstring)."""

    width: int
    patch: int
    grid: int  # patches per tile side
    max_tiles: int  # side of the tile-embedding tables (Meta: 4)
    n_local_layers: int
    n_global_layers: int
    mlp_hidden: int
    n_heads: int = VISION_HEADS
    intermediate: tuple[int, ...] = INTERMEDIATE_LAYERS

    @property
    def tile_size(self) -> int:
        return self.grid * self.patch

    @property
    def tokens_per_tile(self) -> int:
        """Encoder tokens of one tile: its patches plus the class token."""
        return self.grid * self.grid + 1

    @property
    def output_dim(self) -> int:
        """Features per token handed to the projection: the final output plus each intermediate one."""
        return self.width * (len(self.intermediate) + 1)

    @classmethod
    def from_shapes(
        cls, shapes: Mapping[str, Sequence[int]], *, n_shards: int = 1, source: str = "checkpoint"
    ) -> VisionDims:
        """Dimensions from ``{key: shape}`` of one saved shard (``n_shards`` shards in all), Meta's key names."""

        def shape(name: str) -> Sequence[int]:
            key = ENCODER_PREFIX + name
            if key not in shapes:
                raise CheckpointError(
                    f"{source}: the Llama 3.2 Vision key {key!r} is missing; is this a "
                    "Llama 3.2 Vision checkpoint (vision_chunk_size in params.json)?"
                )
            return tuple(shapes[key])

        width = shape("class_embedding")[0]
        patch_in = shape("conv1._linear.weight")[1]
        patch = math.isqrt(patch_in // 3)
        positions = shape("positional_embedding")[0] - 1
        grid = math.isqrt(positions)
        if patch * patch * 3 != patch_in or grid * grid != positions:
            raise CheckpointError(
                f"{source}: conv1._linear.weight {list(shape('conv1._linear.weight'))} / "
                f"positional_embedding {list(shape('positional_embedding'))} are not a square "
                "patch grid of 3-channel patches"
            )

        def count(stack: str) -> int:
            prefix = f"{ENCODER_PREFIX}{stack}.resblocks."
            return len({k[len(prefix) :].split(".")[0] for k in shapes if k.startswith(prefix)})

        dims = cls(
            width=width,
            patch=patch,
            grid=grid,
            max_tiles=shape("pre_tile_pos_embed.embedding")[0],
            n_local_layers=count("transformer"),
            n_global_layers=count("global_transformer"),
            mlp_hidden=shape("transformer.resblocks.0.mlp.c_fc.weight")[0] * n_shards,
        )
        if dims.n_local_layers <= max(dims.intermediate):
            raise CheckpointError(
                f"{source}: the vision encoder has {dims.n_local_layers} local layers, but Meta's encoder returns "
                f"the inputs of layers {list(dims.intermediate)}; it needs at least {max(dims.intermediate) + 1}"
            )
        if width % dims.n_heads:
            raise CheckpointError(f"{source}: vision width {width} is not divisible by Meta's {dims.n_heads} heads")
        projection_in = shapes.get("vision_model.vision_projection.weight", (0, dims.output_dim))[1]
        if projection_in != dims.output_dim:
            raise CheckpointError(
                f"{source}: vision_model.vision_projection.weight takes {projection_in} features, but width {width} "
                f"with {len(dims.intermediate)} intermediate layers gives {dims.output_dim}"
            )
        return dims


class ImageAttention(nn.Module):
    """Full attention over an image's tokens, no rotary embedding, no biases (Meta's ``ImageAttention``)."""

    def __init__(self, dim: int, n_heads: int, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.head_dim = dim // n_heads
        self.n_local_heads = divide(n_heads, model_parallel_size(), "vision heads")
        kw = dict(device=device, dtype=dtype)
        self.wq = ColumnParallel(dim, dim, gather_output=False, **kw)
        self.wk = ColumnParallel(dim, dim, gather_output=False, **kw)
        self.wv = ColumnParallel(dim, dim, gather_output=False, **kw)
        self.wo = RowParallel(dim, dim, **kw)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """``x`` [M, S, W], ``allowed`` bool [M, 1, S, S] -> [M, S, W]."""
        m, seq, _ = x.shape
        shape = (m, seq, self.n_local_heads, self.head_dim)
        q, k, v = (proj(x).view(shape).transpose(1, 2) for proj in (self.wq, self.wk, self.wv))  # [M, H, S, D]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # [M, H, S, D]
        return self.wo(out.transpose(1, 2).reshape(m, seq, -1))


class ImageBlock(nn.Module):
    """Pre-norm block; the global transformer's blocks scale both branches by tanh of a learned gate."""

    def __init__(self, dims: VisionDims, *, gated: bool, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.attn = ImageAttention(dims.width, dims.n_heads, **kw)
        self.ln_1 = LayerNorm(dims.width, **kw)
        self.mlp = EncoderMLP(dims.width, dims.mlp_hidden, **kw)
        self.ln_2 = LayerNorm(dims.width, **kw)
        self.gated = gated
        if gated:
            self.gate_attn = nn.Parameter(torch.empty(1, **kw), requires_grad=False)
            self.gate_ffn = nn.Parameter(torch.empty(1, **kw), requires_grad=False)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        attn = self.attn(self.ln_1(x), allowed)
        x = x + (self.gate_attn.tanh() * attn if self.gated else attn)
        mlp = self.mlp(self.ln_2(x))
        return x + (self.gate_ffn.tanh() * mlp if self.gated else mlp)


class ImageTransformer(nn.Module):
    def __init__(
        self, dims: VisionDims, n_layers: int, *, gated: bool, device: torch.device | str, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.resblocks = nn.ModuleList(
            ImageBlock(dims, gated=gated, device=device, dtype=dtype) for _ in range(n_layers)
        )

    def forward(
        self, x: torch.Tensor, allowed: torch.Tensor, keep: Sequence[int] = ()
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run the blocks; also return the *inputs* of the blocks whose index is in ``keep``."""
        kept = []
        for index, block in enumerate(self.resblocks):
            if index in keep:
                kept.append(x)
            x = block(x, allowed)
        return x, kept


class TilePositionEmbedding(nn.Module):
    """One learned vector per tile of the image's ``rows x cols`` grid, scaled by tanh(gate)."""

    def __init__(self, max_tiles: int, width: int, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.embedding = nn.Parameter(torch.empty(max_tiles, max_tiles, 1, width, **kw), requires_grad=False)
        self.gate = nn.Parameter(torch.empty(1, **kw), requires_grad=False)

    def forward(self, x: torch.Tensor, aspect: Sequence[tuple[int, int]]) -> torch.Tensor:
        """``x`` [M, C, S, W] + each image's tile vectors (none on padding tiles)."""
        add = torch.zeros(x.shape[0], x.shape[1], 1, x.shape[3], device=x.device, dtype=x.dtype)  # [M, C, 1, W]
        for m, (rows, cols) in enumerate(aspect):
            add[m, : rows * cols] = self.embedding[:rows, :cols].reshape(rows * cols, 1, -1)
        return x + add * self.gate.tanh()


def encoder_padding(tokens: int) -> int:
    """Padding tokens per tile: Meta pads to a multiple of 8, and always by at least one token."""
    return 8 - tokens % 8


def encoder_mask(
    aspect: Sequence[tuple[int, int]], chunks: int, tokens: int, padded: int, device: torch.device
) -> torch.Tensor:
    """bool [M, 1, C*S, C*S]: everything may attend to everything except padding to padding (Meta's rule)."""
    real = torch.zeros(len(aspect), chunks, padded, dtype=torch.bool, device=device)  # [M, C, S]
    for m, (rows, cols) in enumerate(aspect):
        real[m, : rows * cols, :tokens] = True
    real = real.view(len(aspect), -1)  # [M, C*S]
    return (real[:, :, None] | real[:, None, :])[:, None]  # [M, 1, C*S, C*S]


class VisionEncoder(nn.Module):
    def __init__(self, dims: VisionDims, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.dims = dims
        self.conv1 = PatchEmbedding(dims.patch, dims.width, **kw)
        self.class_embedding = nn.Parameter(torch.empty(dims.width, **kw), requires_grad=False)
        self.positional_embedding = nn.Parameter(torch.empty(dims.tokens_per_tile, dims.width, **kw), False)
        self.ln_post = LayerNorm(dims.width, **kw)
        self.ln_pre = LayerNorm(dims.width, **kw)
        self.transformer = ImageTransformer(dims, dims.n_local_layers, gated=False, **kw)
        self.global_transformer = ImageTransformer(dims, dims.n_global_layers, gated=True, **kw)
        self.pre_tile_pos_embed = TilePositionEmbedding(dims.max_tiles, dims.width, **kw)
        self.post_tile_pos_embed = TilePositionEmbedding(dims.max_tiles, dims.width, **kw)
        shape = (dims.max_tiles, dims.max_tiles, dims.tokens_per_tile, dims.width)
        self.gated_positional_embedding = nn.Parameter(torch.empty(shape, **kw), requires_grad=False)
        self.gated_positional_embedding_gate = nn.Parameter(torch.empty(1, **kw), requires_grad=False)

    def _position_embeddings(self, x: torch.Tensor, aspect: Sequence[tuple[int, int]]) -> torch.Tensor:
        gate = self.gated_positional_embedding_gate.tanh()
        x = x + self.positional_embedding * (1 - gate)  # [M, C, N, W]
        extra = torch.zeros_like(x)
        for m, (rows, cols) in enumerate(aspect):
            extra[m, : rows * cols] = self.gated_positional_embedding[:rows, :cols].reshape(rows * cols, *x.shape[2:])
        return x + extra * gate

    def forward(self, tiles: torch.Tensor, aspect: Sequence[tuple[int, int]]) -> torch.Tensor:
        """``tiles`` [M, C, 3, T, T] (each image's real tiles first, zeros after), ``aspect`` M x (rows, cols)
        -> [M, C, N, output_dim] with N = patches + 1 (class token first)."""
        m, chunks = tiles.shape[:2]
        dims = self.dims
        x = self.conv1(tiles.reshape(m * chunks, *tiles.shape[2:]).to(self.class_embedding.dtype))  # [M*C, P, W]
        x = self.pre_tile_pos_embed(x.view(m, chunks, -1, dims.width), aspect)  # [M, C, P, W]
        cls = self.class_embedding.expand(m, chunks, 1, -1)
        x = self._position_embeddings(torch.cat([cls, x], dim=2), aspect)  # [M, C, N, W]
        x = self.ln_pre(x)
        tokens = x.shape[2]
        pad = encoder_padding(tokens)
        x = F.pad(x, (0, 0, 0, pad))  # [M, C, S, W], S = N + pad
        allowed = encoder_mask(aspect, chunks, tokens, tokens + pad, x.device)
        x, kept = self.transformer(x.view(m, -1, dims.width), allowed, dims.intermediate)  # [M, C*S, W]
        x = self.post_tile_pos_embed(self.ln_post(x).view(m, chunks, -1, dims.width), aspect)
        x, _ = self.global_transformer(x.view(m, -1, dims.width), allowed)
        x = x.view(m, chunks, -1, dims.width)[:, :, :tokens]  # [M, C, N, W]
        inter = torch.stack(kept, dim=-1).view(m, chunks, tokens + pad, -1)[:, :, :tokens]  # [M, C, N, W*K]
        return torch.cat([x, inter], dim=-1)  # [M, C, N, W*(K+1)]


class CrossAttentionVision(nn.Module):
    """``vision_model``: the encoder and ``vision_projection`` (tokens -> the text model's dim)."""

    def __init__(
        self,
        dims: VisionDims,
        text_dim: int,
        *,
        device: torch.device | str = "meta",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.dims = dims
        self.vision_encoder = VisionEncoder(dims, device=device, dtype=dtype)
        self.vision_projection = ColumnParallel(
            dims.output_dim, text_dim, gather_output=True, bias=True, device=device, dtype=dtype
        )

    @torch.inference_mode()
    def forward(self, tiles: torch.Tensor, aspect: Sequence[tuple[int, int]]) -> torch.Tensor:
        """``tiles`` [M, C, 3, T, T], ``aspect`` M x (rows, cols) -> vision tokens [M, C, N, text dim]."""
        return self.vision_projection(self.vision_encoder(tiles, aspect))


def stack_tiles(images: Sequence[torch.Tensor], chunks: int) -> torch.Tensor:
    """Per image [n_i, 3, T, T] -> [M, chunks, 3, T, T], each image's tiles first and zero tiles after."""
    if not images:
        raise ValueError("stack_tiles needs at least one image")
    out = images[0].new_zeros(len(images), chunks, *images[0].shape[1:])
    for m, tiles in enumerate(images):
        out[m, : tiles.shape[0]] = tiles
    return out
