"""The engine layer: :class:`Engine`, the façade over one loaded model (validate, encode, hand to the
runner, build results), and what it is built from — the interfaces it is written against (:mod:`.interfaces`:
the runner, the formatter/tokenizer pair), the chat layer's pure ``prepare`` / ``finish`` (:mod:`.chat`), one
row accumulator under every way of generating (:mod:`.accumulator`), prompt checks (:mod:`.prompts`),
one-call-at-a-time and cancellation (:mod:`.calls`), decode compilation (:mod:`.compile`)."""

from workbench.engine.engine import Engine
from workbench.engine.introspection import model_label
from workbench.generation import SamplingParams

__all__ = ["Engine", "SamplingParams", "model_label"]
