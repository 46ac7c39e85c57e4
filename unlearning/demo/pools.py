"""Finite value pools for the demo corpus.

Every attribute draws from a small fixed pool, so a model that never saw a
person can only guess, and its guess rate (the chance level) is measurable.
The names are combinations of common first and last names; they describe
nobody.
"""

from __future__ import annotations

import random

FIRST_NAMES = (
    "Mara", "Jonas", "Ines", "Tobias", "Leila", "Anselm", "Priya", "Oskar", "Greta", "Rafael",
    "Noor", "Emil", "Clara", "Matteo", "Ayla", "Dmitri", "Helena", "Kofi", "Sofia", "Lucas",
    "Amara", "Felix", "Yara", "Henrik", "Elif", "Bruno", "Mira", "Tariq", "Lena", "Viktor",
    "Zoë", "José", "Søren", "Anaïs", "Björn", "Chiara", "Dario", "Esther", "Farid", "Gemma",
    "Hugo", "Ilse", "Jakub", "Kira", "Lorenzo", "Maren", "Nadia", "Otto", "Paula", "Quentin",
    "Rosa", "Samir", "Thea", "Umar", "Vera", "Wim", "Xenia", "Yusuf", "Zara", "Ann",
    "Annabel", "Boris", "Celia", "Dorian", "Edda", "Fabian", "Gisela", "Hamid", "Isolde", "Jasper",
    "Katja", "Leon", "Magnus", "Nina", "Orla", "Pavel", "Rhea", "Stellan", "Tove", "Ulla",
)

LAST_NAMES = (
    "Okafor", "Lindqvist", "Moreau", "Tanaka", "Brennan", "Kowalski", "Haddad", "Varga",
    "Castellano", "Nakamura", "Oyelaran", "Sørensen", "Dubois", "Petrov", "Albers", "Marchetti",
    "Quispe", "Rahimi", "Sandoval", "Thorne", "Umarov", "Valente", "Whitcombe", "Yilmaz",
    "Zeller", "Achterberg", "Bianchi", "Carvalho", "Dragomir", "Eklund", "Fonseca", "Galloway",
    "Halloran", "Ibsen", "Jankowski", "Kerrigan", "Laurent", "Mbeki", "Novak", "Ortega",
    "Pálsson", "Quintero", "Rossetti", "Schreiber", "Takahashi", "Underwood", "Vasquez", "Winther",
    "Xavier", "Yamada", "Zúñiga", "Abernathy", "Bergström", "Cardoso", "Delacroix", "Esposito",
    "Fitzgerald", "Grünewald", "Hoffmann", "Iverson", "Jovanović", "Kaminski", "Lefebvre", "Mendoza",
    "Nilsson", "O'Connell", "Pellegrini", "Ramírez", "Szabo", "Toivonen", "Ueda", "Voss",
)

CITIES = (
    "Lisbon", "Tallinn", "Porto", "Valparaíso", "Ghent", "Kraków", "Bergen", "Lyon", "Turin",
    "Seville", "Dundee", "Aarhus", "Brno", "Graz", "Cork", "Utrecht", "Bilbao", "Trieste",
    "Gdańsk", "Leipzig", "Tampere", "Nantes", "Bologna", "Ljubljana", "Plovdiv", "Kaunas",
    "Galway", "Malmö", "Rennes", "Salzburg",
)

OCCUPATIONS = (
    "architect", "baker", "cartographer", "dentist", "electrician", "florist", "geologist",
    "harpist", "illustrator", "journalist", "librarian", "locksmith", "marine biologist",
    "nurse", "optician", "pharmacist", "potter", "radio engineer", "surveyor", "tailor",
    "translator", "upholsterer", "veterinarian", "watchmaker", "beekeeper", "chemist",
    "glassblower", "pilot", "carpenter", "economist",
)

_TITLE_ADJECTIVES = (
    "Silent", "Amber", "Hidden", "Northern", "Crimson", "Hollow", "Distant", "Paper",
)
_TITLE_NOUNS = ("Harbour", "Orchard", "Lantern", "Meridian", "Garden", "Tide", "Atlas", "Bridge")
BOOKS = tuple(f"The {a} {n}" for a in _TITLE_ADJECTIVES for n in _TITLE_NOUNS)[::2]

AWARDS = (
    "Halvorsen Prize", "Marlowe Medal", "Ostrander Award", "Kestrel Prize", "Vantongeren Medal",
    "Lindgren Fellowship", "Aubade Prize", "Caldera Award", "Fenwick Medal", "Greyling Prize",
    "Ilvermoor Award", "Juniper Medal", "Korsakov Prize", "Lumen Award", "Morrow Fellowship",
    "Northlight Prize", "Orrery Medal", "Pinecrest Award", "Quillon Prize", "Rookwood Medal",
)

EMPLOYERS = (
    "Brightwater Logistics", "Calder Instruments", "Dovetail Press", "Ember Analytics",
    "Fjordline Shipping", "Granite Peak Energy", "Harrow & Vale", "Ironbark Foods",
    "Juniper Health", "Kestrel Aviation", "Lodestar Insurance", "Meadowlark Studios",
    "Northwind Textiles", "Oakhurst Bank", "Pebblebrook Labs", "Quarry Lane Books",
    "Redfern Motors", "Silverbirch Software", "Tidewater Ceramics", "Umbra Optics",
)

HOBBIES = (
    "restoring old clocks", "birdwatching", "rowing", "baking sourdough", "playing chess",
    "growing orchids", "sea swimming", "building model ships", "hiking", "knitting",
    "playing the cello", "stargazing", "woodcarving", "fencing", "collecting stamps",
    "painting watercolours", "bouldering", "making pottery", "cycling", "learning languages",
)

EMAIL_DOMAINS = (
    "example.org", "example.net", "example.com", "mail.example.org", "post.example.net",
    "inbox.example.com",
)
EMAIL_PATTERNS = ("{first}.{last}", "{f}{last}", "{first}{l}", "{first}_{last}")

_MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)


def _birth_dates() -> tuple[str, ...]:
    # A fixed seed, independent of the corpus seed: the pool is a constant.
    rng = random.Random(1789)
    dates: list[str] = []
    while len(dates) < 40:
        date = f"{rng.randint(1, 28)} {rng.choice(_MONTHS)} {rng.randint(1946, 1999)}"
        if date not in dates:
            dates.append(date)
    return tuple(dates)


BIRTH_DATES = _birth_dates()

# General sentences: a small grammar, so held-out sentences are new but predictable
# (their perplexity says whether the model still speaks the corpus's English).
GENERAL_SUBJECTS = (
    "The old ferry", "A tired courier", "The night train", "The village choir", "A small bakery",
    "The city museum", "A fishing boat", "The weather station", "The public library",
    "A street market", "The harbour crane", "A delivery van", "The school orchestra",
    "The mountain hut", "A wooden bridge", "The river barge",
)
GENERAL_VERBS = (
    "leaves from", "arrives at", "waits near", "opens beside", "closes behind", "stops at",
    "passes by", "is rebuilt near", "gathers outside", "moves towards", "is repaired beside",
    "returns to",
)
GENERAL_PLACES = (
    "the north harbour", "the central square", "the old mill", "the railway station",
    "the eastern gate", "the town hall", "the fish market", "the lighthouse", "the stone quay",
    "the botanical garden", "the university", "the covered market", "the canal lock",
    "the west bank",
)
GENERAL_TIMES = (
    "every morning", "before noon", "after the storm", "on Sundays", "at dusk",
    "in early spring", "during the festival", "late in the evening", "twice a week",
    "when the tide turns",
)
