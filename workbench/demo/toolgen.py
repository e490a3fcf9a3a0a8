"""Generated tools: thousands of invented tools, so the demo model learns to read a schema, not a tool list.

The first trained demo model knew 14 tools.  Offered ``convert_currency(amount, source, target)`` it called
the right tool with its training names (``from_currency``, ``to_currency``): it had learned the tools, not
how to read their definitions.  Here every tool is drawn from parts: a verb, a subject (real or made-up
words), an entity parameter, 0-3 extra parameters of every JSON type (string, integer, number, boolean,
an ``enum`` of strings; some optional) or a from/to pair, a description and a result shape (a string, a
number or a JSON object).  The words that name a parameter appear in the questions about it, so what the
model must learn is to match question words to the offered schema and copy the values.

**Held out by construction:** every word bank (subjects, entities, parameter words, enum options, pair
names) is cut 3:1 like the value pools, and made-up words start with different syllables in the two
splits, so no held-out tool shares its name, subject or made-up parameter word with a training tool.
``workbench.evals`` asks about the held-out bank (``--tools unseen``).
"""

from __future__ import annotations

import hashlib
import inspect
import random
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from workbench.demo.tools import DEMO_TOOLS
from workbench.formats import ToolDefinition, coerce_tool

SPLITS = ("train", "heldout")
# how many tools each split's bank holds (the training bank is what "thousands of tools" means)
BANK_SIZE = {"train": 4000, "heldout": 400}


def _cut(words: str, split: str, spaces: bool = True) -> tuple[str, ...]:
    """Every fourth word held out (deduplicated first, so a repeated word cannot land in both); ``_`` becomes
    a space unless ``spaces`` is false (names kept as they are)."""
    items = list(dict.fromkeys(words.split()))
    return tuple(
        w.replace("_", " ") if spaces else w for i, w in enumerate(items) if (i % 4 == 3) == (split == "heldout")
    )


# subjects: what a tool reports on or acts upon ("humidity index", "vornik score")
_SUBJECT_WORDS = """humidity traffic inventory latency rainfall pollen noise energy water_quality air_quality
parking occupancy ticket shipping freight tide wind snow wave solar battery voltage signal bandwidth storage
memory backup license warranty mileage fuel crop soil harvest cargo crowd queue booking menu recipe dosage
calorie sleep heart_rate step membership loyalty credit budget expense invoice payroll tax rent mortgage
insurance pension audit compliance safety risk fraud spam delivery return refund order stock supply demand
pricing discount coupon rating review feedback survey attendance enrollment grade exam course library museum
gallery concert festival stadium arena transit subway ferry bike scooter charging elevator lighting heating
cooling ventilation plumbing roofing paint lumber tile glass steel copper""".replace("\n", " ")
_SUBJECT_HEADS = """score level index report status forecast summary rate total count estimate history
schedule quota balance limit reading trend profile usage capacity""".replace("\n", " ")
_ENTITIES = """warehouse team satellite account device route planet store branch vessel sensor station
project customer vehicle building region district school patient clinic farm field server cluster factory
hotel restaurant airport harbor bridge tunnel park lake river mountain island village campus office
department market portfolio fleet drone robot tower pipeline reservoir""".replace("\n", " ")
# extra parameters: the words that name them (and how questions mention them)
_STRING_WORDS = """category label owner language channel format color material brand author genre
country zone sector platform carrier supplier vendor model flavor topic keyword tag""".replace("\n", " ")
_INT_WORDS = """year limit days nights guests seats floor level rooms copies pages weeks hours
month quantity tickets players rank attempts threshold depth""".replace("\n", " ")
_NUMBER_WORDS = """weight height width radius budget price distance temperature speed ratio latitude
longitude altitude volume pressure duration""".replace("\n", " ")
_BOOL_WORDS = """history details archived extras photos taxes fees comments metadata forecast
drafts alerts totals samples notes""".replace("\n", " ")
_ENUM_WORDS = """mode priority size unit period tier region_type sort_order detail_level speed_class
frequency method style quality""".replace("\n", " ")
_ENUM_OPTIONS = """fast slow daily weekly monthly yearly low medium high metric imperial small large
basic premium standard express economy annual hourly compact full brief north south east west
ascending descending urgent normal coarse fine strict loose""".replace("\n", " ")
# from/to pairs: (from, to) names a conversion tool's schema may use; each pair is one word of the bank
_PAIRS = """from_unit,to_unit source,target from_code,to_code src,dst origin,destination base,quote
input_unit,output_unit start,end convert_from,convert_to from_scale,to_scale in_unit,out_unit
from_format,to_format""".replace("\n", " ")
_AMOUNT_NAMES = "amount value quantity qty figure magnitude measure number"
_ID_SUFFIXES = ("", "", "_name", "_id", "_code")
_RESULT_FIELDS = """status level count updated code trend share grade total owner label state note
remaining used capacity""".replace("\n", " ")
_STATUS_WORDS = """green amber red stable rising falling steady open closed pending active idle normal
elevated critical nominal degraded clear""".replace("\n", " ")

