"""The ``workbench.load`` options of the command lines (``python -m workbench.serve`` and ``... batch``)."""

from __future__ import annotations

import argparse
from typing import Any

from workbench.session import load


def add_load_options(p: argparse.ArgumentParser) -> None:
    """The ``workbench.load`` options (shared with ``python -m workbench batch``)."""
    p.add_argument("--checkpoint", help="checkpoint folder or checkpoints.toml entry (default: the embedded demo)")
    p.add_argument("--model", help="model descriptor (selects the prompt format), e.g. Llama3.2-3B-Instruct")
    load_opts = p.add_argument_group("load options (as workbench.load)")
    load_opts.add_argument("--device")
    load_opts.add_argument("--dtype")
    load_opts.add_argument("--max-batch-size", type=int)
    load_opts.add_argument("--max-seq-len", type=int)
    load_opts.add_argument("--model-parallel-size", type=int)
    load_opts.add_argument("--quantization", choices=["bf16", "fp8_mixed", "int4_mixed"])
    load_opts.add_argument("--compile", action="store_true", help="compile the decode step (torch.compile)")


def load_engine(args: argparse.Namespace) -> Any:
    """``workbench.load`` with the parsed load options."""
    return load(
        args.checkpoint,
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        max_batch_size=args.max_batch_size,
        max_seq_len=args.max_seq_len,
        model_parallel_size=args.model_parallel_size,
        quantization=args.quantization,
        compile=args.compile,
    )
