"""Composed training questions: interchangeable parts around each tool's task words.

A handful of fixed templates per tool teaches a tiny model those sentences, not the task: it then
fails on any other wording (the first shipped model scored 52% tool-name match on held-out phrasings
against near-perfect on its own).  Here a training question is composed from parts: an optional
opener ("Quick question:"), an optional context sentence, a request verb ("Could you check",
"I'd like to know"), a noun phrase that carries the task words and the argument values ("the
weather in {city}"), an optional tail ("for me", "right now") and an ending; or one of the tool's
fixed training templates with an opener and a tail.  That gives thousands of distinct sentences
per tool, so what is left for the model to learn is the task words and where the values are.

The held-out templates (``templates.SPECS[...].heldout``) are never produced: a composed sentence
that happens to equal one of them (after case and punctuation are ignored) is drawn again.
"""

from __future__ import annotations

import random
import re
from typing import Any

from workbench.demo.templates import SPECS

OPENERS = (
    "Hi. ",
    "Hello! ",
    "Hey, ",
    "Quick question: ",
    "Excuse me, ",
    "Good morning. ",
    "OK, ",
    "So, ",
    "Alright. ",
    "Hi there! ",
    "Question for you: ",
    "Help me out: ",
    "Good evening. ",
    "Hey there. ",
    "One more thing: ",
    "Next question: ",
    "Sorry to bother you, but ",
    "Hello again. ",
    "Well, ",
    "Now, ",
    "By the way, ",
    "Also, ",
    "Right, ",
    "Morning! ",
    "Hmm, ",
)

CONTEXTS = (
    "I have a question.",
    "This is for work.",
    "My friend asked me this.",
    "I am planning my day.",
    "I am curious.",
    "It is for a school project.",
    "I need this for a report.",
    "My boss wants to know.",
    "I am busy today.",
    "I just got back home.",
    "We are having a small debate here.",
    "I was thinking.",
    "This is important.",
    "I am at the office.",
    "It is urgent.",
    "I am sitting in a cafe.",
    "My sister is asking.",
    "I am writing a note.",
    "I keep forgetting things.",
    "Just wondering.",
)

# request verbs that take a noun phrase; the ending follows from the first word
REQUESTS = (
    "Tell me",
    "Give me",
    "Show me",
    "Find",
    "Look up",
    "Check",
    "Get me",
    "Fetch",
    "Find out",
    "I'd like to know",
    "I want to know",
    "Let me know",
    "Can you tell me",
    "Could you tell me",
    "Can you check",
    "Could you check",
    "Can you find",
    "Could you get me",
    "Would you look up",
    "Please tell me",
    "Please check",
    "Please find",
    "Please get me",
    "I need",
    "I would like",
    "Can I get",
    "Could I have",
    "Do you know",
    "Help me find",
    "Search for",
    "Can you look up",
    "Would you find",
    "I am looking for",
    "Please look up",
    "What about",
    "Any idea about",
)

# tools whose requests take their own verbs ("Set a reminder", "Book a flight")
OWN_REQUESTS: dict[str, tuple[str, ...]] = {
    "set_reminder": (
        "Set",
        "Please set",
        "Can you set",
        "Could you set",
        "Create",
        "I need",
        "Add",
        "Make",
        "Would you set",
        "I want",
    ),
    "book_flight": (
        "Book",
        "Please book",
        "Can you book",
        "Could you book",
        "Reserve",
        "Get me",
        "I need",
        "I want",
        "Would you book",
        "Find and book",
    ),
}

TAILS = (
    "",
    "",
    "",
    " please",
    " now",
    " right now",
    " for me",
    " today",
    ", thanks",
    " if you can",
    " quickly",
    ", please",
    " again",
    " real quick",
)

