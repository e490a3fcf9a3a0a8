"""Managing the loaded model, beside answering requests: re-loading under another quantization mode, the vision
encoder, compiled decode steps, CUDA graphs, and closing.  :class:`ModelManagement` is a part of
:class:`~.engine.Engine` (its methods are the Engine's); it holds the settings that survive a re-load."""

from __future__ import annotations

from typing import Any

from workbench.engine.compile import compile_and_warm_up, use_cuda_graphs
from workbench.errors import ConfigError, ImageError, WorkbenchError
from workbench.models.llama32_vision import is_cross_attention_vision
from workbench.progress import progress_bar
from workbench.quantization import check_supported
from workbench.runtime.settings import check_flag


class ModelManagement:
    """The Engine's model-management methods (see the module docstring).  The Engine sets the attributes they
    use: ``_runner``, ``_loop``, ``aio``, ``settings``, ``args``, ``tokenizer``, ``formatter``, ``_vision_eager``,
    ``compile_seconds``, ``cuda_graphs``."""

    # ----------------------------------------------------------------------------- images
    def load_vision(self) -> None:
        """Load the vision encoder now (it is otherwise loaded at the first image) and keep it loaded across
        ``set_quantization``.  Raises ImageError for models without one."""
        if self.args.vision_args is None and not is_cross_attention_vision(self.args):
            raise ImageError(self.formatter.chat.no_images_reason or "this model has no vision encoder")
        self._runner.load_vision()
        self._vision_eager = True

    def compile_decode(self) -> float:
        """Run every decode step through ``torch.compile`` from now on, and compile it now.

        Why: eager decode pays Python and one kernel launch per small op for every token; the compiled
        step fuses the elementwise work around the matmuls.  Tokens are the eager path's (tests hold
        it to that).  Compiles on a short warm-up (three rows: with and without a position mask) and
        returns the seconds it took, also in ``info()["compile_seconds"]``; the batch width and the
        attended span vary without recompiling.  Kept across ``set_quantization``.
        """
        self._refuse_if_invariant("compile_decode()")
        with self._loop.exclusive(drain=True):
            self.compile_seconds = compile_and_warm_up(self._runner, self.tokenizer.bos_id)
        return self.compile_seconds

    def use_cuda_graphs(self) -> dict[str, Any]:
        """Decode through CUDA graphs from now on: one per (batch, span) bucket, captured now.

        Why: an eager GPU decode step is bound by launching small kernels from Python, not by reading the
        weights; a graph replays the whole step as one launch.  A graph needs fixed shapes, so each step is
        padded to its bucket and keys past each row's position are masked (the same tokens as eager).  On a
        CPU the fixed-shape steps run uncaptured.  Returns ``info()["cuda_graphs"]`` (graph count, capture
        seconds, buckets).  Kept across ``set_quantization`` (captured again).
        """
        self._refuse_if_invariant("use_cuda_graphs()")
        with self._loop.exclusive(drain=True):
            self.cuda_graphs = use_cuda_graphs(self._runner)
        return self.cuda_graphs

    # ----------------------------------------------------------------------------- quantization
    def set_quantization(self, mode: str | None, *, progress: bool | None = None) -> None:
        """Re-load the weights from the checkpoint under another quantization mode (None | "bf16" |
        "fp8_mixed" | "int4_mixed").  The old model is freed first, so only one copy is resident.

        The mode is checked against the device *before* anything is freed: a bad mode raises
        QuantizationError and leaves the current model loaded.  ``progress``: a bar for the re-load
        (None: shown once it takes a couple of seconds; True/False: always/never).
        """
        mode = check_supported(mode, self.settings.device)
        settings = self.settings.with_quantization(mode)
        if settings == self.settings:
            return
        with self._loop.exclusive(drain=True):
            with progress_bar(1, desc=f"quantization -> {mode or 'none'}", unit="reload", progress=progress) as bar:
                self._runner.reload(settings)
                bar.update(1)
            self.settings = settings
            if self._vision_eager:
                self._runner.load_vision()
            if self.compile_seconds is not None:
                self.compile_seconds = compile_and_warm_up(self._runner, self.tokenizer.bos_id)
            if self.cuda_graphs is not None:
                self.cuda_graphs = use_cuda_graphs(self._runner)

    # ----------------------------------------------------------------------------- batch invariance
    @property
    def batch_invariant(self) -> bool:
        """Whether the batch-invariant kernels run (``wb.load(..., batch_invariant=True)``): then a row's logits,
        log-probabilities and tokens are bit-identical to the same row alone, cold, at batch 1."""
        return self.settings.batch_invariant

    @batch_invariant.setter
    def batch_invariant(self, enabled: bool) -> None:
        """Switch the mode in place: the weights are re-loaded from the checkpoint with the other kernels (as
        ``set_quantization`` does); a setting that cannot hold the guarantee raises and leaves the old model."""
        enabled = check_flag(enabled, "batch_invariant", "engine.batch_invariant")
        if enabled == self.settings.batch_invariant:
            return
        if enabled and self.compile_seconds is not None:
            raise ConfigError(
                "engine.batch_invariant = True: this engine compiles its decode step (compile=True), "
                "which the batch-invariant kernels cannot run; reload without compile=True"
            )
        if enabled and self.cuda_graphs is not None:
            raise ConfigError(
                "engine.batch_invariant = True: this engine decodes through CUDA graphs "
                "(cuda_graphs=True), which the batch-invariant kernels cannot run; reload without them"
            )
        settings = self.settings.with_batch_invariant(enabled)
        with self._loop.exclusive(drain=True):
            try:
                self._runner.reload(settings)
            except ConfigError:
                self._runner.reload(self.settings)  # the refused kernels: back to the model that ran
                raise
            self.settings = settings
            if self._vision_eager and not enabled:
                self._runner.load_vision()

    def _refuse_if_invariant(self, what: str) -> None:
        if self.settings.batch_invariant:
            raise ConfigError(
                f"{what} (compile=True / cuda_graphs=True) cannot run with batch_invariant=True: a compiled step "
                "fuses the ops and a CUDA graph needs fixed shapes; set engine.batch_invariant = False first"
            )

    @property
    def closed(self) -> bool:
        """True after :meth:`close` (or ``workbench.unload()``)."""
        return isinstance(self._runner, ClosedRunner)

    def close(self) -> None:
        """Free the model, cache and any worker processes (the engine is unusable afterwards).

        Closing twice is harmless.  The engine's loop stops first: every call still waiting (in any thread, a
        stream included) raises a WorkbenchError saying the engine was unloaded, and no thread is left.
        """
        if self.closed:
            return
        self._loop.close()
        self.aio.close()
        runner, self._runner = self._runner, ClosedRunner()
        if hasattr(runner, "close"):
            runner.close()


class ClosedRunner:
    """What a closed engine runs on: every use says how to get a working engine again."""

    def __getattr__(self, name: str) -> Any:
        raise WorkbenchError("this engine was unloaded; call workbench.load(...) again")
