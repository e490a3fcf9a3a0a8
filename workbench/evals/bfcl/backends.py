"""BFCL's stateful tool backends for one multi-turn entry, and calls run on them by name — never ``eval``.

BFCL runs a model's calls by ``eval``-ing its text against module globals; workbench runs a parsed call
(a name and a dict of arguments) as ``getattr(instance, name)(**arguments)`` on the entry's own instances, and
answers with BFCL's result strings: a ``str`` as is, a ``dict`` as JSON (``str`` if it is not JSON), anything else
``str()``; a failing call, an unknown or private name, a method of a class the entry does not involve, or bad
arguments give BFCL's ``"Error during execution: ..."`` with the message BFCL's ``eval`` would have raised
(``name 'x' is not defined`` for a name no instance offers, Python's own ``TypeError`` for bad arguments).

The checker (:mod:`.multi_turn_check`) is BFCL's, and it executes call *strings*; :func:`call_string` rebuilds one
from a parsed call — the name and each argument's ``repr`` — so the checker never sees model text.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
from typing import Any

from .package import bfcl

#: The names BFCL refuses before ``eval`` (its ``execute_multi_turn_func_call``), refused the same way here.
_REFUSED = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")


def backend_config() -> Any:
    """BFCL's ``executable_backend_config`` module (class → module path, stateless classes)."""
    bfcl()
    return importlib.import_module("bfcl_eval.constants.executable_backend_config")


class Backends:
    """One instance per class the entry involves, loaded from its ``initial_config`` as BFCL loads them."""

    def __init__(self, involved_classes: list[str], initial_config: dict[str, Any], long_context: bool) -> None:
        config = backend_config()
        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Any] = {}  # method name -> bound method (a later class wins, as in BFCL)
        for class_name in involved_classes:
            module = importlib.import_module(config.CLASS_FILE_PATH_MAPPING[class_name])
            instance = getattr(module, class_name)()
            if class_name not in config.STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(initial_config.get(class_name, {})), long_context=long_context)
            self.instances[class_name] = instance
            for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self.methods[name] = method

    @classmethod
    def for_entry(cls, entry: dict[str, Any]) -> Backends:
        category = entry["id"].rsplit("_", 1)[0]
        return cls(entry["involved_classes"], entry.get("initial_config", {}), "long_context" in category)

    def execute(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one parsed call; BFCL's result string (an error string when the call fails — never raises)."""
        try:
            if name in _REFUSED:
                raise PermissionError(f"Function call {name} is not allowed.")
            method = self.methods.get(name) if isinstance(name, str) else None
            if method is None:  # what eval of an unknown (or private, or another class's) name raises
                raise NameError(f"name {name!r} is not defined")
            if not isinstance(arguments, dict) or not all(isinstance(k, str) for k in arguments):
                raise TypeError(f"{name}() arguments must be keyword arguments, got {arguments!r:.80}")
            result = method(**arguments)
        except Exception as exc:  # noqa: BLE001 - BFCL records every failure of a call as its result
            return f"Error during execution: {exc}"
        if type(result) is str:
            return result
        if type(result) is dict:
            try:
                return json.dumps(result)
            except (TypeError, ValueError):
                return str(result)
        return str(result)

    def state(self) -> dict[str, dict[str, Any]]:
        """The public attributes of every stateful instance (what BFCL's state check compares), deep-copied."""
        stateless = backend_config().STATELESS_CLASSES
        return {
            name: {k: copy.deepcopy(v) for k, v in vars(instance).items() if not k.startswith("_")}
            for name, instance in self.instances.items()
            if name not in stateless
        }


def call_string(name: str, arguments: dict[str, Any]) -> str:
    """A call as the string BFCL's checker executes: the name and each argument as its Python literal."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"