# noun phrases that carry each tool's task words; fields are the tool's parameters
OBJECTS: dict[str, tuple[str, ...]] = {
    "get_weather": (
        "the weather in {city}",
        "the weather for {city}",
        "the current weather in {city}",
        "today's weather in {city}",
        "the weather forecast for {city}",
        "the weather at {city}",
        "the weather conditions in {city}",
        "how the weather is in {city}",
        "{city} weather",
    ),
    "convert_currency": (
        "{amount} {from_currency} in {to_currency}",
        "{amount} {from_currency} converted to {to_currency}",
        "the value of {amount} {from_currency} in {to_currency}",
        "how many {to_currency} I get for {amount} {from_currency}",
        "{amount} {from_currency} to {to_currency}",
        "a conversion of {amount} {from_currency} to {to_currency}",
    ),
    "convert_units": (
        "{value} {from_unit} in {to_unit}",
        "{value} {from_unit} converted to {to_unit}",
        "how many {to_unit} make {value} {from_unit}",
        "{value} {from_unit} expressed in {to_unit}",
        "the conversion of {value} {from_unit} to {to_unit}",
        "{value} {from_unit} to {to_unit}",
    ),
    "get_local_time": (
        "the time in {city}",
        "the local time in {city}",
        "the current time in {city}",
        "what time it is in {city}",
        "the time right now in {city}",
        "the clock time in {city}",
        "{city} local time",
        "the hour in {city}",
    ),
    "get_population": (
        "the population of {country}",
        "how many people live in {country}",
        "the number of people in {country}",
        "the current population of {country}",
        "{country}'s population",
        "the population count of {country}",
    ),
    "get_stock_price": (
        "the stock price of {symbol}",
        "the price of {symbol} stock",
        "the share price of {symbol}",
        "the current price of {symbol}",
        "a quote for {symbol}",
        "what {symbol} is trading at",
        "the {symbol} stock price",
        "the latest price of {symbol}",
    ),
    "translate_word": (
        "the word {word} in {language}",
        "{word} translated into {language}",
        "the {language} translation of {word}",
        "how to say {word} in {language}",
        "the {language} word for {word}",
        "a translation of {word} to {language}",
    ),
    "get_user_email": (
        "the email of {name}",
        "the email address of {name}",
        "{name}'s email address",
        "the email for {name}",
        "an email address for {name}",
        "{name}'s email",
        "the contact email of {name}",
    ),
    "calculate_tip": (
        "a {percent} percent tip on {bill}",
        "the tip on {bill} at {percent} percent",
        "a {percent}% tip for {bill}",
        "how much to tip on {bill} at {percent}%",
        "the {percent} percent tip for a bill of {bill}",
        "a tip of {percent} percent on {bill}",
    ),
    "set_reminder": (
        "a reminder to {text} in {minutes} minutes",
        "a reminder in {minutes} minutes to {text}",
        "me a reminder to {text} in {minutes} minutes",
    ),
    "book_flight": (
        "a flight from {origin} to {destination} on {date}",
        "a plane ticket from {origin} to {destination} for {date}",
        "a flight on {date} from {origin} to {destination}",
        "flights from {origin} to {destination} on {date}",
    ),
    "is_prime": (
        "whether {number} is prime",
        "if {number} is a prime number",
        "whether {number} is a prime",
        "if {number} is prime",
        "whether or not {number} is prime",
    ),
    "get_random_joke": ("a joke", "a funny joke", "a good joke", "a random joke", "a short joke", "some joke"),
    "get_capital": (
        "the capital of {country}",
        "the capital city of {country}",
        "{country}'s capital",
        "the name of the capital of {country}",
        "which city is the capital of {country}",
        "the capital of the country {country}",
    ),
}

# a first sentence that names a value, then a question about it ("there", "that")
SETUPS: dict[str, tuple[tuple[str, str], ...]] = {
    "get_weather": (
        ("I am travelling to {city} tomorrow.", "What is the weather like there?"),
        ("My parents live in {city}.", "How is the weather there today?"),
        ("We fly to {city} soon.", "Is the weather there good?"),
    ),
    "get_local_time": (
        ("My brother lives in {city}.", "What time is it there now?"),
        ("I have a meeting with a team in {city}.", "What is the local time there?"),
    ),
    "convert_currency": (("I have {amount} {from_currency} left.", "What is that in {to_currency}?"),),
    "convert_units": (("The recipe says {value} {from_unit}.", "How much is that in {to_unit}?"),),
    "get_population": (("I am reading about {country}.", "What is its population?"),),
    "get_capital": (("I am reading about {country}.", "What is its capital?"),),
    "get_stock_price": (("I own some {symbol} shares.", "What is the stock price now?"),),
    "get_user_email": (("I have to contact {name}.", "What is the email address?"),),
    "calculate_tip": (("Dinner cost {bill}.", "How much is a {percent} percent tip?"),),
    "is_prime": (("My lucky number is {number}.", "Is it prime?"),),
    "translate_word": (("I am learning {language}.", "How do I say {word}?"),),
}


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9{}_ ]", "", text.lower()).strip()


_HELDOUT = {_norm(t) for spec in SPECS.values() for t in spec.heldout}


def _ending(request: str, rng: random.Random) -> str:
    asks = request.split()[0] in ("Can", "Could", "Would", "Do", "What", "Any")
    return "?" if asks else rng.choice((".", ".", "!"))


def compose(tool: str, rng: random.Random) -> str:
    """A training question template for ``tool`` (fields still unfilled), never a held-out one."""
    spec = SPECS[tool]
    for _ in range(50):
        text = _draw(tool, spec.train, rng)
        if _norm(text) not in _HELDOUT:
            return text
    return rng.choice(spec.train)


def _draw(tool: str, fixed: tuple[str, ...], rng: random.Random) -> str:
    opener = rng.choice(OPENERS) if rng.random() < 0.35 else ""
    context = rng.choice(CONTEXTS) + " " if rng.random() < 0.2 else ""
    form = rng.random()
    if form < 0.15 and tool in SETUPS:
        first, then = rng.choice(SETUPS[tool])
        body = f"{first} {then}"
    elif form < 0.45:
        body = rng.choice(fixed)
        tail = rng.choice(TAILS)
        if tail and body[-1] in ".?!":
            body = body[:-1] + tail + body[-1]
    else:
        request = rng.choice(OWN_REQUESTS.get(tool, REQUESTS))
        body = f"{request} {rng.choice(OBJECTS[tool])}{rng.choice(TAILS)}{_ending(request, rng)}"
    if opener and not opener.endswith(("but ", ", ")):
        text = f"{opener}{context}{body}"
    elif opener:
        keep = body.startswith(("I ", "I'", "{"))
        text = f"{opener}{context}{body if keep else body[0].lower() + body[1:]}"
    else:
        text = f"{context}{body}"
    if rng.random() < 0.08:  # casual typing: no capital, no final punctuation
        text = text[0].lower() + text[1:].rstrip(".?!")
    return text


def train_question(tool: str, args: dict[str, Any], rng: random.Random) -> str:
    return compose(tool, rng).format(**args)
