"""Finding many people's names and identifiers in text in one pass.

Text and patterns go through the same normalisation (`unlearning.text.normalise`), then one
Aho-Corasick automaton finds every pattern of every subject in a single scan;
a hit counts only on word boundaries, so "Ann" never matches inside
"Annabel".  Next to a character of a script written without spaces (Chinese, Japanese,
Thai ...) or of Hangul, whose particles attach to names, no boundary is asked for
(`text.unspaced`): "张伟" is found in "张伟住在北京" and "김민준" in "김민준은"; such a
name is also found inside a longer name of the same script, which set building prefers
to missing the person's records.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence

import ahocorasick

from unlearning.text import normalise, unspaced

SEPARATOR = "\x00"
_PHONE = re.compile(r"^\+?[\d\s().-]{6,}$")


def identifier_variants(identifier: str) -> set[str]:
    """Ways one identifier is written: a phone number also without spaces or with dashes."""
    variants = {identifier.strip()}
    if _PHONE.match(identifier.strip()):
        digits = re.sub(r"\D", "", identifier)
        plus = "+" if identifier.strip().startswith("+") else ""
        groups = re.findall(r"\d+", identifier)
        variants |= {plus + digits, digits, plus + "-".join(groups), plus + " ".join(groups)}
    return {v for v in variants if v}


class MultiMatcher:
    """An Aho-Corasick automaton over the patterns of many subjects (by index)."""

    def __init__(self, patterns_by_subject: Sequence[Iterable[str]]) -> None:
        self._owners: dict[str, set[int]] = {}
        for index, patterns in enumerate(patterns_by_subject):
            for pattern in patterns:
                for variant in identifier_variants(pattern):
                    # No key holds the separator, so no hit can span two texts of one scan.
                    key = normalise(variant.replace(SEPARATOR, " ")).strip()
                    if len(key) >= 2:
                        self._owners.setdefault(key, set()).add(index)
        self._automaton = ahocorasick.Automaton()
        for key in self._owners:
            self._automaton.add_word(key, key)
        self.empty = not self._owners
        self.keys = tuple(sorted(self._owners))
        if not self.empty:
            self._automaton.make_automaton()

    def _hits(self, norm: str) -> Iterable[tuple[int, str]]:
        """(end offset, pattern) of every hit on word boundaries in normalised text."""
        for end, key in self._automaton.iter(norm):
            start = end - len(key) + 1
            if key[0].isalnum() and start > 0 and norm[start - 1].isalnum() \
                    and not (unspaced(key[0]) or unspaced(norm[start - 1])):
                continue
            if key[-1].isalnum() and end + 1 < len(norm) and norm[end + 1].isalnum() \
                    and not (unspaced(key[-1]) or unspaced(norm[end + 1])):
                continue
            yield end, key

    def subjects_in(self, text: str) -> set[int]:
        """Indices of the subjects any of whose patterns occur in `text` on word boundaries."""
        if self.empty:
            return set()
        found: set[int] = set()
        for _, key in self._hits(normalise(text)):
            found |= self._owners[key]
        return found

    def scan(self, texts: Sequence[str]) -> dict[int, set[int]]:
        """{text index: subject indices} for the texts that mention anyone, in ONE pass.

        The normalised texts are joined with a NUL separator (not a letter, so it is
        a word boundary) and scanned once; hits are mapped back to texts by offset.  This keeps the
        per-record Python work out of the loop: 100 subjects cost about what one does.
        """
        if self.empty or not texts:
            return {}
        # Normalised text by text: most records are ASCII and take the fast path.
        norm = SEPARATOR.join(normalise(t.replace(SEPARATOR, " ")) for t in texts)
        starts = [0]
        at = norm.find(SEPARATOR)
        while at != -1:
            starts.append(at + 1)
            at = norm.find(SEPARATOR, at + 1)
        found: dict[int, set[int]] = {}
        for end, key in self._hits(norm):
            index = bisect.bisect_right(starts, end) - 1
            found.setdefault(index, set()).update(self._owners[key])
        return found