_VERBS = {
    "get": ("get", "fetch", "lookup", "check", "query", "read", "find", "compute", "estimate", "report"),
    "act": ("schedule", "create", "reserve", "register", "cancel", "submit", "request", "renew"),
}
# made-up words: training ones start with one half of the syllables, held-out ones with the other
_SYLLABLES = """ka ko ku la le li lo lu ma me mi mo mu na ne ni no nu pa pe pi po ra re ri ro ru sa se si so
su ta te ti to tu va ve vi vo za ze zi zo ba be bi bo bu da de di do du fa fe fi fo gu ha he hi ho""".split()
_TAILS = "n r l s k m x th nd rk lt st".split()


def made_up(rng: random.Random, split: str) -> str:
    """A made-up lower-case word (2-3 syllables); its first syllable tells its split."""
    half = len(_SYLLABLES) // 2
    first = _SYLLABLES[:half] if split == "train" else _SYLLABLES[half:]
    while True:
        word = rng.choice(first) + "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 2)))
        word += rng.choice(_TAILS) if rng.random() < 0.5 else ""
        if word not in _real_words():  # "ti" + "de" must not make a real word of the other split
            return word


@cache
def _real_words() -> frozenset[str]:
    banks = (
        _SUBJECT_WORDS,
        _SUBJECT_HEADS,
        _ENTITIES,
        _STRING_WORDS,
        _INT_WORDS,
        _NUMBER_WORDS,
        _BOOL_WORDS,
        _ENUM_WORDS,
        _ENUM_OPTIONS,
        _AMOUNT_NAMES,
        _RESULT_FIELDS,
        _STATUS_WORDS,
    )
    return frozenset(w for bank in banks for w in bank.replace("_", " ").split())


@dataclass(frozen=True)
class GenParam:
    """One parameter of a generated tool: its schema and how a question mentions it."""

    name: str
    kind: str  # "entity" | "string" | "integer" | "number" | "boolean" | "enum" | "from" | "to" | "amount"
    words: str  # the words questions use for it ("max depth", "warehouse")
    description: str
    required: bool = True
    options: tuple[str, ...] = ()  # enum values

    def json_schema(self) -> dict[str, Any]:
        types = {
            "entity": "string",
            "string": "string",
            "enum": "string",
            "from": "string",
            "to": "string",
            "integer": "integer",
            "number": "number",
            "amount": "number",
            "boolean": "boolean",
        }
        out: dict[str, Any] = {"type": types[self.kind], "description": self.description}
        if self.options:
            out["enum"] = list(self.options)
        return out


