"""The one text normalisation of the engine: NFKC, case folding, accents stripped, a few
letters that do not decompose transliterated, apostrophe and dash variants unified,
whitespace collapsed.

`normalise` keeps punctuation (so e-mail addresses and phone numbers keep their shape);
it is the form in which set building matches names and identifiers.  `normalise_words`
also turns punctuation into spaces; it is the form in which a generated answer is searched
for a value (a leak), so "Lisbon." and "lisbon" are the same word.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable

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


# Scripts written without spaces between words (Han, kana, Thai, Lao, Khmer, Myanmar,
# Tibetan), and Hangul, whose particles attach to the noun before them ("김민준은"): a name
# in such text has no word boundary around it, so matching must not ask for one next to
# these characters (`text_matching`), and the index makes each of them a token of its own
# (`corpus.index`).  The ranges are those of the normalised text (NFKC maps half-width kana
# and compatibility ideographs into them).
UNSPACED_RANGES = (
    "\u0e00-\u0eff"  # Thai, Lao
    "\u0f00-\u0fff"  # Tibetan
    "\u1000-\u109f"  # Myanmar
    "\u1100-\u11ff"  # Hangul Jamo
    "\u1780-\u17ff"  # Khmer
    "\u2e80-\u2fdf"  # CJK radicals
    "\u3005-\u3007\u3021-\u3029\u3031-\u3035\u3038-\u303c"  # ideographic marks and numerals
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3100-\u31ff"  # Bopomofo, Hangul compatibility Jamo, Katakana extensions
    "\u3400-\u4dbf\u4e00-\u9fff"  # CJK ideographs
    "\ua960-\ua97f\uac00-\ud7ff"  # Hangul
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\U00020000-\U0003134f"  # CJK extensions B-H
)
_UNSPACED = re.compile(f"[{UNSPACED_RANGES}]")


def unspaced(char: str) -> bool:
    """Whether a character belongs to a script that does not separate words by spaces
    (`UNSPACED_RANGES`): no word boundary is needed next to it."""
    return _UNSPACED.match(char) is not None


def has_unspaced(text: str) -> bool:
    """Whether any character of `text` is of an unspaced script (`unspaced`)."""
    return _UNSPACED.search(text) is not None


# Word boundaries that a character of an unspaced script does not need (`unspaced`): before
# a key, no word character unless it is such a character; after it, the same.
BOUNDARY_BEFORE = f"(?:(?<!\\w)|(?<=[{UNSPACED_RANGES}]))"
BOUNDARY_AFTER = f"(?:(?!\\w)|(?=[{UNSPACED_RANGES}]))"


def bounded(key: str) -> str:
    """A regular expression for `key` as a whole word, the rule set building matches names
    by (`text_matching`): no boundary is asked for next to a character of an unspaced
    script, on the key's side or the text's."""
    before = "" if key[:1] and unspaced(key[0]) else BOUNDARY_BEFORE
    after = "" if key[-1:] and unspaced(key[-1]) else BOUNDARY_AFTER
    return before + re.escape(key) + after


def word_regex(keys: Iterable[str], text: str = "") -> re.Pattern[str]:
    """Any of `keys` as a whole word, case-insensitively, the rule of `bounded`, compiled for
    searching `text`: where neither a key nor `text` has a character of an unspaced script,
    the plain boundaries `(?<!\\w)` and `(?!\\w)`, which then match the same (the unspaced
    alternative of each look-around needs such a character), and compile in microseconds
    where the large classes of the unspaced ranges take milliseconds.  A key is tried
    before a shorter one (longest first), so "Ann Lee" wins over "Ann".  Cached: set building
    for 100 subjects asks for about 1,000 of them per record batch, more than `re`'s own cache
    of 512 holds, and recompiling them took a tenth of a 100 MB scan."""
    ordered, keys_unspaced = _ordered_keys(tuple(keys))
    return _word_regex(ordered, keys_unspaced or has_unspaced(text))


@functools.lru_cache(maxsize=16384)
def _ordered_keys(keys: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
    """The keys longest first, and whether any has an unspaced character: once per key set."""
    ordered = tuple(sorted(set(keys), key=lambda k: (-len(k), k)))
    return ordered, any(has_unspaced(k) for k in ordered)


@functools.lru_cache(maxsize=16384)
def _word_regex(keys: tuple[str, ...], aware: bool) -> re.Pattern[str]:
    if aware:
        return re.compile("|".join(bounded(k) for k in keys), re.IGNORECASE)
    return re.compile(r"(?<!\w)(?:" + "|".join(re.escape(k) for k in keys) + r")(?!\w)", re.IGNORECASE)

