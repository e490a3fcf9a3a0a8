"""Rich notebook display: HTML cards for engines, results, messages and transcripts; readable info and
memory reports; DataFrames of results (:func:`to_frame`); the prompt inspector (:func:`show_prompt`).

Everything renders to self-contained HTML with inline styles (no JavaScript), so a stored notebook shows
the same cards when opened untrusted or on GitHub, and every object keeps a plain-text repr too.
The chat playground (:mod:`workbench.notebook.widgets`) draws its transcript with the same functions.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from workbench.engine import Engine, model_label
from workbench.errors import InputError
from workbench.formats import coerce_messages, make_formatter
from workbench.formats.models import resolve_model
from workbench.formats.tokenizer import Tokenizer
from workbench.reports import BOX as _BOX
from workbench.reports import esc, human_bytes, human_count, short_path
from workbench.session import current
from workbench.types import (
    ChatCompletion,
    Completion,
    Message,
    TokenLogprob,
    ToolCall,
    Transcript,
    register_presenter,
)

SPECIAL_RE = re.compile(r"<\|[A-Za-z0-9_]+\|>")

ROLE_COLORS = {  # background, accent
    "system": ("#f3f3f3", "#888"),
    "user": ("#e8f1fd", "#1a73e8"),
    "assistant": ("#f1f8e9", "#388e3c"),
    "tool": ("#fff8e1", "#f9a825"),
    "ipython": ("#fff8e1", "#f9a825"),
}

_PRE = "white-space:pre-wrap;word-break:break-word;margin:2px 0;font-family:var(--jp-code-font-family,monospace);"
_BADGE = "display:inline-block;padding:0 6px;border-radius:8px;font-size:11px;margin-right:4px;"


def badge(text: str, color: str = "#666", background: str = "#eee") -> str:
    return f'<span style="{_BADGE}color:{color};background:{background}">{esc(text)}</span>'


def text_with_specials(text: str) -> str:
    """Escaped text with special tokens (``<|eot|>``…) dimmed, so the words stand out."""
    out, last = [], 0
    for m in SPECIAL_RE.finditer(text):
        out.append(esc(text[last : m.start()]))
        out.append(f'<span style="color:#999;background:#f0f0f0;border-radius:3px">{esc(m.group())}</span>')
        last = m.end()
    out.append(esc(text[last:]))
    return "".join(out)


# ---------------------------------------------------------------------------------------------- results
def logprob_tokens_html(logprobs: Sequence[TokenLogprob]) -> str:
    """Each generated token shaded by its probability (white = certain, red = unlikely); hover for details."""
    spans = []
    for lp in logprobs:
        p = math.exp(lp.logprob)
        alpha = round(0.75 * (1 - p), 3)
        alts = ", ".join(f"{t!r}: {math.exp(v):.3f}" for t, v in list(lp.top_logprobs.items())[:5])
        title = f"p={p:.3f}  logprob={lp.logprob:.3f}" + (f"\ntop: {alts}" if alts else "")
        style = f"background:rgba(229,57,53,{alpha});border-radius:2px;padding:0 1px"
        body = text_with_specials(lp.text) if SPECIAL_RE.search(lp.text) else esc(lp.text)
        spans.append(f'<span title="{esc(title)}" style="{style}">{body}</span>')
    return "".join(spans)


def completion_html(result: Completion | ChatCompletion, title: str = "Completion") -> str:
    meta = [badge(f"{len(result.tokens)} tokens"), badge(f"stop: {result.stop_reason}")]
    if result.prompt_tokens:
        meta.append(badge(f"prompt {result.prompt_tokens} tokens"))
    if result.logprobs:
        mean = sum(lp.logprob for lp in result.logprobs) / len(result.logprobs)
        meta.append(badge(f"mean logprob {mean:.2f}"))
        body = f'<div style="{_PRE}">{logprob_tokens_html(result.logprobs)}</div>'
        body += (
            '<div style="color:#888;font-size:11px">shading: probability of each token (hover for the top '
            "alternatives)</div>"
        )
    else:
        text = result.text if isinstance(result, Completion) else None
        body = f'<div style="{_PRE}">{text_with_specials(text)}</div>' if text is not None else ""
    if isinstance(result, ChatCompletion):
        body = messages_html([result.message]) + (body if result.logprobs else "")
    return (
        f'<div style="{_BOX}border:1px solid #ddd;border-radius:6px;padding:6px 8px;max-width:100%">'
        f"<b>{esc(title)}</b> {''.join(meta)}{body}</div>"
    )


def _call_json(call: ToolCall) -> str:
    return json.dumps(call.arguments, ensure_ascii=False, default=str)


def tool_call_html(call: ToolCall, number: int) -> str:
    """A tool call as a card; its number links it to the card of its result."""
    return (
        f'<div class="wb-call" style="border:1px solid #f9a825;border-radius:5px;padding:3px 6px;margin:3px 0;'
        'background:#fffdf5">'
        f"{badge(f'call #{number}', '#fff', '#f9a825')}<b>{esc(call.tool_name)}</b>"
        f'<span style="{_PRE}display:inline"> {esc(_call_json(call))}</span>'
        f'<span style="color:#aaa;font-size:11px"> id {esc(call.call_id or "-")}</span></div>'
    )


def message_html(message: Message, calls: dict[str, tuple[int, ToolCall]] | None = None, extra: str = "") -> str:
    """One message as a role-styled card; tool results name the call (number, tool) they answer."""
    calls = {} if calls is None else calls
    role = message.role
    background, accent = ROLE_COLORS.get(role, ("#fff", "#999"))
    content = message.content if isinstance(message.content, str) else json.dumps(message.content, default=str)
    head = f'<b style="color:{accent}">{esc(role)}</b>'
    if role in ("tool", "ipython"):
        linked = calls.get(message.call_id)
        if linked is not None:
            head += " " + badge(f"result of call #{linked[0]} {linked[1].tool_name}", "#fff", "#f9a825")
        elif message.call_id:
            head += " " + badge(f"result of {message.call_id}")
    if message.stop_reason:
        head += " " + badge(message.stop_reason)
    body = f'<div style="{_PRE}">{text_with_specials(content)}</div>' if content else ""
    cards = "".join(
        tool_call_html(c, calls[c.call_id][0]) if c.call_id in calls else tool_call_html(c, 0)
        for c in message.tool_calls
    )
    error = ""
    if message.parse_error:
        error = f'<div style="color:#c62828">could not parse a tool call: {esc(message.parse_error)}</div>'
    # wb-msg / wb-msg-<role> / wb-call: stable hooks for styling and for the real-browser test
    return (
        f'<div class="wb-msg wb-msg-{esc(role)}" style="border-left:3px solid {accent};background:{background};'
        f'padding:4px 8px;margin:4px 0;border-radius:4px">{head}{body}{cards}{error}{extra}</div>'
    )


def transcript_html(transcript: Any) -> str:
    """A tool-loop transcript: its cards, then why the loop ended and the tokens its replies took."""
    ended = getattr(transcript, "stop_reason", None)
    footer = ""
    if ended:
        color = "#388e3c" if ended == "answered" else "#c62828"
        footer = (
            f'<div style="{_BOX}color:#777;font-size:12px">ended: {badge(ended, "#fff", color)}'
            f" · {getattr(transcript, 'generated_tokens', 0)} generated tokens</div>"
        )
    return messages_html(transcript) + footer


def number_calls(messages: Iterable[Message]) -> dict[str, tuple[int, ToolCall]]:
    """call_id -> (1-based number in the transcript, call): how result cards find their call."""
    numbered: dict[str, tuple[int, ToolCall]] = {}
    for message in messages:
        for call in message.tool_calls:
            numbered[call.call_id or f"#{len(numbered) + 1}"] = (len(numbered) + 1, call)
    return numbered


def messages_html(messages: Sequence[Any], extras: dict[int, str] | None = None) -> str:
    """A transcript: one card per message, tool results linked to their calls.  ``extras[i]`` is appended
    inside card ``i`` (the playground puts each turn's prompt toggle there)."""

    msgs = coerce_messages(list(messages))
    calls = number_calls(msgs)
    extras = extras or {}
    return (
        f'<div style="{_BOX}">'
        + "".join(message_html(m, calls, extras.get(i, "")) for i, m in enumerate(msgs))
        + "</div>"
    )


# ---------------------------------------------------------------------------------------------- engine
def engine_html(engine: Engine) -> str:
    if engine.closed:
        return f'<div style="{_BOX}">Engine <b>{esc(engine.model_id or engine.family)}</b> (unloaded)</div>'
    info = engine.info()
    fmt = engine.formatter
    rows = [
        ("model", model_label(engine)),
        (
            "family / prompt format",
            f"{info['family']} · tools: {fmt.model.tool_style or 'none'}, calls as {fmt.default_tool_prompt_format}",
        ),
        ("parameters", human_count(info["parameters"])),
        ("dtype · device", f"{info['dtype']} · {info['device']} · model-parallel {info['model_parallel_size']}"),
        ("quantization", info["quantization"] or "none"),
        ("memory", f"weights {human_bytes(info['weights_bytes'])} · KV cache {human_bytes(info['kv_cache_bytes'])}"),
        ("limits", f"max_batch_size {info['max_batch_size']} · max_seq_len {info['max_seq_len']}"),
        ("checkpoint", short_path(info["checkpoint"])),
        ("run store", short_path(info["run_store"])),
    ]
    cells = "".join(
        f'<tr><td style="color:#777;padding:0 10px 0 0;text-align:left">{esc(k)}</td>'
        f'<td style="text-align:left">{esc(v)}</td></tr>'
        for k, v in rows
    )
    return (
        f'<div style="{_BOX}border:1px solid #ddd;border-radius:6px;padding:6px 10px;display:inline-block">'
        f'<b>workbench Engine</b><table style="border-collapse:collapse">{cells}</table></div>'
    )


# ---------------------------------------------------------------------------------------------- frames
def to_frame(items: Any) -> Any:
    """A pandas DataFrame of results, one row per item.

    * a list of :class:`Completion` / :class:`ChatCompletion`: text, tool calls, stop reason, token counts,
      mean logprob;
    * a list of :class:`TokenLogprob` (``result.logprobs``), or one result with logprobs: one row per
      generated token (text, logprob, probability, top alternatives);
    * a transcript (list of messages) or a list of transcripts: one row per message (``dialog``, ``turn``,
      role, content, tool calls, the call a tool result answers, and ``dialog_ended``: why the tool loop
      ended that dialog).
    """
    import pandas as pd

    if isinstance(items, (Completion, ChatCompletion)):
        return to_frame(items.logprobs or [])
    if isinstance(items, Transcript):
        return _messages_frame([items])
    items = list(items)
    if not items:
        return pd.DataFrame()
    first = items[0]
    if isinstance(first, TokenLogprob):
        return pd.DataFrame(
            [
                {
                    "token": lp.token,
                    "text": lp.text,
                    "logprob": lp.logprob,
                    "prob": math.exp(lp.logprob),
                    "top": {k: round(v, 4) for k, v in lp.top_logprobs.items()},
                }
                for lp in items
            ]
        )
    if isinstance(first, (Completion, ChatCompletion)):
        rows = []
        for r in items:
            row = {
                "text": r.text,
                "stop_reason": r.stop_reason,
                "tokens": len(r.tokens),
                "prompt_tokens": r.prompt_tokens,
            }
            if isinstance(r, ChatCompletion):
                row["tool_calls"] = [f"{c.tool_name}({_call_json(c)})" for c in r.message.tool_calls]
            if r.logprobs:
                row["mean_logprob"] = sum(lp.logprob for lp in r.logprobs) / len(r.logprobs)
            rows.append(row)
        return pd.DataFrame(rows)
    if isinstance(first, (Message, dict)):
        return _messages_frame([items])
    if isinstance(first, (list, tuple)):
        return _messages_frame(items)
    raise TypeError(f"to_frame takes results, logprobs or transcripts, got a list of {type(first).__name__}")


def _messages_frame(dialogs: Sequence[Sequence[Any]]) -> Any:
    import pandas as pd

    rows = []
    for d, dialog in enumerate(dialogs):
        msgs = coerce_messages(list(dialog))
        calls = number_calls(msgs)
        for turn, m in enumerate(msgs):
            answers = calls.get(m.call_id) if m.role == "tool" else None
            rows.append(
                {
                    "dialog": d,
                    "turn": turn,
                    "role": m.role,
                    "content": m.content if isinstance(m.content, str) else str(m.content),
                    "tool_calls": [f"{c.tool_name}({_call_json(c)})" for c in m.tool_calls],
                    "answers_call": f"{answers[1].tool_name} #{answers[0]}" if answers else None,
                    "stop_reason": m.stop_reason,
                    "dialog_ended": getattr(dialog, "stop_reason", None),
                }
            )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------- prompts
class PromptView:
    """The exact prompt of a dialog: its token ids, the text, and the token span of every message.

    ``segments`` is a list of ``(label, ids)``: the begin-of-text token, one entry per message actually
    sent (after the tool prompt is merged into the system message), and the open assistant header.
    """

    def __init__(self, tokenizer: Any, segments: list[tuple[str, list[int]]], model: str) -> None:
        self.tokenizer = tokenizer
        self.segments = segments
        self.model = model
        self.ids = [t for _, seg in segments for t in seg]

    @property
    def text(self) -> str:
        return self.tokenizer.decode(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        counts = ", ".join(f"{label} {len(ids)}" for label, ids in self.segments)
        return f"PromptView({len(self.ids)} tokens for {self.model}: {counts})\n{self.text}"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))

    def _token_span(self, token: int) -> str:
        text = self.tokenizer.decode([token])
        special = self.tokenizer.is_special(token)
        style = (
            "color:#fff;background:#7e57c2;border-radius:3px;padding:0 2px"
            if special
            else "border-bottom:1px dotted #bbb"
        )
        return f'<span title="{token}" style="{style}">{esc(text)}</span>'

    def _repr_html_(self) -> str:
        rows = []
        for label, ids in self.segments:
            role = label.split()[0]
            _, accent = ROLE_COLORS.get(role, ("#fff", "#999"))
            tokens = "".join(self._token_span(t) for t in ids)
            rows.append(
                f'<div style="border-left:3px solid {accent};padding:2px 6px;margin:3px 0">'
                f"{badge(label, '#fff', accent)}{badge(f'{len(ids)} tokens')}"
                f'<div style="{_PRE}">{tokens}</div></div>'
            )
        grid = "".join(
            f'<span style="display:inline-block;border:1px solid #ddd;margin:1px;padding:0 3px;'
            f'font-size:11px"><span style="color:#999">{t}</span> {esc(self.tokenizer.decode([t]))}</span>'
            for t in self.ids
        )
        return (
            f'<div style="{_BOX}"><b>Prompt</b> {badge(f"{len(self.ids)} tokens")} {badge(self.model)}'
            f'<div style="color:#888;font-size:11px">special tokens in purple; hover a token for its id</div>'
            f"{''.join(rows)}<details><summary>token by token</summary>"
            f'<div style="font-family:var(--jp-code-font-family,monospace)">{grid}</div></details></div>'
        )


