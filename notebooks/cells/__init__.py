"""The notebooks' cells, one module per notebook (``notebooks/build.py`` writes, runs and stores them).

A cell is ``(kind, source, *nbval tags)`` with kind ``"md"`` or ``"code"``."""
