"""The engine layer: :class:`Engine`, the façade over one loaded model (validate, encode, hand to the
runner, build results), and what it is built from — chat rendering and reply parsing (:mod:`.chat`),
prompt checks (:mod:`.prompts`), result building (:mod:`.outputs`), one-call-at-a-time and
cancellation (:mod:`.calls`), decode compilation (:mod:`.compile`)."""

from workbench.engine.engine import Engine
from workbench.engine.introspection import model_label

__all__ = ["Engine", "model_label"]
