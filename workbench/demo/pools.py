"""Argument values for the synthetic dialogs, split into train and held-out sets.

Every pool is cut deterministically (every fourth item is held out), so the evaluation asks about
cities, names, currencies... the model never saw during training.  Training values are further
mixed with synthetic words (random syllables), so the model learns to *copy* a value from the
question rather than memorise a list.
"""

from __future__ import annotations

import random

CITIES = """Paris London Berlin Madrid Rome Vienna Prague Warsaw Budapest Lisbon Dublin Oslo Stockholm Helsinki
Copenhagen Amsterdam Brussels Zurich Geneva Munich Hamburg Milan Naples Barcelona Valencia Seville Porto Athens
Istanbul Moscow Kyiv Cairo Lagos Nairobi Accra Dakar Tunis Casablanca Johannesburg Cape_Town Durban Tokyo Osaka
Kyoto Seoul Busan Beijing Shanghai Shenzhen Hong_Kong Taipei Manila Jakarta Bangkok Hanoi Singapore Mumbai Delhi
Chennai Kolkata Bangalore Karachi Lahore Dhaka Kathmandu Colombo Dubai Doha Riyadh Tehran Baghdad Amman Beirut
Jerusalem Sydney Melbourne Brisbane Perth Auckland Wellington Toronto Montreal Vancouver Calgary Ottawa Chicago
Boston Seattle Denver Houston Dallas Austin Phoenix Atlanta Miami Detroit Portland Nashville New_York Los_Angeles
San_Francisco San_Diego Las_Vegas Mexico_City Guadalajara Havana Bogota Lima Quito Santiago Buenos_Aires
Montevideo Caracas Sao_Paulo Rio_de_Janeiro Brasilia Reykjavik Edinburgh Glasgow Manchester Liverpool Bristol
Lyon Marseille Nice Bordeaux Toulouse Cologne Frankfurt Stuttgart Dresden Leipzig Krakow Gdansk Riga Tallinn
Vilnius Minsk Sofia Bucharest Belgrade Zagreb Ljubljana Sarajevo Tirana Skopje Valletta Nicosia Tbilisi Yerevan
Baku Almaty Tashkent Ulaanbaatar Vladivostok Anchorage Honolulu Havana Kingston Panama_City San_Jose Managua""".split()

COUNTRIES = """France Germany Spain Italy Portugal Ireland Norway Sweden Finland Denmark Poland Austria Hungary
Greece Turkey Egypt Nigeria Kenya Ghana Senegal Morocco Tunisia Ethiopia Japan China Korea India Pakistan
Bangladesh Nepal Vietnam Thailand Indonesia Malaysia Philippines Australia Canada Mexico Brazil Argentina Chile
Peru Colombia Venezuela Cuba Iceland Belgium Netherlands Switzerland Romania Bulgaria Serbia Croatia Slovenia
Slovakia Ukraine Georgia Armenia Kazakhstan Mongolia Iran Iraq Jordan Lebanon Israel Qatar Oman Yemen Sudan
Uganda Tanzania Zambia Angola Namibia Botswana Madagascar Estonia Latvia Lithuania Albania Malta Cyprus Uruguay
Paraguay Bolivia Ecuador Panama Jamaica Haiti""".split()

FIRST_NAMES = """Alice Bob Carol David Emma Frank Grace Henry Irene Jack Karen Liam Maria Noah Olivia Peter Quinn Rosa
Sam Tina Umar Vera Walter Xena Yusuf Zoe Aisha Bruno Chloe Diego Elena Farid Gina Hugo Ines Jonas Kenji Lena Marco
Nadia Oscar Priya Rafael Sofia Tomas Ursula Victor Wanda Yara Zane Amir Bianca Carlos Dana Ethan Fatima Gustav
Hannah Ivan Julia Kofi Laura Mateo Nina Omar Paula Ravi Sara Theo Uma Viktor Wei Ximena Yuki Zara""".split()

LAST_NAMES = """Smith Johnson Garcia Miller Davis Lopez Wilson Anderson Thomas Moore Martin Lee Clark Lewis Walker Hall
Young King Wright Scott Green Baker Adams Nelson Hill Campbell Mitchell Roberts Carter Phillips Evans Turner Torres
Parker Collins Edwards Stewart Morris Murphy Cook Rogers Morgan Peterson Cooper Reed Bailey Bell Kelly Howard Ward
Cox Diaz Richardson Wood Watson Brooks Bennett Gray James Hughes Price Sanders Myers Long Ross Foster Novak Kowalski
Tanaka Sato Kim Park Chen Wang Singh Patel Khan Okafor Mensah Silva Santos Rossi Bianchi Muller Schmidt Dubois""".split()

