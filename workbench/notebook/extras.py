"""Which optional extra each notebook needs, and the check its first cell runs.

A user who installed the README's quick start (``.[lab]``) and opens the scale-out or evaluations
notebook should learn at the first cell, in one line, what to install — not from a traceback twenty
cells in.  :func:`require` checks that the extra's modules can be imported (without importing them) and
raises :class:`~workbench.errors.MissingExtraError`, which IPython shows as its message alone.
"""

from __future__ import annotations

import importlib.util

from workbench.errors import MissingExtraError

# extra -> (the modules it provides, the one pip line that installs it from a source checkout)
EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "lab": (("ipykernel", "matplotlib", "pandas", "ipywidgets"), 'pip install -e ".[lab]"'),
    "cluster": (("ray",), 'pip install -e ".[cluster]"'),
    "evals": (
        ("lm_eval", "inspect_ai", "bfcl_eval", "filelock"),
        'pip install -e ".[evals]" && pip install --no-deps "bfcl-eval==2026.3.23"',
    ),
}


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here."""
    if extra not in EXTRAS:
        raise MissingExtraError(f"unknown extra {extra!r}; known extras: {', '.join(EXTRAS)}")
    return [name for name in EXTRAS[extra][0] if _absent(name)]


def require(extra: str) -> None:
    """Raise :class:`MissingExtraError` naming the pip line when ``extra`` is not installed; else nothing."""
    missing = missing_modules(extra)
    if missing:
        install = EXTRAS[extra][1]
        raise MissingExtraError(
            f"this notebook needs the {extra} extra ({', '.join(missing)} not installed): {install} — then "
            "restart the kernel and run the notebook again"
        )


def _absent(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):  # a parent package missing, or a module stubbed out as None
        return True
