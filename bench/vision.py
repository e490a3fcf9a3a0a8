"""Image preprocessing and vision encoding: workbench vs Meta's reference (llama-models 0.3.0), side by side.

1. Preprocessing of typical photo sizes at Scout's tile size (336, up to 16 tiles + thumbnail): ours (PIL + torch)
   vs the reference's ``VariableSizeImageTransform`` + ``ResizeNormalizeImageTransform`` (run on the tests'
   torchvision stand-in, which calls the same PIL resize torchvision does), best of N, with the max abs
   difference of the tiles.
2. Encoding 32 tiles with the tiny test checkpoint's vision encoder + projection: ours vs the reference module
   (float32, CPU).

Prints a table and one JSON line.  Usage: ``python bench/vision.py [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()

    import torchvision_standin
    from test_vision_preprocess import pattern_image

    torchvision_standin.install()
    from llama_models.llama4.preprocess import ResizeNormalizeImageTransform, VariableSizeImageTransform

    from workbench.vision.preprocess import prepare_image

    def reference(image):
        tiles, _ = VariableSizeImageTransform(336)(image, max_num_chunks=16)
        if tiles.shape[0] > 1:
            tiles = torch.cat([tiles, ResizeNormalizeImageTransform(336, 336)(image)[None]])
        return tiles

    rows = []
    for size in [(640, 480), (1024, 768), (1920, 1080), (300, 2000)]:
        image = pattern_image(*size)
        ours_t = best_of(lambda image=image: prepare_image(image, 336, 16), opts.repeats)
        ref_t = best_of(lambda image=image: reference(image), opts.repeats)
        diff = (prepare_image(image, 336, 16).tiles - reference(image)).abs().max().item()
        rows.append(
            {
                "size": f"{size[0]}x{size[1]}",
                "tiles": prepare_image(image, 336, 16).tiles.shape[0],
                "ours_ms": ours_t * 1e3,
                "reference_ms": ref_t * 1e3,
                "speedup": ref_t / ours_t,
                "max_abs_diff": diff,
            }
        )

    from test_vision_model import ours as our_model
    from test_vision_model import reference as reference_model

    from workbench.checkpoints.factory import TINY_LLAMA4_VISION, write_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        folder = write_checkpoint(Path(tmp), TINY_LLAMA4_VISION)
        ref, model = reference_model(folder), our_model(folder)
        tiles = torch.rand(32, 3, 56, 56) * 2 - 1
        model.encode_images(tiles)  # load the vision weights outside the timing

        def ref_encode():
            with torch.inference_mode():
                return ref.vision_projection(
                    ref.vision_embeddings.vision_adapter(ref.vision_embeddings.vision_encoder(tiles[:, None]))
                )

        enc_ours = best_of(lambda: model.encode_images(tiles), opts.repeats)
        enc_ref = best_of(ref_encode, opts.repeats)
        enc_diff = (model.encode_images(tiles) - ref_encode()).abs().max().item()

    print(f"{'image':>10} {'tiles':>5} {'ours ms':>9} {'reference ms':>13} {'speed-up':>9} {'max |diff|':>11}")
    for r in rows:
        print(
            f"{r['size']:>10} {r['tiles']:>5} {r['ours_ms']:9.1f} {r['reference_ms']:13.1f} {r['speedup']:8.2f}x "
            f"{r['max_abs_diff']:11.1e}"
        )
    print(
        f"encode 32 tiny tiles: ours {enc_ours * 1e3:.1f} ms, reference {enc_ref * 1e3:.1f} ms "
        f"({enc_ref / enc_ours:.2f}x), max |diff| {enc_diff:.1e}"
    )
    print(
        json.dumps(
            {
                "bench": "vision",
                "preprocess": rows,
                "encode_tiny_32_tiles": {
                    "ours_ms": enc_ours * 1e3,
                    "reference_ms": enc_ref * 1e3,
                    "max_abs_diff": enc_diff,
                },
            }
        )
    )


if __name__ == "__main__":
    main()
