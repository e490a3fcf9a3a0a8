"""Which prompt format a model name implies.

The chat *tokens* (headers, end-of-turn markers) follow the tokenizer family, but the *tool prompt*
(the wording of the system prompt that lists tools, the default call syntax) follows the model
generation: Llama 3.1 (and the 3.2 vision models) were trained on the "Environment: ipython" prompt
with JSON calls; Llama 3.2 text, 3.3 and 4 on the python-list prompt.  Names are accepted in Meta's
descriptor form (``Llama3.1-8B-Instruct``, ``Llama-4-Scout-17B-16E-Instruct``) and Hugging Face form
(``meta-llama/Llama-3.1-8B-Instruct``), case-insensitively, with variant suffixes (``:fp8``) ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from workbench.errors import InputError

ToolStyle = Literal["llama3_1", "llama3_2"]
ChatFamily = Literal["llama3", "llama4"]

_VERSION_RE = re.compile(r"llama[-_ ]?(\d+)(?:[._](\d+))?", re.IGNORECASE)
_EXAMPLES = "'Llama3.1-8B-Instruct', 'Llama3.2-3B-Instruct', 'Llama-4-Scout-17B-16E-Instruct' or 'meta-llama/...'"


@dataclass(frozen=True)
class ModelInfo:
    """What a model name means for prompting.

    ``tool_style`` is None for models that were not trained for tool calling (Llama 3.0, Llama Guard):
    giving them tools is an error rather than a silently ignored request.
    """

    name: str | None
    version: str
    vision: bool = False
    guard: bool = False

    @property
    def tool_style(self) -> ToolStyle | None:
        if self.guard or self.version in ("2", "3"):
            return None
        if self.version == "3.1" or (self.version == "3.2" and self.vision):
            return "llama3_1"
        return "llama3_2"

    @property
    def default_tool_prompt_format(self) -> str:
        """The call syntax the model was trained to write (json for 3.1-style, python_list otherwise)."""
        return "json" if self.tool_style in ("llama3_1", None) else "python_list"

    @property
    def chat_family(self) -> ChatFamily:
        return "llama4" if self.version == "4" else "llama3"


def resolve_model(name: str | None, tokenizer_family: str = "llama3") -> ModelInfo:
    """Parse a model name into a :class:`ModelInfo`; without a name, infer it from the tokenizer family.

    A nameless Llama 3 tokenizer means the 3.2/3.3 prompt format (the most recent Llama 3 text format).
    """
    if name is None:
        return ModelInfo(name=None, version="4" if tokenizer_family == "llama4" else "3.2")
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"model name must be a non-empty string like {_EXAMPLES}, got {name!r}")
    base = name.strip().split("/")[-1].split(":")[0]
    lowered = base.lower()
    guard = "guard" in lowered
    match = _VERSION_RE.search(lowered)
    if guard and match is None:
        return ModelInfo(name=name, version="3", guard=True)
    if match is None:
        raise InputError(
            f"cannot tell which Llama generation {name!r} is; name the model like {_EXAMPLES} "
            "(the name selects the prompt format)"
        )
    major, minor = match.group(1), match.group(2)
    if major == "2":
        raise InputError(f"{name!r} is a Llama 2 model; workbench supports Llama 3.x and Llama 4 prompt formats")
    if major == "4":
        version = "4"
    elif major == "3":
        version = "3" if minor is None else f"3.{minor}"
        if version not in ("3", "3.1", "3.2", "3.3"):
            raise InputError(f"unknown Llama version in {name!r}; expected one of 3, 3.1, 3.2, 3.3 or 4")
    else:
        raise InputError(f"unknown Llama version in {name!r}; expected one of 3, 3.1, 3.2, 3.3 or 4")
    return ModelInfo(name=name, version=version, vision="vision" in lowered, guard=guard)