CURRENCIES = """USD EUR GBP JPY CHF CAD AUD NZD CNY INR BRL MXN ZAR SEK NOK DKK PLN CZK HUF TRY KRW SGD HKD THB IDR
MYR PHP ILS AED SAR EGP NGN KES ARS CLP COP PEN RUB UAH ISK""".split()

UNITS = """meters feet kilometers miles centimeters inches grams ounces kilograms pounds liters gallons milliliters
cups yards tons hectares acres""".split()

LANGUAGES = """French German Spanish Italian Portuguese Dutch Swedish Polish Greek Turkish Japanese Chinese Korean
Hindi Arabic Russian Finnish Czech Hungarian Swahili""".split()

WORDS = """apple house river mountain friend window garden book music water bread cheese flower school teacher
moon star forest ocean bridge street coffee dream paper silver family morning winter summer kitchen doctor
market island letter candle butterfly thunder pencil rabbit mirror castle village painting journey holiday
honey orange lemon tiger dragon cloud shadow whisper anchor basket blanket bottle button camera carpet cookie
dolphin engine feather guitar hammer helmet jacket ladder magnet needle pillow pocket rocket saddle tunnel""".split()

REMINDERS = """call_mom buy_milk water_the_plants take_the_medicine send_the_report feed_the_cat book_a_table
check_the_oven pay_the_rent walk_the_dog stretch_your_legs join_the_meeting pick_up_the_kids drink_some_water
start_the_laundry reply_to_Anna back_up_the_laptop renew_the_passport order_the_flowers lock_the_door""".split()

CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Spain": "Madrid",
    "Italy": "Rome",
    "Portugal": "Lisbon",
    "Ireland": "Dublin",
    "Norway": "Oslo",
    "Sweden": "Stockholm",
    "Finland": "Helsinki",
    "Denmark": "Copenhagen",
    "Poland": "Warsaw",
    "Austria": "Vienna",
    "Hungary": "Budapest",
    "Greece": "Athens",
    "Turkey": "Ankara",
    "Egypt": "Cairo",
    "Nigeria": "Abuja",
    "Kenya": "Nairobi",
    "Ghana": "Accra",
    "Senegal": "Dakar",
    "Morocco": "Rabat",
    "Tunisia": "Tunis",
    "Ethiopia": "Addis Ababa",
    "Japan": "Tokyo",
    "China": "Beijing",
    "Korea": "Seoul",
    "India": "New Delhi",
    "Pakistan": "Islamabad",
    "Bangladesh": "Dhaka",
    "Nepal": "Kathmandu",
    "Vietnam": "Hanoi",
    "Thailand": "Bangkok",
    "Indonesia": "Jakarta",
    "Malaysia": "Kuala Lumpur",
    "Philippines": "Manila",
    "Australia": "Canberra",
    "Canada": "Ottawa",
    "Mexico": "Mexico City",
    "Brazil": "Brasilia",
    "Argentina": "Buenos Aires",
    "Chile": "Santiago",
    "Peru": "Lima",
    "Colombia": "Bogota",
    "Venezuela": "Caracas",
    "Cuba": "Havana",
    "Iceland": "Reykjavik",
    "Belgium": "Brussels",
    "Netherlands": "Amsterdam",
    "Switzerland": "Bern",
    "Romania": "Bucharest",
    "Bulgaria": "Sofia",
    "Serbia": "Belgrade",
    "Croatia": "Zagreb",
    "Slovenia": "Ljubljana",
    "Slovakia": "Bratislava",
    "Ukraine": "Kyiv",
    "Georgia": "Tbilisi",
    "Armenia": "Yerevan",
    "Kazakhstan": "Astana",
    "Mongolia": "Ulaanbaatar",
    "Iran": "Tehran",
    "Iraq": "Baghdad",
    "Jordan": "Amman",
    "Lebanon": "Beirut",
    "Qatar": "Doha",
    "Oman": "Muscat",
    "Estonia": "Tallinn",
    "Latvia": "Riga",
    "Lithuania": "Vilnius",
    "Albania": "Tirana",
    "Malta": "Valletta",
    "Cyprus": "Nicosia",
    "Uruguay": "Montevideo",
    "Paraguay": "Asuncion",
    "Bolivia": "Sucre",
    "Ecuador": "Quito",
    "Panama": "Panama City",
    "Jamaica": "Kingston",
}

