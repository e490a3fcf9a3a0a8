"""``max_tokens`` against the context: a request that cannot fit is a 400 naming the limit, as OpenAI and vLLM
answer, instead of a reply the engine silently cuts at ``max_seq_len``.

Why a module of its own: the check needs the prompt's length, which only the engine's formatter knows (tools
add a system prompt); the OpenAI routes and the Batch API's lines both call it before any row is queued.
The prompt is rendered the way the engine renders it (``engine.formatter.encode_dialog``, a fraction of a
millisecond); a JSON-schema ``response_format`` adds an instruction the count leaves out (a few tokens, which
the engine then takes from the reply).
"""

from __future__ import annotations

from typing import Any

from workbench.errors import WorkbenchError

from .errors import APIError
from .translate import ChatRequest, CompletionRequest


def prompt_length(engine: Any, req: ChatRequest | CompletionRequest, index: int = 0) -> int | None:
    """Tokens of the request's prompt (``index``: which prompt of a completion request); None when it cannot
    be rendered here (the engine then reports the problem itself)."""
    try:
        if isinstance(req, ChatRequest):
            return len(engine.formatter.encode_dialog(req.messages, tools=req.tools, tool_choice=req.tool_choice))
        prompt = req.prompts[index]
        return len(engine.tokenizer.encode(prompt, bos=True)) if isinstance(prompt, str) else len(prompt)
    except WorkbenchError:
        return None


def check_room(engine: Any, req: ChatRequest | CompletionRequest) -> None:
    """Raise a 400 when ``max_tokens`` plus the prompt exceeds the engine's context (``max_seq_len``)."""
    wanted = req.sampling.max_tokens
    if wanted is None:
        return
    limit = int(engine.max_seq_len)
    where = "messages" if isinstance(req, ChatRequest) else "prompt"
    for index in range(1 if isinstance(req, ChatRequest) else len(req.prompts)):
        length = prompt_length(engine, req, index)
        if length is None and wanted >= limit:
            raise APIError(
                f"max_tokens={wanted} does not fit: this model's context is {limit} tokens (max_seq_len), "
                f"prompt included; lower max_tokens below {limit}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        if length is None or length + wanted <= limit:
            continue
        which = "" if isinstance(req, ChatRequest) or len(req.prompts) == 1 else f" (prompt {index})"
        raise APIError(
            f"max_tokens={wanted} does not fit: this model's context is {limit} tokens (max_seq_len) and you "
            f"requested {length + wanted} tokens ({length} in the {where}{which}, {wanted} in the completion); "
            f"lower max_tokens to at most {max(limit - length, 0)}, or leave it out to generate until the "
            "context is full",
            param="max_tokens",
            code="context_length_exceeded",
        )
