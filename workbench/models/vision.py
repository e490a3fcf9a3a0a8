"""The Llama 4 vision encoder, adapter and projection (Meta's ``vision_embeddings.*`` / ``vision_projection``).

Each tile of an image (``[3, T, T]``, normalized) is cut into ``p x p`` patches, embedded by one linear
layer (``conv1._linear``: a convolution with stride = kernel is a linear map of the unfolded patches), a
class token is appended *after* the patches, learned position embeddings are added, and a pre-norm ViT
runs over the tile (full attention within a tile, 2-D rotary embeddings: half of every head rotates by
the patch's column, half by its row, the class token not at all; biases everywhere; GELU MLP).  The
class token is dropped, *pixel shuffle* folds each ``1/r x 1/r`` block of neighbouring patches into one
vector (``r = pixel_shuffle_ratio``), a two-layer GELU MLP (``vision_adapter``) maps it to
``output_dim``, and ``vision_projection`` maps it to the text model's ``dim``.  The result is one
embedding per ``<|patch|>`` token of the prompt.

Model parallel like the reference: q/k/v, the MLPs' first layers, the patch embedding and the projection
are column-parallel; ``wo`` and the MLPs' second layers are row-parallel; norms, embeddings and the
row-parallel biases are replicated.  Parameter names are Meta's, so checkpoint tensors load directly.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from workbench.models.args import ModelArgs, VisionArgs
from workbench.models.distributed import model_parallel_size
from workbench.models.layers import ColumnParallel, RowParallel, divide
from workbench.models.rope import apply_rope

ROPE_THETA = 10000.0
ENCODER_TILE_BATCH = 32  # tiles per encoder forward: bounds activation memory, the result is the same


class LayerNorm(nn.Module):
    def __init__(self, dim: int, *, device: torch.device | str, dtype: torch.dtype, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, device=device, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(dim, device=device, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class PatchEmbedding(nn.Module):
    """``conv1``: unfold ``p x p`` patches (channel-major, then rows, then columns) and apply ``_linear``."""

    def __init__(self, patch: int, dim: int, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.patch = patch
        self._linear = ColumnParallel(3 * patch * patch, dim, gather_output=True, device=device, dtype=dtype)

    def forward(self, tiles: torch.Tensor) -> torch.Tensor:
        patches = F.unfold(tiles, kernel_size=self.patch, stride=self.patch)  # [N, 3*p*p, P]
        return self._linear(patches.transpose(1, 2))  # [N, P, dim]


class EncoderAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.head_dim = dim // n_heads
        self.n_local_heads = divide(n_heads, model_parallel_size(), "vision n_heads")
        kw = dict(device=device, dtype=dtype, bias=True)
        self.wq = ColumnParallel(dim, dim, gather_output=False, **kw)
        self.wk = ColumnParallel(dim, dim, gather_output=False, **kw)
        self.wv = ColumnParallel(dim, dim, gather_output=False, **kw)
        self.wo = RowParallel(dim, dim, **kw)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        n, seq, _ = x.shape
        shape = (n, seq, self.n_local_heads, self.head_dim)
        q = apply_rope(self.wq(x).view(shape), cos, sin)  # [N, S, H, D]
        k = apply_rope(self.wk(x).view(shape), cos, sin)
        v = self.wv(x).view(shape)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # [N, H, S, D]
        return self.wo(out.transpose(1, 2).reshape(n, seq, -1))


class EncoderMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.c_fc = ColumnParallel(dim, hidden, gather_output=False, device=device, dtype=dtype, bias=True)
        self.c_proj = RowParallel(hidden, dim, device=device, dtype=dtype, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class EncoderBlock(nn.Module):
    def __init__(self, args: VisionArgs, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.attn = EncoderAttention(args.dim, args.n_heads, **kw)
        self.ln_1 = LayerNorm(args.dim, **kw)
        self.mlp = EncoderMLP(args.dim, int(args.mlp_ratio * args.dim), **kw)
        self.ln_2 = LayerNorm(args.dim, **kw)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cos, sin)
        return x + self.mlp(self.ln_2(x))


class EncoderLayers(nn.Module):
    def __init__(self, args: VisionArgs, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.resblocks = nn.ModuleList(EncoderBlock(args, device=device, dtype=dtype) for _ in range(args.n_layers))


def patch_rope_angles(grid: int, head_dim: int) -> torch.Tensor:
    """Rotary angles ``[grid*grid + 1, head_dim // 2]`` (float32) for the patches in row-major order plus the
    trailing class token: the first half of each head's pairs turn with the patch column + 1, the second
    half with its row + 1, at frequencies ``theta^(-4i/head_dim)``; the class token is not rotated."""
    quarter = head_dim // 4
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim // 2, 2)[:quarter].float() / (head_dim // 2)))
    index = torch.arange(grid * grid)
    cols = (index % grid + 1).float()[:, None]  # [P, 1]
    rows = (index // grid + 1).float()[:, None]
    angles = torch.cat([cols * inv_freq, rows * inv_freq], dim=-1)  # [P, D/2]
    return torch.cat([angles, torch.zeros(1, 2 * quarter)], dim=0)  # [P + 1, D/2]


class VisionEncoder(nn.Module):
    def __init__(self, args: VisionArgs, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.grid = args.image_size.width // args.patch_size.width
        self.conv1 = PatchEmbedding(args.patch_size.width, args.dim, **kw)
        self.class_embedding = nn.Parameter(torch.empty(args.dim, **kw), requires_grad=False)
        self.positional_embedding_vlm = nn.Parameter(torch.empty(self.grid * self.grid + 1, args.dim, **kw), False)
        self.ln_pre = LayerNorm(args.dim, **kw)
        self.ln_post = LayerNorm(args.dim, **kw)
        self.transformer = EncoderLayers(args, **kw)
        angles = patch_rope_angles(self.grid, args.dim // args.n_heads)
        self._rope = (torch.cos(angles), torch.sin(angles))  # float32 [P + 1, D/2]

    def forward(self, tiles: torch.Tensor) -> torch.Tensor:
        """``tiles`` [N, 3, T, T] -> patch features [N, P, dim] (class token dropped)."""
        x = self.conv1(tiles.to(self.class_embedding.dtype))  # [N, P, dim]
        cls = self.class_embedding.expand(x.shape[0], 1, -1)
        x = torch.cat([x, cls], dim=1) + self.positional_embedding_vlm  # [N, P + 1, dim]
        x = self.ln_pre(x)
        cos, sin = (t.to(x.device)[None] for t in self._rope)  # [1, P + 1, D/2]
        for block in self.transformer.resblocks:
            x = block(x, cos, sin)
        return self.ln_post(x)[:, :-1]


def pixel_shuffle(x: torch.Tensor, ratio: float) -> torch.Tensor:
    """[N, P, C] on a square patch grid -> [N, P * r^2, C / r^2]: each (1/r x 1/r) block of neighbouring
    patches becomes one vector (Meta's two-step shuffle: fold along one grid axis, transpose, fold again)."""
    n, patches, channels = x.shape
    side = math.isqrt(patches)
    grid = x.reshape(n, side, side, channels)  # [N, A, B, C]
    folded = grid.view(n, side, int(side * ratio), int(channels / ratio)).transpose(1, 2)  # [N, B*r, A, C/r]
    folded = folded.reshape(n, int(side * ratio), int(side * ratio), int(channels / (ratio * ratio)))
    return folded.transpose(1, 2).reshape(n, -1, folded.shape[-1])  # [N, P*r^2, C/r^2]


class AdapterMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.c_fc = ColumnParallel(dim, hidden, gather_output=False, device=device, dtype=dtype)
        self.c_proj = RowParallel(hidden, hidden, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.c_proj(F.gelu(self.c_fc(x))))


class VisionAdapter(nn.Module):
    def __init__(self, args: VisionArgs, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.ratio = args.pixel_shuffle_ratio
        folded = int(args.dim // (self.ratio**2))
        self.mlp = AdapterMLP(folded, args.output_dim, device=device, dtype=dtype)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.mlp(pixel_shuffle(features, self.ratio))  # [N, tokens_per_tile, output_dim]


class VisionEmbeddings(nn.Module):
    def __init__(self, args: VisionArgs, *, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.vision_encoder = VisionEncoder(args, device=device, dtype=dtype)
        self.vision_adapter = VisionAdapter(args, device=device, dtype=dtype)

    def forward(self, tiles: torch.Tensor) -> torch.Tensor:
        return self.vision_adapter(self.vision_encoder(tiles))


class VisionModel(nn.Module):
    """``vision_embeddings`` + ``vision_projection``: tiles -> one text-model embedding per ``<|patch|>`` token."""

    def __init__(
        self, args: ModelArgs, *, device: torch.device | str = "meta", dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        assert args.vision_args is not None
        self.vision_embeddings = VisionEmbeddings(args.vision_args, device=device, dtype=dtype)
        self.vision_projection = ColumnParallel(
            args.vision_args.output_dim, args.dim, gather_output=True, device=device, dtype=dtype
        )

    def forward(self, tiles: torch.Tensor) -> torch.Tensor:
        return encode_tiles(self.vision_embeddings, self.vision_projection, tiles)


@torch.inference_mode()
def encode_tiles(embeddings: nn.Module, projection: nn.Module, tiles: torch.Tensor) -> torch.Tensor:
    """``tiles`` [N, 3, T, T] -> [N, tokens_per_tile, dim], at most ENCODER_TILE_BATCH tiles per forward (tiles
    never attend to each other, so the split changes nothing but peak memory)."""
    return torch.cat([projection(embeddings(chunk)) for chunk in tiles.split(ENCODER_TILE_BATCH)])