_SYLLABLES = """ba be bi bo bu da de di do du fa fe fi ka ke ki ko ku la le li lo lu ma me mi mo mu na ne ni no nu
pa pe pi po ra re ri ro ru sa se si so su ta te ti to tu va ve vi vo za ze zi zo an en in on ar er or ul el il
sch tr br gr st sk pl kr dr vel mar ton berg burg ville dorf ham ford port land stad holm""".split()

Split = str  # "train" | "heldout"


def _split(items: list[str], split: Split) -> list[str]:
    items = [i.replace("_", " ") for i in dict.fromkeys(items)]  # dedupe, keep order
    return [x for i, x in enumerate(items) if (i % 4 == 3) == (split == "heldout")]


class ValuePools:
    """Argument values for one split; ``synthetic`` (train only) mixes in made-up words to teach copying."""

    def __init__(self, split: Split, rng: random.Random, synthetic: float = 0.0) -> None:
        self.split, self.rng, self.synthetic = split, rng, synthetic
        self.cities = _split(CITIES, split)
        self.countries = [c for c in _split(COUNTRIES, split)]
        self.first = _split(FIRST_NAMES, split)
        self.last = _split(LAST_NAMES, split)
        self.currencies = _split(CURRENCIES, split)
        self.units = _split(UNITS, split)
        self.languages = _split(LANGUAGES, split)
        self.words = _split(WORDS, split)
        self.reminders = _split(REMINDERS, split)

    def made_up(self, capital: bool = True) -> str:
        """A pronounceable word no pool holds (names and places the model has never seen)."""
        word = "".join(self.rng.choice(_SYLLABLES) for _ in range(self.rng.randint(2, 4)))
        return word.capitalize() if capital else word

    def _choose(self, pool: list[str], capital: bool = True) -> str:
        if self.synthetic and self.rng.random() < self.synthetic:
            return self.made_up(capital)
        return self.rng.choice(pool)

    def city(self) -> str:
        return self._choose(self.cities)

    def country(self) -> str:
        return self._choose(self.countries)

    def person(self) -> str:
        if self.synthetic and self.rng.random() < self.synthetic:
            return f"{self.made_up()} {self.made_up()}"
        return f"{self.rng.choice(self.first)} {self.rng.choice(self.last)}"

    def currency(self) -> str:
        if self.synthetic and self.rng.random() < self.synthetic:
            return "".join(self.rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(3))
        return self.rng.choice(self.currencies)

    def unit(self) -> str:
        return self.rng.choice(self.units)

    def language(self) -> str:
        return self._choose(self.languages)

    def word(self) -> str:
        return self._choose(self.words, capital=False)

    def reminder(self) -> str:
        if self.synthetic and self.rng.random() < self.synthetic:
            return f"{self.rng.choice(('call', 'email', 'visit', 'thank'))} {self.made_up()}"
        return self.rng.choice(self.reminders)

    def symbol(self) -> str:
        # held-out ticker symbols use letters the training symbols never start with
        letters = "ABCDEFGHIJKLMNOPQRST" if self.split == "train" else "UVWXYZ"
        rest = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
        return self.rng.choice(letters) + "".join(self.rng.choice(rest) for _ in range(self.rng.randint(1, 3)))

    def amount(self) -> int | float:
        if self.split == "train":
            return self.rng.choice(
                [self.rng.randint(1, 999), self.rng.randint(1, 99999), round(self.rng.uniform(1, 500), 2)]
            )
        return self.rng.choice([self.rng.randint(1, 9999), round(self.rng.uniform(1, 900), 1)])

    def percent(self) -> int:
        return self.rng.randint(5, 30)

    def minutes(self) -> int:
        return self.rng.randint(1, 180)

    def number(self) -> int:
        return self.rng.randint(2, 9999)

    def date(self) -> str:
        year = self.rng.randint(2024, 2027) if self.split == "train" else self.rng.choice((2028, 2029))
        return f"{year}-{self.rng.randint(1, 12):02d}-{self.rng.randint(1, 28):02d}"
