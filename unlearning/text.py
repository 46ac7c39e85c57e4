"""The one text normalisation of the engine: NFKC, case folding, accents stripped, a few
letters that do not decompose transliterated, apostrophe and dash variants unified,
whitespace collapsed.

`normalise` keeps punctuation (so e-mail addresses and phone numbers keep their shape);
it is the form in which set building matches names and identifiers.  `normalise_words`
also turns punctuation into spaces; it is the form in which a generated answer is searched
for a value (a leak), so "Lisbon." and "lisbon" are the same word.
"""

from __future__ import annotations

import re
import unicodedata

_COMBINING = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]")
_TRANSLITERATE = str.maketrans({
    "ø": "o", "æ": "ae", "œ": "oe", "ł": "l", "đ": "d", "ð": "d", "þ": "th", "ı": "i",
    "\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'", "\u00b4": "'",
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-",
})
_TRANSLITERATED = re.compile("[" + re.escape("".join(chr(c) for c in _TRANSLITERATE)) + "]")
_NON_WORD = re.compile(r"[^\w]+")


def normalise(text: str) -> str:
    """The matching form of a text (see the module docstring)."""
    if text.isascii():  # the fast path: most corpus text needs no Unicode work
        return " ".join(text.lower().split())
    text = unicodedata.normalize("NFKC", text).casefold()
    if _TRANSLITERATED.search(text):  # translate reads every character through a dict: only where needed
        text = text.translate(_TRANSLITERATE)
    text = _COMBINING.sub("", unicodedata.normalize("NFD", text))
    return " ".join(unicodedata.normalize("NFC", text).split())


def normalise_words(text: str) -> str:
    """The matching form with punctuation turned into spaces: words only."""
    return " ".join(_NON_WORD.sub(" ", normalise(text)).split())
