"""The server's lifecycle: uvicorn on a background thread of the kernel, started and stopped from a cell.

Why a thread and not a process: the model is loaded once, in the kernel, and a second process would need a
second copy.  The socket is bound here, before the thread starts, so a busy port fails in the calling cell
(with the fix), ``port=0`` gets a free port whose number is known at once, and ``stop()`` closes it.
"""

from __future__ import annotations

import html
import ipaddress
import logging
import socket
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from workbench import runs
from workbench.batches import BatchService
from workbench.batches.routes import DEFAULT_MAX_FILE
from workbench.engine import Engine
from workbench.errors import ConfigError
from workbench.reports import short_path
from workbench.runs import call_keywords
from workbench.runtime.settings import default_model_name
from workbench.session import current, load

from .app import DEFAULT_MAX_BODY, Context, build_app
from .bulk import BulkBackend
from .gather import Gatherer

log = logging.getLogger("workbench.serve")


class ServeError(ConfigError):
    """The server could not start (a busy port, a bad host, the ``serve`` extra missing)."""


def served_model_id(engine: Engine) -> str:
    """The id clients send as ``model``: the engine's model id; for the embedded default its short name
    (``workbench-demo-llama4``); else ``workbench/<checkpoint folder>``."""
    if getattr(engine, "model_id", None):
        return str(engine.model_id)
    settings = getattr(engine, "settings", None)
    default = default_model_name(settings)
    if default:
        return default.split()[0]
    folder = getattr(getattr(settings, "checkpoint_dir", None), "name", None)
    return f"workbench/{folder or engine.family}"


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Server:
    """An OpenAI-compatible endpoint serving one engine; build it with :func:`workbench.serve`.

    ``url`` is the base URL for clients (``OpenAI(base_url=srv.url, api_key=...)``); ``stop()`` (or leaving
    a ``with`` block) frees the port.  The notebook card shows the URL, the model, requests served and the
    engine's tokens/s while serving.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        api_key: str | None = None,
        window_s: float = 0.02,
        max_body_bytes: int = DEFAULT_MAX_BODY,
        model_id: str | None = None,
        start_timeout_s: float = 30.0,
        data_dir: str | Path | None = None,
        batch_rows: int | None = None,
        max_file_bytes: int = DEFAULT_MAX_FILE,
        run: str | None = None,
    ) -> None:
        try:
            import uvicorn
        except ImportError:
            raise ServeError(
                "serving needs the 'serve' extra: pip install 'workbench[serve]' (fastapi, uvicorn)"
            ) from None
        if api_key is not None and (not isinstance(api_key, str) or not api_key):
            raise ServeError("api_key must be a non-empty string (or None for no authentication)")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ServeError(f"port must be an integer in 0..65535 (0: any free port), got {port!r}")
        if not is_loopback(host) and api_key is None:
            message = (
                f"workbench.serve: binding {host!r}, which other machines can reach, WITHOUT an api_key: anyone "
                "on the network can use this model; pass api_key=... or host='127.0.0.1'"
            )
            warnings.warn(message, UserWarning, stacklevel=3)
            log.warning(message)
        self.engine = engine
        self.host = host
        self.model = model_id or served_model_id(engine)
        self.api_key = api_key
        self._sock = self._bind(host, port)
        self.port = self._sock.getsockname()[1]
        self.started_at = time.time()
        self.run = run
        self._gatherer = Gatherer(engine, window_s=window_s, keywords=call_keywords(run) or None)
        ctx = Context(
            engine,
            self._gatherer,
            self.model,
            api_key,
            max_body_bytes,
            int(self.started_at),
            max_file_bytes=max_file_bytes,
        )
        self._bulk = BulkBackend(ctx, bulk_rows=batch_rows)
        self.batches = BatchService(self._bulk, model=self.model, data_dir=data_dir)
        ctx.batches = self.batches
        config = uvicorn.Config(
            build_app(ctx), log_level="warning", lifespan="off", access_log=False, timeout_graceful_shutdown=2
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"workbench-serve-{self.port}", daemon=True)
        self._error: BaseException | None = None
        self._thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self._uvicorn.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._uvicorn.started:
            self.stop()
            raise ServeError(f"the server did not start on {self.url} ({self._error or 'timed out'})")
        self.batches.start()  # runs new batches, and picks up the unfinished ones of this model

    @staticmethod
    def _bind(host: str, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise ServeError(
                f"cannot bind {host}:{port} ({exc.strerror or exc}); is another server running there? "
                "Stop it, or pass port=0 for any free port"
            ) from None
        sock.listen(128)
        sock.set_inheritable(True)
        return sock

    def _run(self) -> None:
        try:
            self._uvicorn.run(sockets=[self._sock])
        except BaseException as exc:  # noqa: BLE001 - reported by the starting cell / stop()
            self._error = exc
            log.exception("workbench.serve: the server thread failed")

    # --------------------------------------------------------------------------------------- public
    @property
    def url(self) -> str:
        """The base URL for OpenAI clients (ends in ``/v1``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._uvicorn.should_exit

    @property
    def stats(self) -> Any:
        """Requests answered, rows, engine batches, tokens generated and the engine seconds spent."""
        return self._gatherer.stats

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving and free the port: open streams end at their next token, queued requests get 503s."""
        self._uvicorn.should_exit = True
        self._bulk.close()  # a batch chunk in flight is abandoned: the batch resumes at the next start
        self.batches.stop(timeout=0)
        self._gatherer.stop(timeout)
        self.batches.stop(timeout)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        try:
            self._sock.close()
        except OSError:
            pass

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        s = self.stats
        state = "serving" if self.running else "stopped"
        return (
            f"Server({self.url!r}, model={self.model!r}, {state}, requests={s.requests}, "
            f"tokens={s.tokens}, tokens/s={s.tokens_per_second:.1f})"
        )

    def _repr_html_(self) -> str:
        s = self.stats
        state = "serving" if self.running else "stopped"
        rows = [
            ("URL", f"<code>{html.escape(self.url)}</code>"),
            ("model", html.escape(self.model)),
            ("state", state),
            ("auth", "Bearer api_key" if self.api_key else "none" if is_loopback(self.host) else "NONE: open to all"),
            ("requests served", str(s.requests)),
            ("engine calls", f"{s.batches} (most rows in flight at once: {s.largest_batch})"),
            ("tokens generated", str(s.tokens)),
            ("tokens/s (engine time)", f"{s.tokens_per_second:.1f}"),
        ]
        if self.run is not None:
            where = html.escape(short_path(runs.path()))
            rows.append(("run store", f"run {html.escape(self.run)} in <code>{where}</code>"))
        body = "".join(
            f"<tr><th style='text-align:left'>{k}</th><td style='text-align:left'>{v}</td></tr>" for k, v in rows
        )
        return f"<div><b>workbench.serve</b><table>{body}</table></div>"


def serve(
    engine: Engine | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    **options: Any,
) -> Server:
    """Serve ``engine`` as an OpenAI-compatible endpoint from a background thread; returns at once.

    engine: None serves the kernel's current engine (``workbench.current()``), loading the embedded default
        when none is loaded.
    host: 127.0.0.1 (default) serves this machine only; another address without ``api_key`` warns loudly.
    port: 0 picks a free port (``srv.port``, ``srv.url``).
    api_key: when given, every request needs ``Authorization: Bearer <api_key>``.
    options: ``window_s`` (unused: requests go straight into the engine's running batch), ``max_body_bytes``
        (16 MiB), ``model_id`` (the id clients send; default the engine's), ``data_dir`` (where the Batch API
        keeps files and batches; default ``$WORKBENCH_DATA_DIR`` or ``~/.local/share/workbench``), ``batch_rows``
        (the most rows a batch puts in one engine call; default 8 x max_batch_size), ``max_file_bytes``
        (uploads, 200 MiB), ``run`` (a run-store name: every served row is remembered under it and a request the
        store already answered — by this server or any run with the same engine — is answered from there;
        batches keep their own run per batch).

    Requests that arrive together share engine batches; answers equal the same in-process calls (omitted
    sampling fields take the engine's defaults: greedy).  A notebook cell may use the engine meanwhile: the
    calls take turns.
    """
    if engine is None:
        engine = current() or load()
    return Server(engine, host=host, port=port, api_key=api_key, **options)
