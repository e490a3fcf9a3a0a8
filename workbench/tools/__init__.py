"""The tool loop: the model calls Python functions (and, when allowed, runs code) until it answers.

``run(engine, messages, tools=[functions...])`` lets the model call tools until it answers: each turn is one
chat completion; every tool call in the reply is run and answered with a tool (``ipython``) message; the loop
ends at a reply without calls or after ``max_turns`` replies.  ``engine`` is anything with the one chat method
``batch_chat_completion`` (an Engine, a Ray pool, a scripted stand-in, an adapter over a remote endpoint).
``run_batch`` runs many dialogs, each moving on its own (its tools run while the others decode, every dialog's
turn joins the engine's running batch); ``as_completed`` yields them as they end; ``run_turns`` is the
turn-synchronous loop (same transcripts).  Modules: :mod:`.flow` (the per-dialog loop), :mod:`.loop` (a dialog's
turns, each dialog with its own tools; the evals harness drives the same :func:`complete_turn`),
:mod:`.toolbox` (running calls; the code interpreter), :mod:`.sandbox` (the guarded subprocess tree model-written
code runs in).
"""

from workbench.tools.flow import as_completed, run, run_batch
from workbench.tools.loop import Dialog, complete_turn, later_choice, run_turns
from workbench.tools.toolbox import CodeInterpreter, Toolbox

__all__ = [
    "CodeInterpreter",
    "Dialog",
    "Toolbox",
    "as_completed",
    "complete_turn",
    "later_choice",
    "run",
    "run_batch",
    "run_turns",
]
