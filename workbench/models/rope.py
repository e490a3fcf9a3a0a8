"""Rotary position embeddings (interleaved pairs, as in Meta's checkpoints), with Llama 3.1/4 scaling."""

from __future__ import annotations

import math

import torch


def rope_frequencies(head_dim: int, theta: float, scaling: tuple[float, float, float] | None) -> torch.Tensor:
    """Inverse frequencies ``[head_dim // 2]`` (float32), optionally with Llama 3.1-style scaling.

    Scaling keeps high frequencies (short wavelengths), divides low frequencies by ``scale_factor``
    and blends smoothly in between; the original context length is 8192 tokens.
    """
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))  # [D/2]
    if scaling is None:
        return freqs
    scale_factor, low_freq_factor, high_freq_factor = scaling
    old_context_len = 8192.0
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / freqs
    if low_freq_factor == high_freq_factor:
        smooth = torch.zeros_like(freqs)
    else:
        smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * freqs / scale_factor + smooth * freqs
    return torch.where(
        wavelen < high_freq_wavelen, freqs, torch.where(wavelen > low_freq_wavelen, freqs / scale_factor, blended)
    )


def rope_tables(freqs: torch.Tensor, max_positions: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``[max_positions, head_dim // 2]`` in float32."""
    t = torch.arange(max_positions, dtype=torch.float32)
    angles = torch.outer(t, freqs)  # [P, D/2]
    return torch.cos(angles).to(device), torch.sin(angles).to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of ``x`` [B, T, H, D] by angles given as ``cos/sin`` [B, T, D/2]."""
    pairs = x.float().unflatten(-1, (-1, 2))  # [B, T, H, D/2, 2]
    even, odd = pairs[..., 0], pairs[..., 1]
    c, s = cos[:, :, None, :], sin[:, :, None, :]  # [B, T, 1, D/2]
    rotated = torch.stack((even * c - odd * s, even * s + odd * c), dim=-1)  # [B, T, H, D/2, 2]
    return rotated.flatten(-2).type_as(x)
