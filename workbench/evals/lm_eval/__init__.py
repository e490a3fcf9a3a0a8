"""lm-evaluation-harness on a workbench engine: ``WorkbenchLM``, registered with lm-eval as ``"workbench"``.

::

    import lm_eval
    from workbench.evals.lm_eval import WorkbenchLM

    lm = WorkbenchLM(engine)                               # or WorkbenchLM(checkpoint=..., model=...)
    results = lm_eval.simple_evaluate(model=lm, tasks=["arc_easy"], apply_chat_template=True)

    python -m workbench.evals.lm_eval --model_args checkpoint=/ckpts/Llama3.1-8B-Instruct,model=Llama3.1-8B-Instruct \\
        --tasks arc_easy --apply_chat_template

Needs the ``lm-eval`` extra (``pip install -e ".[lm-eval]"``).
"""

from __future__ import annotations

from workbench.evals.lm_eval.model import (
    RequestTooLongError,
    TaskOptionError,
    WorkbenchLM,
    parse_batch_size,
)

MODEL_NAME = "workbench"


def register() -> None:
    """Register :class:`WorkbenchLM` with lm-eval's model registry as ``"workbench"`` (idempotent).

    lm-eval fills its registry with its own models only when the registry is empty, so they are
    imported first: registering ours into an empty registry would hide ``hf`` and the rest.
    """
    import lm_eval.models  # noqa: F401  (registers lm-eval's own models)
    from lm_eval.api.registry import register_model

    register_model(MODEL_NAME)(WorkbenchLM)


register()

__all__ = ["MODEL_NAME", "RequestTooLongError", "TaskOptionError", "WorkbenchLM", "parse_batch_size", "register"]
