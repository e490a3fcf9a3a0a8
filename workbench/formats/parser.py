"""Parse an assistant reply into text and tool calls; never raises on model output.

Recognised, anywhere in the reply (text before, between or after calls is kept as content):

* python lists ``[f(a=1, b="x"), g(c=[1, {"k": None}])]`` — any Python literal arguments (``true``/``false``/
  ``null`` also accepted), several lists in a row, a missing closing bracket;
* JSON calls ``{"type": "function", "name": ..., "parameters": {...}}``, ``{"name": ..., "parameters"|"arguments":
  ...}``, OpenAI's ``{"type": "function", "function": {...}}`` and lists of these;
* function tags ``<function=NAME>{...}</function>`` (closing tag optional);
* built-in calls ``brave_search.call(query="...")``;
* code: ``<|python_start|>...<|python_end|>`` (Llama 4) or ``<|python_tag|>...`` (Llama 3) holding something
  other than a call becomes a ``code_interpreter`` call with ``{"code": ...}``; a call inside the tags is
  parsed as a call.

When something looks like a call but cannot be parsed, the reply comes back as plain content with
``parse_error`` saying what failed, and no calls (running half of a garbled reply would be worse).  The
same holds for a reply cut by ``max_tokens`` (stop reason ``out_of_tokens``) while writing a call.
Unlike Meta's reference, which keeps only the first call, every call of the reply is returned.

Every call syntax's scanner lives here: they share the trigger scan, the budget and the repair rules, and
a reply may mix syntaxes.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

from workbench.errors import InputError
from workbench.formats.tooldefs import BUILTIN_TOOLS
from workbench.types import Message, ToolCall

_STOP_MARKERS = {
    "<|eot_id|>": "end_of_turn",
    "<|eot|>": "end_of_turn",
    "<|end_of_text|>": "end_of_turn",
    "<|eom_id|>": "end_of_message",
    "<|eom|>": "end_of_message",
}
_HEADERS = ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|header_start|>assistant<|header_end|>\n\n")

_NOT_IN_A_CALL = " \u2063"  # an invisible separator: no identifier, number or literal can take it in
CUT_CALL = (
    "the reply ran out of tokens (max_tokens or max_seq_len) while writing a tool call, so the cut call "
    "is returned as text and not as a call; raise max_tokens to let the model finish it"
)

_IDENT = r"[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*"
_TRIGGER_RE = re.compile(
    r"(?P<tag><function=)"
    r"|(?P<jsonlist>\[\s*\{\s*\"(?:name|type|function)\"\s*:)"
    rf"|(?P<pylist>\[\s*{_IDENT}\s*\()"
    r"|(?P<json>\{\s*\"(?:name|type|function)\"\s*:)"
    r"|(?P<builtin>\b[A-Za-z_]\w*\.call\s*\()"
)
_FUNCTION_TAG_RE = re.compile(r"<function=([^>\n]+?)>")
_CLOSE = {"(": ")", "[": "]", "{": "}"}
_MAX_AST_CHARS = 65_536  # the Python-literal fallback for "almost JSON" is for call-sized text only


class _Budget:
    """Characters the soft (JSON-that-may-be-data) candidates may still scan and parse.

    Each failed JSON candidate may scan to the end of the reply, so unbounded retries are quadratic (a
    512 KB reply of JSON-looking fragments took seconds).  The budget is a few times the reply's length:
    total work stays linear, and once it is spent the rest is treated as text.
    """

    def __init__(self, text: str) -> None:
        self.left = 4 * len(text) + 200_000

    def spend(self, chars: int) -> None:
        self.left -= max(chars, 1)
        if self.left < 0:
            raise _ParseFailure("the reply holds too much JSON-like text that is not a tool call to parse further")


class _ParseFailure(Exception):
    """A candidate call could not be parsed.  ``strong``: it was certainly meant as a call (so the reply gets a
    parse error); a weak failure (JSON that may just be data) lets the scan go on."""

    def __init__(self, message: str, strong: bool = False) -> None:
        super().__init__(message)
        self.strong = strong


@dataclass
class ParseResult:
    """What :func:`parse_tool_calls` found: remaining text, the calls, and an error message if any."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None


