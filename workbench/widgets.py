"""``from workbench.widgets import ChatPlayground, QuantizationToggle``: the notebook widgets, which live in
:mod:`workbench.notebook.widgets` (this module keeps the import path users and notebooks write)."""

from workbench.notebook.widgets import *  # noqa: F403
