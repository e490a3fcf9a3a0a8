"""Structured output: ``response_format`` (JSON schema, pydantic model, grammar, regex) and constrained tool
calls, enforced token by token with llguidance masks (see docs/architecture.md, "Structured output")."""

from workbench.structured.spec import Constraint, OutputFormat, coerce_response_format, per_row_formats
from workbench.structured.tool_calls import tool_call_format

__all__ = ["Constraint", "OutputFormat", "coerce_response_format", "per_row_formats", "tool_call_format"]
