"""Question and answer templates for each demo tool, split into train and held-out phrasings.

Held-out phrasings keep the words that name the task ("weather", "capital", "tip"...) and change the
sentence around them: a model trained from scratch on a few thousand dialogs knows no synonyms, so
"do I need an umbrella" would test world knowledge it cannot have, not generalisation of the format.

A template's ``{name}`` fields are the tool's parameters; ``sample`` draws their values from a
:class:`~workbench.demo.pools.ValuePools`.  The held-out phrasings are never used for training: the
evaluation set asks its questions with them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.demo.pools import ValuePools


@dataclass(frozen=True)
class ToolSpec:
    name: str
    sample: Callable[[ValuePools], dict[str, Any]]
    train: tuple[str, ...]
    heldout: tuple[str, ...]
    answer: str  # final answer; {result} is the tool's output, other fields are the arguments

    def questions(self, split: str) -> tuple[str, ...]:
        return self.train if split == "train" else self.heldout


SPECS: dict[str, ToolSpec] = {
    s.name: s
    for s in (
        ToolSpec(
            "get_weather",
            lambda p: {"city": p.city()},
            (
                "What's the weather in {city}?",
                "How is the weather in {city} today?",
                "Weather in {city}, please.",
                "Is it cold in {city} right now?",
                "Tell me the current weather for {city}.",
                "What is it like outside in {city}?",
                "Can you check the weather in {city}?",
            ),
            (
                "I'm heading to {city}, how is the weather there?",
                "Give me the weather report for {city}.",
                "Could you look up the weather for {city}?",
            ),
            "The weather in {city} is {result}.",
        ),
        ToolSpec(
            "convert_currency",
            lambda p: {"amount": p.amount(), "from_currency": p.currency(), "to_currency": p.currency()},
            (
                "Convert {amount} {from_currency} to {to_currency}.",
                "How much is {amount} {from_currency} in {to_currency}?",
                "What is {amount} {from_currency} worth in {to_currency}?",
                "Change {amount} {from_currency} into {to_currency}.",
                "I have {amount} {from_currency}. How many {to_currency} is that?",
            ),
            (
                "Please exchange {amount} {from_currency} for {to_currency}.",
                "{amount} {from_currency} equals how many {to_currency}?",
            ),
            "{amount} {from_currency} is {result}.",
        ),
        ToolSpec(
            "convert_units",
            lambda p: {"value": p.amount(), "from_unit": p.unit(), "to_unit": p.unit()},
            (
                "Convert {value} {from_unit} to {to_unit}.",
                "How many {to_unit} are {value} {from_unit}?",
                "What is {value} {from_unit} in {to_unit}?",
                "Express {value} {from_unit} in {to_unit}.",
            ),
            (
                "I measured {value} {from_unit}. What is that in {to_unit}?",
                "{value} {from_unit} equals how many {to_unit}?",
            ),
            "{value} {from_unit} is {result}.",
        ),
        ToolSpec(
            "get_local_time",
            lambda p: {"city": p.city()},
            (
                "What time is it in {city}?",
                "What's the local time in {city}?",
                "Tell me the current time in {city}.",
                "Can you check the time in {city}?",
                "Current time in {city}?",
            ),
            ("I need to call someone in {city}. What time is it there?", "Please tell me the time in {city} now."),
            "The local time in {city} is {result}.",
        ),
        ToolSpec(
            "get_population",
            lambda p: {"country": p.country()},
            (
                "What is the population of {country}?",
                "How many people live in {country}?",
                "Tell me the population of {country}.",
                "Population of {country}?",
            ),
            ("Roughly what is the population of {country}?", "I wonder how many people live in {country}."),
            "The population of {country} is {result}.",
        ),
        ToolSpec(
            "get_stock_price",
            lambda p: {"symbol": p.symbol()},
            (
                "What is the stock price of {symbol}?",
                "How much is {symbol} trading at?",
                "Get me the price of {symbol}.",
                "Check the share price for {symbol}.",
                "Latest quote for {symbol}?",
            ),
            ("What is the share price of {symbol} right now?", "Look up the stock price for {symbol}."),
            "{symbol} is trading at {result}.",
        ),
        ToolSpec(
            "translate_word",
            lambda p: {"word": p.word(), "language": p.language()},
            (
                "Translate {word} into {language}.",
                "How do you say {word} in {language}?",
                "What is the {language} word for {word}?",
                "Give me {word} in {language}.",
            ),
            ("Please translate {word} to {language}.", "I need the word {word} in {language}."),
            "In {language}, {word} is {result}.",
        ),
        ToolSpec(
            "get_user_email",
            lambda p: {"name": p.person()},
            (
                "What is the email address of {name}?",
                "Find the email of {name}.",
                "Look up {name}'s email.",
                "How can I email {name}?",
                "Get me the email for {name}.",
            ),
            ("I need to write to {name}. What is their email?", "Which email address does {name} use?"),
            "The email address of {name} is {result}.",
        ),
        ToolSpec(
            "calculate_tip",
            lambda p: {"bill": p.amount(), "percent": p.percent()},
            (
                "What is a {percent} percent tip on {bill}?",
                "Calculate a {percent}% tip for a bill of {bill}.",
                "How much should I tip on {bill} at {percent} percent?",
                "Tip of {percent} percent on {bill}?",
            ),
            ("My bill is {bill}. What tip is {percent} percent?", "Work out a {percent}% tip on {bill}."),
            "A {percent}% tip on {bill} is {result}.",
        ),
        ToolSpec(
            "set_reminder",
            lambda p: {"text": p.reminder(), "minutes": p.minutes()},
            (
                "Remind me to {text} in {minutes} minutes.",
                "Set a reminder to {text} in {minutes} minutes.",
                "In {minutes} minutes, remind me to {text}.",
                "Please remind me in {minutes} minutes to {text}.",
            ),
            (
                "Could you remind me to {text} in {minutes} minutes?",
                "Set me a reminder in {minutes} minutes to {text}.",
            ),
            "Done: {result}.",
        ),
        ToolSpec(
            "book_flight",
            lambda p: {"origin": p.city(), "destination": p.city(), "date": p.date()},
            (
                "Book a flight from {origin} to {destination} on {date}.",
                "I want to fly from {origin} to {destination} on {date}.",
                "Get me a plane ticket from {origin} to {destination} for {date}.",
                "Reserve a flight {origin} to {destination}, {date}.",
            ),
            (
                "On {date} I need a flight from {origin} to {destination}.",
                "Please book me a flight from {origin} to {destination} on {date}.",
            ),
            "Your flight from {origin} to {destination} on {date}: {result}.",
        ),
        ToolSpec(
            "is_prime",
            lambda p: {"number": p.number()},
            (
                "Is {number} a prime number?",
                "Check if {number} is prime.",
                "Is {number} prime?",
                "Tell me whether {number} is a prime.",
            ),
            ("Tell me if {number} is prime.", "Determine if {number} is prime or not."),
            "I checked: {result}.",
        ),
        ToolSpec(
            "get_random_joke",
            lambda p: {},
            ("Tell me a joke.", "I want to hear a joke.", "Make me laugh with a joke.", "Do you know a good joke?"),
            ("Can you tell me a joke?", "Share a joke with me."),
            "Here is one: {result}",
        ),
        ToolSpec(
            "get_capital",
            lambda p: {"country": p.country()},
            (
                "What is the capital of {country}?",
                "Which city is the capital of {country}?",
                "Name the capital of {country}.",
                "Capital of {country}?",
            ),
            ("Which is the capital city of {country}?", "I forgot the capital of {country}. What is it?"),
            "The capital of {country} is {result}.",
        ),
    )
}

# Direct answers: small talk (no tool is needed even when tools are offered).
SMALL_TALK: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "greeting": (
        ("Hi!", "Hello!", "Hello there.", "Good morning!", "Hey, how are you?"),
        ("Hi, nice to meet you.", "Greetings!"),
        "Hello! How can I help you today?",
    ),
    "thanks": (
        ("Thanks!", "Thank you.", "Thank you very much!", "Great, thanks."),
        ("Cheers, that helps.", "Much appreciated."),
        "You're welcome!",
    ),
    "name": (
        ("What is your name?", "Who are you?", "What should I call you?"),
        ("Introduce yourself.",),
        "I am a small demo assistant that can call tools.",
    ),
}

# "Repeat after me": copying arbitrary words, the skill a tool call needs for its argument values.
REPEAT_TRAIN = ("Repeat after me: {words}", "Please repeat: {words}", "Say this back to me: {words}")
REPEAT_HELDOUT = ("Could you repeat this: {words}",)
# the spelling exercise (``spell``): a word after a space is one token, the same word inside quotes other
# tokens, so these teach the model how each vocabulary word is written in a call's quotes and back
QUOTE_TEMPLATES = ("Put each word in quotes: {words}", "Quote these words: {words}", "Write these in quotes: {words}")
UNQUOTE_TEMPLATES = (
    "Remove the quotes: {words}",
    "Unquote these words: {words}",
    "Write these without quotes: {words}",
)

NO_TOOL_ANSWER = "Sorry, I can't help with that: none of the available tools can answer it."
