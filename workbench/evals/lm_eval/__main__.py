"""``python -m workbench.evals.lm_eval ...``: lm-eval's own command line with the workbench model.

Everything is lm-eval's (``lm-eval run --help``); this wrapper registers ``WorkbenchLM`` first and fills in
three defaults unless they are given: ``--model workbench``; ``--batch_size auto`` (the engine's batches:
lm-eval's default of 1 would run requests one by one); ``--device auto`` (workbench picks CUDA when a GPU
is visible, else the CPU; lm-eval's own default is ``cuda:0`` even on a machine without one).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from workbench.evals.lm_eval import MODEL_NAME, register


def with_defaults(argv: Sequence[str]) -> list[str]:
    """``argv`` (without the program name) with ``--model workbench``, ``--batch_size auto`` and ``--device auto``
    added when absent; subcommands other than ``run`` (``ls``, ``validate``) pass through untouched."""
    args = list(argv)
    if args and args[0] in ("ls", "validate", "-h", "--help"):
        return args
    if args and args[0] == "run":
        args = args[1:]
    given = {a.split("=", 1)[0] for a in args if a.startswith("-")}
    if not given & {"--model", "-M"}:
        args = ["--model", MODEL_NAME, *args]
    if not given & {"--batch_size", "-b"}:
        args = [*args, "--batch_size", "auto"]
    if "--device" not in given:
        args = [*args, "--device", "auto"]
    return ["run", *args]


def main(argv: Sequence[str] | None = None) -> None:
    from lm_eval.__main__ import cli_evaluate

    register()
    sys.argv = [sys.argv[0], *with_defaults(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()


if __name__ == "__main__":
    main()