def prompt_view(
    formatter: Any,
    messages: Any,
    tools: Any = None,
    tool_choice: Any = "auto",
    tool_prompt_format: Any = None,
    model: str | None = None,
) -> PromptView:
    """Split a dialog's exact prompt into its messages (the same ids as ``formatter.encode_dialog``)."""
    sent, fmt = formatter.prepare_dialog(messages, tools, tool_choice, tool_prompt_format)
    chat = formatter.chat
    segments: list[tuple[str, list[int]]] = [("begin", [chat.bos])]
    for i, m in enumerate(sent):
        segments.append((f"{m.role} #{i}", chat.encode_message(m, fmt)))
    segments.append(("assistant (to complete)", chat.encode_header("assistant")))
    view = PromptView(formatter.tokenizer, segments, model or formatter.model_id or formatter.family)
    return view


def show_prompt(
    messages: Any,
    tools: Any = None,
    *,
    engine: Engine | None = None,
    model: str | None = None,
    tool_choice: Any = "auto",
    tool_prompt_format: Any = None,
) -> PromptView:
    """The exact prompt a dialog becomes, as HTML: special tokens highlighted, token counts per message,
    and a token-by-token view (displays itself; ``.ids`` and ``.text`` hold the raw prompt).

    Give ``engine=`` (default: the loaded engine) or, without any model loaded, ``model=`` a model id
    (``"Llama3.2-3B-Instruct"``, ``"Llama-4-Scout-17B-16E-Instruct"``, ``"meta-llama/Llama-3.1-8B-Instruct"``):
    the tokenizer bundled with ``llama-models`` renders it then.
    """

    if engine is None and model is None:
        engine = current()
        if engine is None:
            raise InputError(
                "show_prompt needs a model: pass engine=... or model='Llama3.2-3B-Instruct' "
                "(a model id works without loading anything)"
            )
    if engine is not None and model is None:
        return prompt_view(
            engine.formatter, messages, tools, tool_choice, tool_prompt_format, model=model_label(engine)
        )

    info = resolve_model(model)
    tokenizer = Tokenizer.for_checkpoint(None, info.chat_family)
    return prompt_view(make_formatter(tokenizer, model), messages, tools, tool_choice, tool_prompt_format, model)


# The results of the lower layers (workbench.types, the Engine) render through these.
register_presenter("completion_html", completion_html)
register_presenter("messages_html", messages_html)
register_presenter("transcript_html", transcript_html)
register_presenter("frame", to_frame)
register_presenter("engine_html", engine_html)
