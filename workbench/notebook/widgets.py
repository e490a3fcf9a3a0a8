"""ipywidgets front-ends for notebooks: the chat playground and the quantization toggle.

They only use the public engine API (streaming chat, ``engine.cancel()``, the tool loop's
:class:`~workbench.tools.Toolbox`), so everything they do can also be done in plain cells.

Why a worker thread: a Jupyter kernel handles widget events (a Stop click) only while no handler
is running.  So a Send click starts the turn on a thread and returns at once; the kernel stays free
to receive Stop, which calls ``engine.cancel()`` — generation ends at the next decode step.
Programmatic use (tests, scripted notebook cells) calls :meth:`ChatPlayground.send`, which runs the
turn in the calling thread unless ``wait=False``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as widgets

from workbench.engine import Engine
from workbench.engine.chat import TextDelta, ToolCallDelta
from workbench.errors import GenerationCancelled, PromptTooLongError, WorkbenchError
from workbench.formats import coerce_tools
from workbench.notebook import display
from workbench.session import current
from workbench.tools import CodeInterpreter, Toolbox
from workbench.types import ChatCompletion, Message, message_text

try:  # the input box with Enter-to-send needs a few lines of browser code: anywidget ships them
    import anywidget
    import traitlets
except ImportError:  # pragma: no cover - anywidget is a dependency; a plain Textarea still works
    anywidget = None

STREAM_REFRESH_S = 0.1  # redraw the transcript at most this often while tokens stream in


def render_message(message: Message) -> str:
    """One transcript line in plain text: role, content, and tool calls as ``name(args)``."""
    return message_text(message)


if anywidget is not None:

    class PromptBox(anywidget.AnyWidget):
        """A text area where Enter sends (``submits`` counts them) and Shift+Enter adds a newline."""

        _esm = """
        function render({ model, el }) {
          const ta = document.createElement("textarea");
          ta.className = "wb-prompt-box";
          ta.rows = 2;
          ta.style.cssText = "width:100%;box-sizing:border-box;font:inherit;padding:4px;resize:vertical";
          const sync = () => {
            if (ta.value !== model.get("value")) ta.value = model.get("value");
            ta.disabled = model.get("disabled");
            ta.placeholder = model.get("placeholder");
          };
          el.setAttribute("data-lm-suppress-shortcuts", "true");  // JupyterLab: keys stay in the box
          ta.addEventListener("input", () => { model.set("value", ta.value); model.save_changes(); });
          ta.addEventListener("keydown", (e) => {
            e.stopPropagation();
            if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
              e.preventDefault();
              if (ta.disabled) return;
              model.set("value", ta.value);
              model.set("submits", model.get("submits") + 1);
              model.save_changes();
            }
          });
          model.on("change:value", sync);
          model.on("change:disabled", sync);
          sync();
          el.appendChild(ta);
        }
        export default { render };
        """
        value = traitlets.Unicode("").tag(sync=True)
        submits = traitlets.Int(0).tag(sync=True)
        disabled = traitlets.Bool(False).tag(sync=True)
        placeholder = traitlets.Unicode("").tag(sync=True)


def _prompt_box(placeholder: str) -> Any:
    if anywidget is not None:
        return PromptBox(placeholder=placeholder, layout=widgets.Layout(width="100%"))
    return widgets.Textarea(placeholder=placeholder, layout=widgets.Layout(width="100%"))


class ChatPlayground:
    """A streaming multi-turn chat with tools, for experiments in a notebook.

    Tokens stream into an HTML transcript (tool calls and their results as linked cards, each reply
    with a toggle showing its exact prompt).  Send (or Enter) runs one turn of the tool loop; Stop
    cancels generation within one decode step; Clear resets the dialog.  A failed turn is rolled
    back (the typed text comes back into the box) and the error shown.  Older turns are dropped from
    what is sent when the dialog would not fit ``max_seq_len`` (system prompt and tools kept), with a
    note in the transcript.

    ``engine``: default the loaded one (``workbench.current()``).  ``tools``: callables or tool
    definitions (see ``Engine.chat_completion``).  ``max_turns``: model replies per Send (a reply
    that calls tools is followed by another).  Sampling defaults can be changed in the controls.
    """

    def __init__(
        self,
        engine: Engine | None = None,
        tools: Sequence[Any] = (),
        *,
        system: str | None = None,
        max_turns: int = 4,
        tool_choice: str = "auto",
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        code_interpreter: bool | CodeInterpreter = False,
    ) -> None:
        if engine is None:
            engine = current()
            if engine is None:
                raise WorkbenchError("ChatPlayground needs an engine: run engine = workbench.load(...) first")
        self.engine = engine
        self.toolbox = Toolbox.create(list(tools), code_interpreter)
        self.max_turns = max_turns
        self.messages: list[Message] = [Message(role="system", content=system)] if system else []
        self.first_sent = len(self.messages)  # messages[first_sent:] (plus system ones) are sent to the model
        self.prompts: dict[int, list[int]] = {}  # message index of a reply -> the prompt ids that produced it
        self.error: str | None = None
        self.busy = False
        self._stop = False
        self._thread: threading.Thread | None = None
        self._streaming: str | None = None
        self._last_draw = 0.0
        self._build(tool_choice, max_tokens, temperature, top_p)
        self._draw()

    # ------------------------------------------------------------------------------------------ layout
    def _build(self, tool_choice: str, max_tokens: int, temperature: float, top_p: float) -> None:
        names = [d.tool_name for d in self.toolbox.definitions]
        self.header = widgets.HTML(self._header_html())
        self.transcript = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.transcript.add_class("wb-transcript")
        self.input = _prompt_box("Ask something… (Enter sends, Shift+Enter adds a line)")
        self.send_button = widgets.Button(
            description="Send", button_style="primary", icon="paper-plane", layout=widgets.Layout(width="90px")
        )
        self.stop_button = widgets.Button(
            description="Stop", button_style="danger", icon="stop", disabled=True, layout=widgets.Layout(width="90px")
        )
        self.clear_button = widgets.Button(description="Clear", icon="trash", layout=widgets.Layout(width="90px"))
        self.status = widgets.HTML("ready")
        self.tools_select = widgets.SelectMultiple(
            options=names,
            value=tuple(names),
            rows=min(max(len(names), 1), 4),
            description="tools",
            style={"description_width": "initial"},
        )
        self.tool_choice = widgets.Dropdown(
            options=["auto", "required", "none", *names],
            value=tool_choice,
            description="tool_choice",
            style={"description_width": "initial"},
            layout=widgets.Layout(width="220px"),
        )
        style = {"description_width": "initial"}
        self.temperature = widgets.FloatSlider(
            value=temperature, min=0.0, max=2.0, step=0.05, description="temperature", style=style
        )
        self.top_p = widgets.FloatSlider(value=top_p, min=0.05, max=1.0, step=0.05, description="top_p", style=style)
        self.max_tokens = widgets.IntSlider(
            value=max_tokens, min=1, max=max(self.engine.max_seq_len - 1, 1), description="max_tokens", style=style
        )
        self.send_button.on_click(lambda _b: self.send(wait=False))
        self.stop_button.on_click(lambda _b: self.stop())
        self.clear_button.on_click(lambda _b: self.clear())
        if anywidget is not None:
            self.input.observe(lambda _change: self.send(wait=False), names="submits")
        controls = widgets.HBox(
            [
                self.tools_select,
                widgets.VBox([self.tool_choice, self.max_tokens]),
                widgets.VBox([self.temperature, self.top_p]),
            ]
        )
        scroller = widgets.Box(
            [self.transcript],
            layout=widgets.Layout(
                max_height="420px",
                overflow="auto",
                display="flex",
                flex_flow="column-reverse",  # stays at the bottom
                border="1px solid #ddd",
                padding="4px",
            ),
        )
        buttons = widgets.HBox([self.send_button, self.stop_button, self.clear_button, self.status])
        self.controls = widgets.Accordion([controls], titles=("controls",))
        self.widget = widgets.VBox([self.header, scroller, self.input, buttons, self.controls])
        self.widget.add_class("wb-playground")
        # stable CSS hooks (styling, and the real-browser test finds the parts by them)
        for part, name in (
            (self.input, "wb-prompt"),
            (self.send_button, "wb-send"),
            (self.stop_button, "wb-stop"),
            (self.clear_button, "wb-clear"),
            (self.status, "wb-status"),
            (self.controls, "wb-controls"),
            (self.tools_select, "wb-tools"),
            (self.tool_choice, "wb-tool-choice"),
            (self.temperature, "wb-temperature"),
            (self.top_p, "wb-top-p"),
            (self.max_tokens, "wb-max-tokens"),
        ):
            part.add_class(name)

    def _header_html(self) -> str:
        engine = self.engine
        fmt = engine.formatter
        quant = engine.settings.quantization or "none"
        return (
            f'<div style="font-size:13px"><b>Chat playground</b> · {display.esc(display.model_label(engine))} · '
            f"prompt format {display.esc(engine.family)} (calls as {fmt.default_tool_prompt_format}) · "
            f"quantization {display.esc(quant)} · max_seq_len {engine.max_seq_len}</div>"
        )

    # ------------------------------------------------------------------------------------------ actions
    def send(self, text: str | None = None, *, wait: bool = True) -> list[Message]:
        """Send ``text`` (default: the box's content) and run one turn of the tool loop.

        ``wait=True`` runs the turn here and returns its new messages; ``wait=False`` (the Send button,
        Enter) runs it on a worker thread and returns at once (:meth:`wait` joins it).
        """
        text = self.input.value if text is None else text
        if self.busy or not text.strip():
            return []
        self.busy, self._stop = True, False
        self.input.value = ""
        self._set_running(True)
        if wait:
            return self._turn(text)
        self._thread = threading.Thread(target=self._turn, args=(text,), name="workbench-playground", daemon=True)
        self._thread.start()
        return []

    submit = send  # the earlier ChatPanel name

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a turn started with ``wait=False`` to finish."""
        if self._thread is not None:
            self._thread.join(timeout)

    def stop(self) -> None:
        """Stop the running turn: generation ends at the next decode step, no further tool rounds run."""
        self._stop = True
        if self.busy:
            self.engine.cancel()
            self.status.value = "stopping…"

    def clear(self) -> None:
        """Forget the dialog (the system prompt stays)."""
        if self.busy:
            self.stop()
            self.wait(30)
        self.messages = self.messages[:1] if self.messages and self.messages[0].role == "system" else []
        self.first_sent = len(self.messages)
        self.prompts, self.error, self._streaming = {}, None, None
        self.status.value = "cleared"
        self._draw()

    # ------------------------------------------------------------------------------------------ the turn
    def _sampling(self) -> dict[str, Any]:
        return {
            "max_tokens": int(self.max_tokens.value),
            "temperature": float(self.temperature.value),
            "top_p": float(self.top_p.value),
        }

    def _tool_defs(self) -> list[Any]:
        chosen = set(self.tools_select.value)
        return [d for d in self.toolbox.definitions if d.tool_name in chosen]

    def _sent(self) -> list[Message]:
        system = [m for m in self.messages[: self.first_sent] if m.role == "system"]
        return system + self.messages[self.first_sent :]

    def _prompt(self, tools: list[Any], choice: str, max_tokens: int) -> list[int]:
        """The prompt ids of the dialog, dropping the oldest turns until the reply fits ``max_seq_len``."""
        while True:
            ids = self.engine.formatter.encode_dialog(self._sent(), tools=tools or None, tool_choice=choice)
            if len(ids) + min(max_tokens, 16) <= self.engine.max_seq_len:
                return ids
            nxt = self._next_turn_start()
            if nxt is None:
                raise PromptTooLongError(
                    f"the latest message alone needs {len(ids)} prompt tokens (with the system prompt and tools), "
                    f"more than max_seq_len={self.engine.max_seq_len} allows; shorten it, offer fewer tools, or load "
                    "with a larger max_seq_len"
                )
            self.first_sent = nxt

    def _next_turn_start(self) -> int | None:
        """Index of the user message that starts the second-oldest sent turn (None: only one turn left)."""
        users = [i for i in range(self.first_sent, len(self.messages)) if self.messages[i].role == "user"]
        later = [i for i in users if i > self.first_sent]
        return later[0] if later else None

    def _turn(self, text: str) -> list[Message]:
        snapshot = (list(self.messages), self.first_sent, dict(self.prompts))
        start = time.perf_counter()
        self.error = None
        self.messages.append(Message(role="user", content=text))
        before = len(self.messages) - 1
        tools = self._tool_defs()
        choice = self.tool_choice.value
        sampling = self._sampling()
        ids: list[int] = []
        try:
            for round_ in range(self.max_turns):
                if self._stop:
                    break
                ids = self._prompt(
                    tools, choice if round_ == 0 else ("auto" if choice != "none" else "none"), sampling["max_tokens"]
                )
                reply = self._stream_reply(ids, tools, choice if round_ == 0 else "auto", sampling)
                self.prompts[len(self.messages)] = ids
                self.messages.append(reply.message)
                self._draw(force=True)
                if not reply.message.tool_calls or choice == "none" or self._stop:
                    break
                for call in reply.message.tool_calls:
                    self.status.value = f"⏳ running tool {display.esc(call.tool_name)}…"
                    self.messages.append(self.toolbox.execute(call))
                    self._draw(force=True)
            took = time.perf_counter() - start
            self.status.value = f"■ stopped after {took:.1f} s" if self._stop else f"✓ done in {took:.1f} s"
        except GenerationCancelled as exc:
            partial = exc.partial[0] if exc.partial else None
            text_so_far = partial.text if partial is not None else (self._streaming or "")
            self.prompts[len(self.messages)] = ids
            parsed = self.engine.formatter.decode_assistant(text_so_far)  # the same cleanup as a finished reply
            content = parsed.content if isinstance(parsed.content, str) and not parsed.tool_calls else text_so_far
            self.messages.append(Message(role="assistant", content=content.strip(), stop_reason="cancelled"))
            self.status.value = f"■ stopped after {len(partial.tokens) if partial else 0} tokens"
        except Exception as exc:  # roll back to before the turn; the panel stays usable
            self.messages, self.first_sent, self.prompts = snapshot
            self.input.value = text
            self.error = f"{type(exc).__name__}: {exc}"
            self.status.value = '<span style="color:#c62828">error — the turn was undone (see above)</span>'
        finally:
            self._streaming = None
            self.busy = False
            self._set_running(False)
            self._draw(force=True)
        return self.messages[before:] if self.error is None else []

    def _stream_reply(self, ids: list[int], tools: list[Any], choice: str, sampling: dict[str, Any]) -> ChatCompletion:
        self._streaming = ""
        generated = 0
        reply: ChatCompletion | None = None
        stream = self.engine.chat_completion(
            self._sent(), tools=tools or None, tool_choice=choice, stream=True, **sampling
        )
        for item in stream:
            if self._stop:  # Stop landed before this call started: cancel it now
                self.engine.cancel()
            if isinstance(item, ChatCompletion):
                reply = item
            elif (
                isinstance(item, (TextDelta, ToolCallDelta))
                and item.text
                and (not isinstance(item, ToolCallDelta) or item.parse_status == "in_progress")
            ):
                self._streaming += item.text
                generated += 1
                if not self._stop:  # "stopping…" stays up until the cancellation lands
                    self.status.value = f"⏳ generating… ({len(ids)} prompt tokens)"
                self._draw()
        self._streaming = None
        assert reply is not None
        return reply

    # ------------------------------------------------------------------------------------------ drawing
    def _set_running(self, running: bool) -> None:
        self.send_button.disabled = running
        self.input.disabled = running
        self.stop_button.disabled = not running
        if running:
            self.status.value = "⏳ waiting for the model…"

    def _extras(self) -> dict[int, str]:
        """Per reply: a toggle with its exact prompt (special tokens dimmed) and token count."""
        extras: dict[int, str] = {}
        for index, ids in self.prompts.items():
            text = self.engine.tokenizer.decode(ids)
            body = display.text_with_specials(text)
            extras[index] = (
                f'<details class="wb-prompt"><summary style="color:#777;font-size:11px;cursor:pointer">'
                f'prompt · {len(ids)} tokens</summary><div style="white-space:pre-wrap;'
                f'font-family:monospace;font-size:11px;background:#fafafa;padding:4px">{body}</div>'
                "</details>"
            )
        return extras

    def transcript_html(self) -> str:
        parts = []
        if self.first_sent > 0 and any(m.role != "system" for m in self.messages[: self.first_sent]):
            dropped = sum(m.role != "system" for m in self.messages[: self.first_sent])
            parts.append(
                f'<div class="wb-trim-note" style="color:#8d6e63;font-size:12px;margin:2px 0">✂ {dropped} '
                f"older message(s) are no longer sent to the model, so the dialog fits "
                f"max_seq_len={self.engine.max_seq_len} (system prompt and tools kept)</div>"
            )
        extras = self._extras()
        parts.append(display.messages_html(self.messages, extras))
        if self._streaming is not None:
            parts.append(display.message_html(Message(role="assistant", content=self._streaming + "▌")))
        if self.error:
            parts.append(
                f'<div class="wb-error" style="color:#c62828;border:1px solid #ef9a9a;padding:4px;'
                f'border-radius:4px">⚠ {display.esc(self.error)}</div>'
            )
        if not self.messages and self._streaming is None and not self.error:
            parts.append('<div style="color:#999">No messages yet.</div>')
        return "".join(parts)

    def transcript_text(self) -> str:
        """The dialog as plain text (the notebook's fallback where widgets are not shown)."""
        lines = [render_message(m) for m in self.messages] or ["(no messages yet)"]
        if self.error:
            lines.append(f"error: {self.error}")
        return "Chat playground — " + display.model_label(self.engine) + "\n" + "\n".join(lines)

    def _draw(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self._last_draw < STREAM_REFRESH_S:
            return
        self._last_draw = now
        self.transcript.value = self.transcript_html()

    # ------------------------------------------------------------------------------------------ display
    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.transcript_text()
        bundle["text/html"] = self.header.value + self.transcript_html()
        return bundle


ChatPanel = ChatPlayground  # the earlier name


class QuantizationToggle:
    """A dropdown that re-loads the engine under another quantization mode.

    While the weights re-load the dropdown is disabled and says "loading…"; afterwards the status shows
    the mode, the weights' size and the time taken.  A failure is shown in the cell and the dropdown
    returns to the mode still loaded.
    """

    LABELS = {None: "none (full precision)", "bf16": "bf16", "fp8_mixed": "fp8_mixed", "int4_mixed": "int4_mixed"}

    def __init__(
        self,
        engine: Engine | None = None,
        modes: Sequence[str | None] = (None, "bf16", "fp8_mixed", "int4_mixed"),
        on_change: Callable[[str | None], None] | None = None,
    ) -> None:
        if engine is None:
            engine = current()
        self.engine = engine
        self.on_change = on_change
        self.dropdown = widgets.Dropdown(
            options=[(self.LABELS.get(m, str(m)), m) for m in modes],
            value=engine.settings.quantization,
            description="quantization",
            style={"description_width": "initial"},
            layout=widgets.Layout(width="320px"),
        )
        self.status = widgets.HTML(self._summary())
        self.widget = widgets.HBox([self.dropdown, self.status])
        self._reverting = False
        self.dropdown.observe(self._changed, names="value")

    def _summary(self, seconds: float | None = None) -> str:
        memory = self.engine.memory()
        took = f" · re-loaded in {seconds:.1f} s" if seconds is not None else ""
        mode = self.engine.settings.quantization or "none"
        return f"mode <b>{mode}</b> · weights {display.human_bytes(memory['weights_bytes'])}{took}"

    def select(self, mode: str | None) -> None:
        """Switch to ``mode`` as if it were picked in the dropdown."""
        self.dropdown.value = mode

    def _changed(self, change: dict[str, Any]) -> None:
        if self._reverting:
            return
        old, new = change["old"], change["new"]
        self.dropdown.disabled = True
        self.status.value = f"⏳ loading… (re-loading the weights as {new or 'none'})"
        start = time.perf_counter()
        try:
            self.engine.set_quantization(new, progress=False)
        except Exception as exc:
            self._reverting = True
            try:
                self.dropdown.value = old
            finally:
                self._reverting = False
            self.status.value = (
                f'<span style="color:#c62828">could not switch to {display.esc(new)}: '
                f"{display.esc(type(exc).__name__)}: {display.esc(exc)}</span> — still "
                f"{display.esc(old or 'none')}"
            )
            return
        finally:
            self.dropdown.disabled = False
        self.status.value = self._summary(time.perf_counter() - start)
        if self.on_change is not None:
            self.on_change(new)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        text = self._summary().replace("<b>", "").replace("</b>", "")
        bundle["text/plain"] = f"quantization toggle: {text}"
        bundle["text/html"] = f"<div>quantization toggle: {self._summary()}</div>"
        return bundle


def quantization_toggle(
    engine: Engine | None = None,
    modes: Sequence[str | None] = (None, "bf16", "fp8_mixed", "int4_mixed"),
    on_change: Callable[[str | None], None] | None = None,
) -> QuantizationToggle:
    """A :class:`QuantizationToggle` (displays itself)."""
    return QuantizationToggle(engine, modes, on_change)


def prompt_inspector(
    messages: Any, tools: Any = None, *, engine: Engine | None = None, model: str | None = None
) -> Any:
    """The prompt inspector (:func:`workbench.show_prompt`) in a widget, with a tool_choice selector."""
    names = []
    if tools:
        names = [d.tool_name for d in coerce_tools(tools)]
    choice = widgets.Dropdown(options=["auto", "required", "none", *names], value="auto", description="tool_choice")
    out = widgets.HTML()

    def draw(_change: Any = None) -> None:
        view = display.show_prompt(messages, tools, engine=engine, model=model, tool_choice=choice.value)
        out.value = view._repr_html_()

    choice.observe(draw, names="value")
    draw()
    return widgets.VBox([choice, out])
