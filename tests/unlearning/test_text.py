"""The engine's one text normalisation (`unlearning.text`)."""

from __future__ import annotations

import re
import unicodedata

from hypothesis import example, given, settings
from hypothesis import strategies as st

from unlearning.text import _COMBINING, _TRANSLITERATE, normalise, normalise_words

_TABLE = "".join(chr(c) for c in _TRANSLITERATE)


def _definition(text: str) -> str:
    """The normalisation, every step on every text: ASCII text lower-cased with its whitespace
    collapsed (nothing else; the corpus scan's byte-level prefilter relies on it, so an ASCII
    backtick stays a backtick), any other text through every Unicode step."""
    if text.isascii():
        return " ".join(text.lower().split())
    text = unicodedata.normalize("NFKC", text).casefold().translate(_TRANSLITERATE)
    text = _COMBINING.sub("", unicodedata.normalize("NFD", text))
    return " ".join(unicodedata.normalize("NFC", text).split())


# Text mixing ASCII, the transliterated letters and characters that become them under NFKC
# or case folding (Ø, Æ, Œ, Ł, Đ, fullwidth and compatibility forms), accents and spaces.
_TRICKY = st.text(alphabet=st.sampled_from(list("aZ9 .-'\t") + list(_TABLE) + list("ØÆŒŁĐÐÞİIıé\u0301\u00a0Ｚ\u2002ſK")),
                  max_size=40)


@settings(max_examples=400, deadline=None)
@given(st.one_of(_TRICKY, st.text(max_size=40)))
@example("`")
@example("O`Brien \u2019é")
@example("ØSTER`S")
def test_normalise_is_its_definition(text):
    # The transliteration runs only where a character of its table is present (a dict
    # lookup per character is the slowest step); the result must not change.
    assert normalise(text) == _definition(text)


def test_the_letters_that_do_not_decompose_are_transliterated():
    assert normalise("Søren Łukasz Æsir Œuvre Ðoru Þór") == "soren lukasz aesir oeuvre doru thor"
    assert normalise("ØSTER\u2019S \u2014 Ｚoë") == "oster's - zoe"
    assert normalise_words("Lisbon.") == "lisbon"
    assert re.fullmatch(r"[a-z ]+", normalise("ÆØ ÅÉ")) is not None
