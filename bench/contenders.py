"""The peers workbench is measured against, built on the same weights: Meta's reference generator
(``llama-models`` 0.3.0, run on CPU) and Hugging Face transformers ``generate`` on the weights
converted to ``LlamaForCausalLM``.  Every contender runs greedy with stop tokens ignored, so all do
the same work: ``len(prompt)`` prefill tokens and exactly ``max_tokens`` new tokens per prompt.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from workbench.models.args import ModelArgs


def _params(ckpt: Path) -> dict:
    return json.loads((Path(ckpt) / "params.json").read_text())


def _state(ckpt: Path) -> dict[str, torch.Tensor]:
    shard = sorted(Path(ckpt).glob("consolidated.*.pth"))[0]
    state = torch.load(shard, map_location="cpu", weights_only=True)
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


# --------------------------------------------------------------------------------------------- reference
def _stub_attribute(attr: str) -> type:
    """Any name the reference imports from torchvision is a placeholder class; dunder lookups (``__file__``,
    ``__path__``: torch.compile scans every module's ``__file__``) stay missing, as on a real module."""
    if attr.startswith("__"):
        raise AttributeError(attr)
    return type(attr, (), {})


def _torchvision_stub() -> None:
    """The reference generator module imports torchvision for images; text-only use never calls it."""
    import importlib.util
    import sys
    import types

    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        return
    names = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")
    mods = {name: types.ModuleType(name) for name in names}
    for mod in mods.values():
        mod.__getattr__ = _stub_attribute  # type: ignore[method-assign]
    mods["torchvision"].transforms = mods["torchvision.transforms"]  # type: ignore[attr-defined]
    mods["torchvision.transforms"].functional = mods["torchvision.transforms.functional"]  # type: ignore[attr-defined]
    sys.modules.update(mods)


class _NoStopTokenizer:
    """Stands in for the reference tokenizer: no stop tokens (everyone generates max_tokens)."""

    stop_tokens: list[int] = [-1]
    pad_id = -1

    def decode(self, ids: Sequence[int]) -> str:
        return ""


def reference_model(ckpt: Path, max_batch_size: int, max_seq_len: int) -> torch.nn.Module:
    """Meta's reference Transformer in float32 on CPU (``.cuda()`` neutralised while it is built)."""
    from workbench.models.distributed import ensure_model_parallel

    ensure_model_parallel(1)
    params = _params(ckpt)
    if params.get("moe_args") is not None:
        from llama_models.llama4.args import ModelArgs as RefArgs
        from llama_models.llama4.model import Transformer
    else:
        from llama_models.llama3.args import ModelArgs as RefArgs
        from llama_models.llama3.model import Transformer
    args = RefArgs(**{**params, "max_seq_len": max_seq_len, "max_batch_size": max_batch_size})
    original_cuda = torch.Tensor.cuda
    try:
        torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
        model = Transformer(args)
    finally:
        torch.Tensor.cuda = original_cuda  # type: ignore[method-assign]
    model.load_state_dict(_state(ckpt), strict=True)
    return model.eval().requires_grad_(False)


def reference_generate(model: torch.nn.Module, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Meta's generator on one batch (``len(prompts) <= max_batch_size``), greedy, no stop tokens.

    Llama 3 runs ``llama_models.llama3.generation.Llama3.generate`` itself.  Llama 4's generator
    allocates its token buffers with ``device="cuda"`` literals, so for Llama 4 the same algorithm
    (prompts left-aligned in one buffer, one ``forward(tokens[:, prev:cur], prev)`` per position from
    the shortest prompt's end, argmax, prompt tokens kept where they exist) drives the reference model.
    """
    from llama_models.llama4.model import Transformer as Llama4

    if not isinstance(model, Llama4):
        _torchvision_stub()
        from llama_models.llama3.chat_format import LLMInput
        from llama_models.llama3.generation import Llama3

        gen = Llama3.__new__(Llama3)
        gen.args, gen.model, gen.tokenizer = model.params, model, _NoStopTokenizer()
        out: list[list[int]] = [[] for _ in prompts]
        inputs = [LLMInput(tokens=p) for p in prompts]
        for results in gen.generate(inputs, temperature=0.0, max_gen_len=max_tokens):
            for r in results:
                if not r.ignore_token and len(out[r.batch_idx]) < max_tokens:
                    out[r.batch_idx].append(r.token)
            if all(len(o) >= max_tokens for o in out):
                break
        return out
    from llama_models.llama4.datatypes import TransformerInput

    bsz, lengths = len(prompts), [len(p) for p in prompts]
    total = max(lengths) + max_tokens
    tokens = torch.full((bsz, total), -1, dtype=torch.long)
    for k, p in enumerate(prompts):
        tokens[k, : len(p)] = torch.tensor(p)
    prompt_mask = tokens != -1
    prev = 0
    with torch.inference_mode():
        for cur in range(min(lengths), total):
            step = TransformerInput(tokens=tokens[:, prev:cur].clamp(min=0), tokens_position=prev)
            logits = model.forward(step).logits
            nxt = torch.argmax(logits[:, -1], dim=-1)
            tokens[:, cur] = torch.where(prompt_mask[:, cur], tokens[:, cur], nxt)
            prev = cur
    return [tokens[k, lengths[k] : lengths[k] + max_tokens].tolist() for k in range(bsz)]


# --------------------------------------------------------------------------------------------- transformers
def _rotary_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Meta's interleaved rotary pairs -> HF's half-split layout (rows of each head reordered)."""
    out_dim, in_dim = w.shape
    return w.view(n_heads, out_dim // n_heads // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def hf_llama(ckpt: Path, max_seq_len: int) -> torch.nn.Module:
    """The Llama 3 checkpoint as transformers' ``LlamaForCausalLM`` (float32, default attention)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    params = _params(ckpt)
    args = ModelArgs.from_dict(dict(params), source=str(ckpt))
    config = LlamaConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.dim,
        intermediate_size=args.dense_hidden_dim(),
        num_hidden_layers=args.n_layers,
        num_attention_heads=args.n_heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.rope_head_dim,
        rms_norm_eps=args.norm_eps,
        max_position_embeddings=max(max_seq_len, 16384),
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_id=None,
        pad_token_id=0,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": args.rope_theta,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    state = _state(ckpt)
    hf: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": state["tok_embeddings.weight"],
        "model.norm.weight": state["norm.weight"],
        "lm_head.weight": state["output.weight"],
    }
    for i in range(args.n_layers):
        p, q = f"layers.{i}.", f"model.layers.{i}."
        hf[q + "self_attn.q_proj.weight"] = _rotary_permute(state[p + "attention.wq.weight"], args.n_heads)
        hf[q + "self_attn.k_proj.weight"] = _rotary_permute(state[p + "attention.wk.weight"], args.kv_heads)
        hf[q + "self_attn.v_proj.weight"] = state[p + "attention.wv.weight"]
        hf[q + "self_attn.o_proj.weight"] = state[p + "attention.wo.weight"]
        hf[q + "mlp.gate_proj.weight"] = state[p + "feed_forward.w1.weight"]
        hf[q + "mlp.up_proj.weight"] = state[p + "feed_forward.w3.weight"]
        hf[q + "mlp.down_proj.weight"] = state[p + "feed_forward.w2.weight"]
        hf[q + "input_layernorm.weight"] = state[p + "attention_norm.weight"]
        hf[q + "post_attention_layernorm.weight"] = state[p + "ffn_norm.weight"]
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(hf, strict=True, assign=True)
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # rebuild buffers off the meta device
    return model.to(torch.float32).eval().requires_grad_(False)


def hf_generate(model: torch.nn.Module, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """transformers ``generate`` on one left-padded batch, greedy, exactly ``max_tokens`` new tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for k, p in enumerate(prompts):
        ids[k, width - len(p) :] = torch.tensor(p)
        mask[k, width - len(p) :] = 1
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
    return out[:, width:].tolist()
