"""The demo tools: ordinary Python functions the demo model was trained to call.

Results are deterministic functions of the arguments (a stable hash picks the fake data), so a
transcript is reproducible, an evaluation can check that the final answer restates the result, and
`workbench.tools.run` executes them like any user tool.  Docstrings are short on purpose: their
text becomes the tool definitions in the prompt, and shorter prompts train faster.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from workbench.demo.pools import CAPITALS

_CONDITIONS = ("sunny", "cloudy", "rainy", "windy", "snowy", "foggy", "clear", "stormy")
_JOKES = (
    "Why did the robot cross the road? It was programmed to.",
    "I told my computer a joke. It did not get it.",
    "Parallel lines have so much in common. It is a shame they never meet.",
    "Why do programmers prefer dark mode? Light attracts bugs.",
)


def _pick(*parts: object) -> int:
    """A stable, platform-independent integer for the arguments (Python's hash() is salted)."""
    digest = hashlib.sha256("|".join(str(p).lower() for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
        city: Name of the city.
    """
    n = _pick("weather", city)
    return f"{n % 35 - 5} C and {_CONDITIONS[n // 35 % len(_CONDITIONS)]}"


def convert_currency(amount: float, from_currency: str, to_currency: str) -> str:
    """Convert an amount of money from one currency to another.

    Args:
        amount: The amount of money.
        from_currency: Currency code to convert from.
        to_currency: Currency code to convert to.
    """
    rate = 0.2 + (_pick("fx", from_currency, to_currency) % 400) / 100
    return f"{amount * rate:.2f} {to_currency}"


def convert_units(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a quantity from one unit to another.

    Args:
        value: The quantity.
        from_unit: Unit to convert from.
        to_unit: Unit to convert to.
    """
    factor = 0.1 + (_pick("units", from_unit, to_unit) % 1000) / 100
    return f"{value * factor:.2f} {to_unit}"


def get_local_time(city: str) -> str:
    """Get the current local time in a city.

    Args:
        city: Name of the city.
    """
    n = _pick("time", city)
    return f"{n % 24:02d}:{n // 24 % 60:02d}"


def get_population(country: str) -> str:
    """Get the population of a country.

    Args:
        country: Name of the country.
    """
    return f"{_pick('population', country) % 2000 / 10 + 0.5:.1f} million"


def get_stock_price(symbol: str) -> str:
    """Get the latest stock price for a ticker symbol.

    Args:
        symbol: The ticker symbol.
    """
    return f"{_pick('stock', symbol) % 90000 / 100 + 5:.2f} USD"


def translate_word(word: str, language: str) -> str:
    """Translate a word into another language.

    Args:
        word: The word to translate.
        language: The target language.
    """
    syllables = ("ka", "lo", "mi", "ren", "tu", "sa", "vel", "do", "ni", "por")
    n = _pick("translate", word, language)
    return "".join(syllables[(n >> (4 * i)) % len(syllables)] for i in range(2 + n % 2))


def get_user_email(name: str) -> str:
    """Look up the email address of a person.

    Args:
        name: The person's full name.
    """
    return ".".join(name.lower().split()) + "@example.com"


def calculate_tip(bill: float, percent: int) -> str:
    """Calculate the tip for a restaurant bill.

    Args:
        bill: The bill amount.
        percent: The tip percentage.
    """
    return f"{bill * percent / 100:.2f}"


def set_reminder(text: str, minutes: int) -> str:
    """Set a reminder that fires after some minutes.

    Args:
        text: What to be reminded of.
        minutes: Minutes from now.
    """
    return f"reminder {_pick('reminder', text, minutes) % 900 + 100} set for {minutes} minutes from now"


def book_flight(origin: str, destination: str, date: str) -> str:
    """Book a flight between two cities on a date.

    Args:
        origin: City to fly from.
        destination: City to fly to.
        date: Date of the flight, YYYY-MM-DD.
    """
    n = _pick("flight", origin, destination, date)
    return f"booking {chr(65 + n % 26)}{chr(65 + n // 26 % 26)}{n % 9000 + 1000} confirmed"


def is_prime(number: int) -> str:
    """Check whether a whole number is prime.

    Args:
        number: The number to check.
    """
    prime = number >= 2 and all(number % d for d in range(2, int(number**0.5) + 1))
    return f"{number} is prime" if prime else f"{number} is not prime"


def get_random_joke() -> str:
    """Tell a random joke."""
    return _JOKES[_pick("joke") % len(_JOKES)]


def get_capital(country: str) -> str:
    """Get the capital city of a country.

    Args:
        country: Name of the country.
    """

    return CAPITALS.get(country, f"{country} City")


DEMO_TOOLS: dict[str, Callable[..., object]] = {
    fn.__name__: fn
    for fn in (
        get_weather,
        convert_currency,
        convert_units,
        get_local_time,
        get_population,
        get_stock_price,
        translate_word,
        get_user_email,
        calculate_tip,
        set_reminder,
        book_flight,
        is_prime,
        get_random_joke,
        get_capital,
    )
}
