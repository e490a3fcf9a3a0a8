"""Small ipywidgets front-ends for notebooks: a multi-turn tool-chat panel and a quantization toggle.

They only use the public engine API, so everything they do can also be done in plain cells.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as widgets

from . import tools as tool_loop
from .types import Message


def render_message(message: Message) -> str:
    """One transcript line: role, content, and tool calls as ``name(args)``."""
    calls = "".join(f"\n    -> {c.tool_name}({c.arguments})" for c in message.tool_calls)
    content = message.content if isinstance(message.content, str) else str(message.content)
    return f"[{message.role}] {content}{calls}"


class ChatPanel:
    """A text box + send button that runs the tool loop on a growing dialog and shows the transcript."""

    def __init__(self, engine: Any, tools: Sequence[Callable[..., Any]] = (), *, system: str | None = None,
                 max_turns: int = 4, **sampling: Any) -> None:  # fmt: skip
        self.engine = engine
        self.tools = list(tools)
        self.max_turns = max_turns
        self.sampling = {"max_tokens": 128, **sampling}
        self.messages: list[Message] = [Message(role="system", content=system)] if system else []
        self.input = widgets.Textarea(placeholder="Ask something…", layout=widgets.Layout(width="100%"))
        self.send = widgets.Button(description="Send", button_style="primary")
        self.log = widgets.Output(layout=widgets.Layout(border="1px solid #ccc", max_height="400px",
                                                        overflow="auto"))  # fmt: skip
        self.send.on_click(lambda _button: self.submit())
        self.widget = widgets.VBox([self.log, self.input, self.send])

    def submit(self, text: str | None = None) -> list[Message]:
        """Send ``text`` (or the text box's content) and return the new messages of this turn."""
        text = self.input.value if text is None else text
        if not text.strip():
            return []
        self.input.value = ""
        before = len(self.messages)
        self.messages.append(Message(role="user", content=text))
        try:
            self.messages = tool_loop.run(self.engine, self.messages, self.tools, max_turns=self.max_turns,
                                          **self.sampling)  # fmt: skip
        except Exception as exc:  # keep the panel alive; the dialog is unchanged but for the user line
            with self.log:
                print(f"error: {type(exc).__name__}: {exc}")
            return []
        new = self.messages[before:]
        with self.log:
            for message in new:
                print(render_message(message))
        return new

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def quantization_toggle(engine: Any, modes: Sequence[str | None] = (None, "bf16", "fp8_mixed", "int4_mixed"),
                        on_change: Callable[[str | None], None] | None = None) -> widgets.Dropdown:  # fmt: skip
    """A dropdown that calls ``engine.set_quantization`` (re-loading from the checkpoint) on change."""
    dropdown = widgets.Dropdown(options=[(str(m), m) for m in modes], value=engine.settings.quantization,
                                description="quantization")  # fmt: skip

    def changed(change: dict[str, Any]) -> None:
        engine.set_quantization(change["new"])
        if on_change is not None:
            on_change(change["new"])

    dropdown.observe(changed, names="value")
    return dropdown