def reply_call_ids(body: str, n: int) -> list[str]:
    """The ids of a reply's ``n`` calls: a function of the reply's text (``call_<12 hex>_<k>``), so parsing a reply
    again — the same reply recomputed, or answered from the run store — gives the same calls, ids included, and
    a re-run equals the first run; the calls of one reply are numbered."""
    digest = hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return [f"call_{digest}_{k}" for k in range(n)]


def parse_assistant(text: str, stop_reason: str | None = None) -> Message:
    """The assistant :class:`Message` for a reply's text (stop-token names at the end set ``stop_reason``); its
    calls' ids derive from the text (:func:`reply_call_ids`)."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    body = text.strip(" ")
    for header in _HEADERS:
        if body.startswith(header):
            body = body[len(header) :]
    while True:  # a decoded reply may end with its stop token's name
        for marker, reason in _STOP_MARKERS.items():
            if body.endswith(marker):
                body = body[: -len(marker)]
                stop_reason = reason
                break
        else:
            break
    result = parse_tool_calls(body)
    if stop_reason == "out_of_tokens" and (result.tool_calls or result.error) and not _calls_closed(body, result):
        # Cut by max_tokens while writing a call: whatever parsed is a fragment (arguments missing, a list of
        # calls short of its end), and running it would act on a call the model never finished.
        return Message(role="assistant", content=body.strip(), stop_reason="out_of_tokens", parse_error=CUT_CALL)
    return Message(
        role="assistant",
        content=result.content,
        tool_calls=result.tool_calls,
        stop_reason=stop_reason,  # type: ignore[arg-type]
        parse_error=result.error,
    )


def _calls_closed(body: str, result: ParseResult) -> bool:
    """Whether the calls of a reply that ran out of tokens were finished before it was cut.

    The parser repairs a missing closing bracket, so a cut call can still parse.  A finished call keeps its
    meaning when more text follows; a cut one does not (the text joins an open string or argument list), so
    the reply is parsed again with a character no call can absorb appended, and the calls must not change.
    """
    if result.error or not result.tool_calls:
        return False
    longer = parse_tool_calls(body + _NOT_IN_A_CALL)
    return longer.error is None and [(c.tool_name, c.arguments) for c in longer.tool_calls] == [
        (c.tool_name, c.arguments) for c in result.tool_calls
    ]


def parse_tool_calls(text: str) -> ParseResult:
    """Split ``text`` into content and tool calls (see the module docstring); never raises.

    Every call returned passes the same checks as a tool call given in a dialog's history (a name the model
    can write, JSON arguments that every prompt format can render), so the next turn of a tool loop can
    always render this reply; a call that fails them makes the reply content with ``error`` set.  The calls' ids
    derive from ``text`` (:func:`reply_call_ids`): parsing the same text twice gives the same calls.
    """
    try:
        result = _parse(text)
    except Exception as exc:  # defensive: a parser bug must not crash a notebook loop
        return ParseResult(content=text.strip(), error=f"tool-call parser failed: {type(exc).__name__}: {exc}")
    for call in result.tool_calls:
        try:
            ToolCall.coerce(call)
        except InputError as exc:
            return ParseResult(content=text.strip(), error=f"the model wrote a tool call that cannot be used: {exc}")
    ids = reply_call_ids(text, len(result.tool_calls))
    result.tool_calls = [replace(call, call_id=i) for call, i in zip(result.tool_calls, ids)]
    return result


def _parse(text: str) -> ParseResult:
    for start_tag, end_tag in (("<|python_start|>", "<|python_end|>"), ("<|python_tag|>", None)):
        idx = text.find(start_tag)
        if idx < 0:
            continue
        before = text[:idx]
        rest = text[idx + len(start_tag) :]
        after = ""
        if end_tag is not None and end_tag in rest:
            rest, after = rest.split(end_tag, 1)
        for marker in ("<|python_start|>", "<|python_end|>", "<|python_tag|>"):
            rest = rest.replace(marker, "")
            after = after.replace(marker, "")
        payload = _payload_calls(rest)
        if isinstance(payload, str):  # an unparsable call inside the tags
            return ParseResult(content=text.strip(), error=payload)
        outer = _parse_search(before + "\n" + after) if (before.strip() or after.strip()) else ParseResult("")
        if outer.error:
            return ParseResult(content=text.strip(), error=outer.error)
        content = (before.strip() + ("\n" if before.strip() and after.strip() else "") + after.strip()).strip()
        if outer.tool_calls:
            content = outer.content
        return ParseResult(content=content, tool_calls=outer.tool_calls + payload)
    whole = _bare_calls(text.strip())
    if whole:
        return ParseResult(content="", tool_calls=whole)
    return _parse_search(text)


def _payload_calls(payload: str) -> list[ToolCall] | str:
    """Calls inside python tags: a payload that is entirely calls; otherwise code for code_interpreter.
    Returns an error string when the payload is an unparsable call."""
    stripped = payload.strip()
    if not stripped:
        return []
    # no bare `name(k=v)` here: inside python tags that is far more likely code than a call
    found = _parse_search(stripped)
    if found.tool_calls and not found.content and not found.error:
        return found.tool_calls
    if found.error and _looks_like_call(stripped):
        return found.error
    code = payload.strip("\r\n").rstrip()
    return [ToolCall(tool_name="code_interpreter", arguments={"code": code})]


def _looks_like_call(text: str) -> bool:
    return bool(re.match(r"(\[\s*)?\{\s*\"(name|type|function)\"|<function=", text))


_JSON_SEPARATOR_RE = re.compile(r"\s*;")


def _parse_search(text: str) -> ParseResult:
    calls: list[ToolCall] = []
    pieces: list[str] = []
    pos = 0
    scan = 0
    budget = _Budget(text)
    while True:
        m = _TRIGGER_RE.search(text, scan)
        if m is None:
            break
        start = m.start()
        kind = m.lastgroup
        if kind in ("json", "jsonlist") and budget.left <= 0:
            break  # the budget for JSON-that-may-be-data is spent: the rest is text
        try:
            end, found = _PARSERS[kind](text, start, budget)
        except _ParseFailure as exc:
            if kind in ("json", "jsonlist") and not exc.strong:
                scan = start + 1  # JSON that is not a call is just text
                continue
            return ParseResult(content=text.strip(), error=str(exc))
        if found is None:  # well-formed, but not a call
            scan = max(end, start + 1)
            continue
        pieces.append(text[pos:start])
        calls.extend(found)
        if kind in ("json", "jsonlist"):  # Llama 3.2 separates JSON calls with ';': the separator is no content
            separator = _JSON_SEPARATOR_RE.match(text, end)
            end = separator.end() if separator else end
        pos = scan = end
    pieces.append(text[pos:])
    content = "".join(pieces).strip() if calls else text.strip()
    return ParseResult(content=content, tool_calls=calls)


# --- scanning helpers -----------------------------------------------------------------------------------


def _scan_balanced(text: str, start: int, python: bool) -> tuple[int | None, list[str], int | None]:
    """Scan from the opening bracket at ``start``; returns (index after the matching close or None, the
    closers still open at the end, index after the last call closed at list depth 1)."""
    stack: list[str] = []
    i = start
    n = len(text)
    last_call_end: int | None = None
    while i < n:
        ch = text[i]
        if ch in "\"'" and (python or ch == '"'):
            quote = ch * 3 if python and text.startswith(ch * 3, i) else ch
            i += len(quote)
            while i < n and not text.startswith(quote, i):
                if text[i] == "\\":
                    i += 1
                elif text[i] == "\n" and len(quote) == 1:
                    break
                i += 1
            if i >= n:
                return None, [quote, *reversed(stack)], last_call_end
            i += len(quote) if text.startswith(quote, i) else 0
            continue
        if ch in _CLOSE:
            stack.append(_CLOSE[ch])
        elif ch in ")]}":
            if not stack or stack[-1] != ch:
                raise _ParseFailure(f"unbalanced {ch!r} at offset {i}")
            stack.pop()
            if not stack:
                return i + 1, [], last_call_end
            if ch == ")" and len(stack) == 1:
                last_call_end = i + 1
        i += 1
    return None, list(reversed(stack)), last_call_end


def _segments(text: str, start: int, python: bool) -> list[tuple[int, str]]:
    """Candidate (end, source) pairs for the bracketed segment at ``start``: the balanced segment, or, when the
    model forgot closing brackets, the text with them added and (python lists) the calls that did close."""
    end, missing, last_call_end = _scan_balanced(text, start, python)
    if end is not None:
        return [(end, text[start:end])]
    if missing and missing[0][0] in "\"'":  # the reply ends inside a string: a cut-off value, not repairable
        raise _ParseFailure(f"unterminated string in the tool call {text[start : start + 200]!r}", True)
    out = [(len(text), text[start:] + "".join(missing))]
    if python and last_call_end is not None and text[start] == "[":
        out.append((last_call_end, text[start:last_call_end] + "]"))
    return out


def _segment(text: str, start: int, python: bool) -> tuple[int, str]:
    return _segments(text, start, python)[0]


def _parse_python_list(text: str, start: int, budget: _Budget) -> tuple[int, list[ToolCall] | None]:
    failure: _ParseFailure | None = None
    for end, segment in _segments(text, start, python=True):
        try:
            node = _ast_expr(segment)
            if not isinstance(node, ast.List) or not node.elts:
                raise _ParseFailure(f"could not parse the python-list tool call {segment[:200]!r}")
            return end, [_call_from_ast(elt) for elt in node.elts]
        except _ParseFailure as exc:
            failure = failure or exc
    assert failure is not None
    raise failure


def _bare_calls(text: str) -> list[ToolCall]:
    """``f(a=1)`` or ``f(a=1), g(b=2)`` making up the whole text (no list brackets)."""
    if not text or not re.match(_IDENT + r"\s*\(", text) or not text.endswith(")"):
        return []
    try:
        node = _ast_expr(text)
        elts = node.elts if isinstance(node, ast.Tuple) else [node]
        if not all(isinstance(e, ast.Call) for e in elts):
            return []
        return [_call_from_ast(e) for e in elts]
    except _ParseFailure:
        return []


def _ast_expr(source: str) -> ast.expr:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(source.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise _ParseFailure(f"could not parse the tool call {source[:200]!r}: {exc}") from None


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _dotted(node.value) + "." + node.attr
    raise _ParseFailure("a tool call must name a function")


def _call_from_ast(node: ast.expr) -> ToolCall:
    if not isinstance(node, ast.Call):
        raise _ParseFailure("every element of a python-list tool call must be a call like name(arg=value)")
    name = _dotted(node.func)
    if name.endswith(".call") and name.count(".") == 1:
        name = name[: -len(".call")]
    args: dict[str, Any] = {}
    if node.args:
        if len(node.args) == 1 and not node.keywords and name in BUILTIN_TOOLS:
            args[_builtin_key(name)] = _literal(node.args[0])
        else:
            raise _ParseFailure(f"tool call {name}(...) passes positional arguments; tool calls take name=value")
    for kw in node.keywords:
        if kw.arg is None:
            raise _ParseFailure(f"tool call {name}(...) uses **kwargs")
        args[kw.arg] = _literal(kw.value)
    return ToolCall(tool_name=name, arguments=args)


_NAME_LITERALS = {"true": True, "false": False, "null": None, "none": None, "True": True, "False": False, "None": None}


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, (str, int, float, bool)) or node.value is None:
            return node.value
        raise _ParseFailure(f"unsupported literal {node.value!r}")
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                raise _ParseFailure("dict unpacking is not a literal")
            key = _literal(k)
            out[key if isinstance(key, str) else json.dumps(key)] = _literal(v)
        return out
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Name) and node.id in _NAME_LITERALS:
        return _NAME_LITERALS[node.id]
    raise _ParseFailure(f"tool-call argument {ast.unparse(node)[:100]!r} is not a literal value")


def _builtin_key(name: str) -> str:
    return "code" if name == "code_interpreter" else "query"


def _normalize_builtin(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """A built-in called in a custom syntax: map its single argument to ``query`` (``code``), as the
    reference does."""
    key = _builtin_key(name)
    if name in BUILTIN_TOOLS and key not in args and len(args) == 1:
        return {key: next(iter(args.values()))}
    return args


def _json_segment(text: str, start: int, budget: _Budget | None = None) -> tuple[int, Any]:
    budget = budget or _Budget(text)
    try:
        obj, end = json.JSONDecoder().raw_decode(text, start)
        return end, obj
    except json.JSONDecodeError as exc:
        budget.spend(exc.pos - start)
    except (RecursionError, ValueError) as exc:  # absurd nesting, or an integer too long to convert
        budget.spend(len(text) - start)  # work done unknown: assume it ran to the end
        strong = re.search(r"\"(parameters|arguments)\"", text[start : start + 500]) is not None
        raise _ParseFailure(
            f"could not parse the JSON tool call {text[start : start + 200]!r}: {exc}", strong
        ) from None
    try:
        end, segment = _segment(text, start, python=False)
    except _ParseFailure as exc:
        if exc.strong:
            raise
        end, segment = len(text), text[start : start + 500]  # a stray closing bracket: not repairable
    budget.spend(end - start)
    try:
        budget.spend(len(segment))
        return end, json.loads(segment)
    except (json.JSONDecodeError, RecursionError, ValueError):
        pass
    if len(segment) <= _MAX_AST_CHARS:
        try:  # single quotes, Python literals: a model writing JSON "almost"
            budget.spend(4 * len(segment))  # the Python parser costs more per character
            return end, _literal(_ast_expr(segment))
        except _ParseFailure:
            pass
    strong = re.search(r"\"(parameters|arguments)\"", segment) is not None
    raise _ParseFailure(f"could not parse the JSON tool call {segment[:200]!r}", strong)


def _json_call(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict) and "name" in obj["function"]:
        obj = {**obj["function"], "type": "function"}
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    if "parameters" in obj:
        args = obj["parameters"]
    elif "arguments" in obj:
        args = obj["arguments"]
    elif obj.get("type") == "function":
        args = {}
    else:
        return None
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise _ParseFailure(f"arguments of tool call {name!r} are not valid JSON: {args[:200]!r}", True) from None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise _ParseFailure(f"arguments of tool call {name!r} must be an object, got {args!r}"[:300], True)
    return ToolCall(tool_name=name, arguments=_normalize_builtin(name, args))


def _parse_json(text: str, start: int, budget: _Budget) -> tuple[int, list[ToolCall] | None]:
    end, obj = _json_segment(text, start, budget)
    items = obj if isinstance(obj, list) else [obj]
    calls = [_json_call(o) for o in items]
    if not calls or any(c is None for c in calls):
        return end, None
    return end, calls  # type: ignore[return-value]


def _parse_function_tag(text: str, start: int, budget: _Budget) -> tuple[int, list[ToolCall] | None]:
    m = _FUNCTION_TAG_RE.match(text, start)
    if m is None:
        raise _ParseFailure(f"malformed function tag {text[start : start + 100]!r}")
    name = m.group(1).strip()
    i = m.end()
    while i < len(text) and text[i] in " \t":
        i += 1
    args: Any = {}
    if i < len(text) and text[i] == "{":
        try:
            i, args = _json_segment(text, i, budget)
        except _ParseFailure as exc:
            raise _ParseFailure(str(exc), True) from None
        if not isinstance(args, dict):
            raise _ParseFailure(f"arguments of <function={name}> must be a JSON object", True)
    elif not text.startswith("</function>", i) and i < len(text):
        raise _ParseFailure(f"arguments of <function={name}> must be a JSON object, got {text[i : i + 100]!r}", True)
    close = re.match(r"\s*</function>", text[i:])
    if close:
        i += close.end()
    return i, [ToolCall(tool_name=name, arguments=_normalize_builtin(name, args))]


def _parse_builtin(text: str, start: int, budget: _Budget) -> tuple[int, list[ToolCall] | None]:
    m = re.match(r"([A-Za-z_]\w*)\.call\s*\(", text[start:])
    assert m is not None
    name = m.group(1)
    paren = start + m.end() - 1
    try:
        end, segment = _segment(text, paren, python=True)
        call = _call_from_ast(_ast_expr(name + ".call" + segment))
        return end, [call]
    except _ParseFailure:
        pass
    # Meta's renderer does not escape quotes inside the query: take everything up to the last '")'
    loose = re.match(r'\(\s*query\s*=\s*"(.*)"\s*\)', text[paren:], re.DOTALL)
    if loose:
        return paren + loose.end(), [ToolCall(tool_name=name, arguments={"query": loose.group(1)})]
    raise _ParseFailure(f"could not parse the built-in tool call {text[start : start + 200]!r}")


_PARSERS = {
    "tag": _parse_function_tag,
    "jsonlist": _parse_json,
    "json": _parse_json,
    "pylist": _parse_python_list,
    "builtin": _parse_builtin,
}