@dataclass(frozen=True)
class GeneratedTool:
    """An invented tool: OpenAI-style schema, a deterministic implementation, the words questions use."""

    name: str
    form: str  # "get" (reports on an entity), "act" (does something to it) or "convert"
    verb: str
    subject: str  # task words: "humidity index", "vornik score"
    entity: str  # what the first parameter names ("warehouse"); the measured thing for "convert"
    description: str
    params: tuple[GenParam, ...]
    result: str  # "string" | "number" | "object"
    result_fields: tuple[str, ...] = ()  # keys of an object result
    split: str = "train"
    _definition: list[ToolDefinition] = field(default_factory=list, compare=False, repr=False)

    def schema(self) -> dict[str, Any]:
        """The tool as an OpenAI-style function definition (JSON Schema parameters)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {p.name: p.json_schema() for p in self.params},
                    "required": [p.name for p in self.params if p.required],
                },
            },
        }

    def definition(self) -> ToolDefinition:
        """The tool as the formatter and :class:`workbench.tools.Toolbox` take it, with its implementation
        (so the harness and the tool loop run it like any user tool); built once."""
        if not self._definition:
            parsed = coerce_tool(self.schema())
            self._definition.append(
                ToolDefinition(parsed.tool_name, parsed.description, parsed.parameters, function=_Implementation(self))
            )
        return self._definition[0]

    def __call__(self, **arguments: Any) -> str | float | int | dict[str, Any]:
        """The result: a deterministic function of the tool and its arguments (as the demo tools are)."""
        n = _pick(self.name, *(f"{k}={arguments[k]}" for k in sorted(arguments)))
        if self.result == "number":
            return round(n % 100000 / 100, 2) if n % 3 else n % 5000
        if self.result == "string":
            if self.form == "act":
                return f"{self.subject} {_code(n)} confirmed"
            return _STATUS_WORDS.split()[n % len(_STATUS_WORDS.split())]
        return {key: _field_value(key, n >> (7 * i)) for i, key in enumerate(self.result_fields)}


class _Implementation:
    """A generated tool's Python implementation, with the real signature (so the tool loop's argument check
    names the expected parameters, as for a user's function)."""

    def __init__(self, tool: GeneratedTool) -> None:
        self.tool = tool
        self.__name__ = tool.name
        params = [
            inspect.Parameter(
                p.name, inspect.Parameter.KEYWORD_ONLY, default=inspect.Parameter.empty if p.required else None
            )
            for p in tool.params
        ]
        self.__signature__ = inspect.Signature(sorted(params, key=lambda p: p.default is not inspect.Parameter.empty))

    def __call__(self, **arguments: Any) -> Any:
        return self.tool(**{k: v for k, v in arguments.items() if v is not None})


