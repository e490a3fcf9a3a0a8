"""Exception types raised by workbench.

Every error a user can cause derives from :class:`WorkbenchError`, so a notebook can catch them all
in one ``except``; each message names the problem and the fix.  The subclasses also derive from the
matching builtin (``ValueError``, ``FileNotFoundError``, ...) so generic handlers keep working.
"""

from __future__ import annotations


class WorkbenchError(Exception):
    """Base class of every error workbench raises on purpose."""


class CheckpointError(WorkbenchError, ValueError):
    """A checkpoint folder is incomplete or inconsistent (missing shard, bad params.json, bad keys)."""


class MissingCheckpointFileError(CheckpointError, FileNotFoundError):
    """A file the checkpoint needs (params.json, consolidated.NN.pth, tokenizer.model) is absent."""


class ModelArgsError(CheckpointError):
    """params.json has an unknown, missing or ill-typed field."""


class VocabMismatchError(CheckpointError):
    """The checkpoint's vocabulary size disagrees with the tokenizer."""


class PromptTooLongError(WorkbenchError, ValueError):
    """A prompt does not fit the engine's ``max_seq_len``."""


class SamplingError(WorkbenchError, ValueError):
    """A sampling keyword (temperature, top_p, top_k, max_tokens, logprobs, seed, stop) is invalid."""


class InputError(WorkbenchError, ValueError):
    """A request is malformed (bad token ids, wrong content type, bad message)."""


class ToolCallParseError(WorkbenchError, ValueError):
    """The model wrote a tool call that could not be parsed."""


class ToolError(WorkbenchError, RuntimeError):
    """A tool definition is invalid or a tool could not be run."""


class ConfigError(WorkbenchError, ValueError):
    """A setting (argument, environment variable, checkpoints.toml entry) is invalid."""


class QuantizationError(ConfigError):
    """A quantization mode is unknown or cannot be applied to this model/device (a ConfigError too)."""


class WorkerError(WorkbenchError, RuntimeError):
    """A model-parallel worker process died or failed; the engine must be reloaded."""


class ImageError(InputError):
    """An image in a message cannot be used: unreadable, or the model has no vision encoder."""


class GenerationCancelled(WorkbenchError):
    """``engine.cancel()`` stopped a running call; ``partial`` holds the results generated so far.

    Rows that had not finished carry ``stop_reason="cancelled"``.  The engine stays usable.
    """

    def __init__(self, message: str, partial: list | None = None) -> None:
        super().__init__(message)
        self.partial = list(partial or [])
        self.transcripts: list = []  # set by the tool loop: every dialog so far, the cut replies included


class FormatError(WorkbenchError, ValueError):
    """A ``response_format`` (JSON schema, grammar, regex) or a constrained tool-call request is invalid."""


class EngineBusyError(WorkbenchError, RuntimeError):
    """A call would interleave with an unfinished call on the same engine in the same thread (e.g. an open stream)."""


class InsufficientMemoryError(ConfigError):
    """The requested weights + KV cache cannot fit the device's memory (checked before allocating)."""


class CompileError(WorkbenchError, RuntimeError):
    """``torch.compile`` could not compile the decode step; the engine keeps decoding eagerly."""


class StoreError(ConfigError):
    """The run store file cannot be used: it is not a workbench run store, or a newer workbench wrote it.

    The message names the file and the fix (another ``$WORKBENCH_STORE``, or upgrading workbench).  Failures
    to *write* a usable store (a full disk, a read-only file) are never raised into a call: they warn once
    (:class:`StoreWarning`) and the call returns all its results.
    """


class StoreWarning(UserWarning):
    """The run store could not be read or written; results are computed and returned but not stored."""


class ScoreWarning(UserWarning):
    """``wb.runs.score``'s function raised on some rows: those rows got no score, the others were stored."""


class MissingExtraError(WorkbenchError, ImportError):
    """An optional extra (Ray, lm-eval, Inspect, BFCL...) that a notebook or feature needs is not installed.

    In a notebook it shows as its one-line message, without a traceback (IPython prints what
    ``_render_traceback_`` returns), and like any error it stops "Run all" at that cell.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]