def _pick(*parts: object) -> int:
    """A stable integer for the parts (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big")


def _code(n: int) -> str:
    return f"{chr(65 + n % 26)}{chr(65 + n // 26 % 26)}-{n % 9000 + 1000}"


def _field_value(key: str, n: int) -> str | int | float:
    if key in ("status", "trend", "state", "grade", "label"):
        return _STATUS_WORDS.split()[n % len(_STATUS_WORDS.split())]
    if key in ("code", "owner", "note"):
        return _code(n)
    if key in ("share", "used", "remaining"):
        return round(n % 10000 / 100, 1)
    if key == "updated":
        return f"2026-{n % 12 + 1:02d}-{n // 12 % 28 + 1:02d}"
    return n % 1000


def _snake(words: str, camel: bool) -> str:
    parts = words.replace("-", " ").split()
    return parts[0] + "".join(p.capitalize() for p in parts[1:]) if camel else "_".join(parts)


def _word(bank: str, rng: random.Random, split: str, made_up_share: float = 0.3) -> str:
    if rng.random() < made_up_share:
        return made_up(rng, split)
    return rng.choice(_cut(bank, split))


def draw_tool(rng: random.Random, split: str) -> GeneratedTool:
    """One generated tool of ``split`` (names, types and descriptions all drawn from that split's banks)."""
    camel = rng.random() < 0.1
    roll = rng.random()
    form = "convert" if roll < 0.12 else "act" if roll < 0.3 else "get"
    head = rng.choice(_cut(_SUBJECT_HEADS, "train"))  # the heads are shared: the subject word tells the split
    subject_word = _word(_SUBJECT_WORDS, rng, split, 0.4)
    subject = subject_word if form == "convert" else f"{subject_word} {head}"
    entity = _word(_ENTITIES, rng, split, 0.25)
    params: list[GenParam] = []
    if form == "convert":
        verb = "convert"
        name = _snake(f"convert {subject}", camel) if rng.random() < 0.7 else _snake(f"{subject} converter", camel)
        pair = rng.choice(_cut(_PAIRS, split, spaces=False)).split(",")
        amount = rng.choice(_AMOUNT_NAMES.split())
        params = [
            GenParam(_snake(amount, camel), "amount", amount, f"The {amount} of {subject} to convert."),
            GenParam(pair[0], "from", "from", f"Unit of {subject} to convert from."),
            GenParam(pair[1], "to", "to", f"Unit of {subject} to convert to."),
        ]
        description = f"Convert an amount of {subject} from one unit to another."
    else:
        verb = rng.choice(_VERBS[form])
        name = _snake(f"{verb} {subject}" if rng.random() < 0.85 else subject, camel)
        entity_name = _snake(entity, camel) + (rng.choice(_ID_SUFFIXES) if " " not in entity else "")
        if camel and entity_name.endswith(("_name", "_id", "_code")):
            stem, _, suffix = entity_name.rpartition("_")
            entity_name = stem + suffix.capitalize()
        article = "an" if entity[0] in "aeiou" else "a"
        params = [
            GenParam(
                entity_name,
                "entity",
                entity,
                rng.choice(
                    (
                        f"Name of the {entity}.",
                        f"The {entity} to use.",
                        f"Which {entity}.",
                        f"Identifier of the {entity}.",
                    )
                ),
            )
        ]
        taken = {entity_name}
        for _ in range(rng.choices((0, 1, 2, 3), (0.25, 0.35, 0.25, 0.15))[0]):
            param = _extra_param(rng, split, camel)
            if param.name not in taken:
                taken.add(param.name)
                params.append(param)
        if form == "get":
            description = f"{verb.capitalize()} the {subject} of {article} {entity}."
        else:
            description = f"{verb.capitalize()} a {subject} for {article} {entity}."
    if rng.random() < 0.3:
        description += " " + rng.choice(
            (
                "Results are updated hourly.",
                "Use it before planning.",
                "Returns the latest data.",
                "Needs no login.",
                "Data may lag a day.",
            )
        )
    result = rng.choices(("string", "number", "object"), (0.35, 0.3, 0.35))[0]
    fields: tuple[str, ...] = ()
    if form == "convert":
        result = "number"
    elif result == "object":
        fields = tuple(rng.sample(_RESULT_FIELDS.split(), rng.randint(2, 3)))
    return GeneratedTool(name, form, verb, subject, entity, description, tuple(params), result, fields, split)


def _extra_param(rng: random.Random, split: str, camel: bool) -> GenParam:
    kind = rng.choices(("string", "integer", "number", "boolean", "enum"), (0.25, 0.25, 0.15, 0.12, 0.23))[0]
    bank = {
        "string": _STRING_WORDS,
        "integer": _INT_WORDS,
        "number": _NUMBER_WORDS,
        "boolean": _BOOL_WORDS,
        "enum": _ENUM_WORDS,
    }[kind]
    words = _word(bank, rng, split, 0.2)
    if kind != "boolean" and rng.random() < 0.2:
        words = f"{rng.choice(('max', 'min', 'target', 'preferred'))} {words}"
    required = kind not in ("boolean",) and rng.random() < 0.7
    if kind == "boolean":
        name = _snake(f"{rng.choice(('include', 'with', 'show'))} {words}", camel)
        return GenParam(name, kind, words, f"Whether to include {words}.", required=False)
    options: tuple[str, ...] = ()
    description = f"The {words}."
    if kind == "enum":
        pool = list(_cut(_ENUM_OPTIONS, split))
        options = tuple(rng.sample(pool, rng.randint(2, 4)))
        if rng.random() < 0.3:
            options = (*options[:-1], made_up(rng, split))
        description = f"The {words}, one of: {', '.join(options)}."
    elif kind == "integer":
        description = f"The {words}, a whole number."
    return GenParam(_snake(words, camel), kind, words, description, required=required, options=options)


@cache
def tool_bank(split: str, size: int | None = None) -> tuple[GeneratedTool, ...]:
    """The generated tools of ``split``: deterministic, names unique, disjoint from the other split's
    (held out by construction; :func:`check_disjoint` proves it for the banks in use)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    size = BANK_SIZE[split] if size is None else size
    rng = random.Random(f"workbench-toolgen-{split}")
    tools: dict[str, GeneratedTool] = {}
    while len(tools) < size:
        tool = draw_tool(rng, split)
        if tool.name not in tools and tool.name not in DEMO_TOOLS:  # the demo tools' names are never generated
            tools[tool.name] = tool
    return tuple(tools.values())


def check_disjoint(train: tuple[GeneratedTool, ...], heldout: tuple[GeneratedTool, ...]) -> None:
    """Raise ``AssertionError`` naming the first shared tool name or subject between the two banks."""
    names = {t.name for t in train} & {t.name for t in heldout}
    subjects = {t.subject for t in train} & {t.subject for t in heldout}
    if names or subjects:
        raise AssertionError(
            f"held-out tools overlap the training tools: names {sorted(names)[:5]}, subjects {sorted(subjects)[:5]}"
        )
