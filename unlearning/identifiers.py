"""Identifying spans of a record and counterfactual copies with fresh identifiers.

A record about a person carries spans that identify them or are facts only
about them: the names and identifiers the request gives (name, aliases, e-mail
addresses, phone numbers, account names), and patterns found in the text
itself (e-mail addresses, phone numbers, URLs, street addresses, dates, long
numbers).  `find_spans` locates them.

A *counterfactual copy* of a record replaces every such span by a fresh one of
the same shape (a name by a name, an e-mail address by an e-mail address built
the same way from the fresh name, a phone number by one with the same digit
pattern ...), consistently across every field.  It is the same record about a
stranger.  Three parts of the engine use it:

* verification's counterfactual controls: the subject's own probes about
  strangers, so that the control level has the subject's prompt distribution;
* the forget targets of the methods: what the model predicts for a person it
  never saw, position by position (`unlearning.methods.targets`);
* KIF's matched control prompts.

A fresh name part is as familiar to the model as the part it replaces would be
to a model that never saw the subject: a part the rest of the corpus shows
("Dmitri", shared with others) becomes another part the corpus shows; a part
only the subject's records show becomes an ordinary name the corpus never
shows (`unlearning.stranger_names`).  Nothing generated ever equals a part of
the subject's own identifiers.
"""

from __future__ import annotations

import functools
import random
import re
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from typing import Any

from unlearning.corpus import Message, Record
from unlearning.stranger_names import FAMILY_NAMES, GIVEN_NAMES
from unlearning.text import (
    BOUNDARY_AFTER,
    UNSPACED_RANGES,
    has_unspaced,
    normalise,
    unspaced,
    word_regex,
)

# A local part and a domain of word characters outside the unspaced scripts: an address
# written straight after Chinese text ("邮箱kim@example.com") starts at its first Latin character.
_LOCAL = f"(?:(?![{UNSPACED_RANGES}])[\\w.+-])"
_DOMAIN = f"(?:(?![{UNSPACED_RANGES}])[\\w-])"
EMAIL = re.compile(f"(?:(?<![\\w.+-])|(?<=[{UNSPACED_RANGES}])){_LOCAL}+@{_DOMAIN}+(?:\\.{_DOMAIN}+)+(?<!\\.)")
URL = re.compile(r"\bhttps?://[^\s<>\"')]+")
PHONE = re.compile(f"(?:(?<![\\w+])|(?<=[{UNSPACED_RANGES}]))" r"\+?\d[\d ()./-]{5,}\d" + BOUNDARY_AFTER)
STREET = re.compile(
    r"\b\d{1,5}[a-z]?,? (?:[A-Z][\w'-]*\.? ){1,3}"
    r"(?:Street|St\.?|Road|Rd\.?|Avenue|Ave\.?|Lane|Ln\.?|Way|Drive|Dr\.?|Boulevard|Blvd\.?|"
    r"Court|Ct\.?|Place|Pl\.?|Square|Sq\.?|Terrace|Close|Crescent|Gardens|Row|Hill|Park|"
    r"Strasse|Straße|Weg|Gasse|Platz|Allee)\b"
)
DATE = re.compile(
    r"\b(?:\d{1,2} (?:January|February|March|April|May|June|July|August|September|October|"
    r"November|December) \d{4}|\d{4}-\d{2}-\d{2}|\d{1,2}/\d{1,2}/\d{2,4})\b"
)
NUMBER = re.compile(f"(?:(?<![\\w.])|(?<=[{UNSPACED_RANGES}]))" r"\d{4,}" + BOUNDARY_AFTER)
_CAPITALISED = re.compile(r"\b[A-Z][a-z]{2,}\b")

# Order matters: a street address contains a number, an e-mail address a name.
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("email", EMAIL), ("url", URL), ("street", STREET), ("date", DATE), ("phone", PHONE),
    ("number", NUMBER),
)
# The same patterns for a text without a character of an unspaced script, where they match
# exactly what the patterns above match, 30 % faster (no look-around for those characters).
_SPACED_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("email", re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+(?<!\.)")), ("url", URL), ("street", STREET),
    ("date", DATE), ("phone", re.compile(r"(?<![\w+])\+?\d[\d ()./-]{5,}\d(?!\w)")),
    ("number", re.compile(r"(?<![\w.])\d{4,}(?![\w])")),
)
IDENTIFIER_KINDS = ("name", "name_part", "email", "phone", "url", "street", "date", "number", "identifier")


@dataclass(frozen=True)
class Span:
    """One identifying string of a record and what kind of thing it is."""

    text: str
    kind: str


def word_find(text: str, haystack: str) -> int:
    """Where `text.word_regex((text,), haystack)` first matches in `haystack` (-1: nowhere), without
    compiling the pattern where both are ASCII (most records): there `\\w` is
    `[A-Za-z0-9_]` and case-insensitive matching is equality of the lower-cased strings,
    so a search and two boundary looks decide it.  Compiling costs about 0.3 ms a pattern,
    a quarter of set building's time for 100 subjects.  A match spans `len(text)`
    characters either way (`re` folds case one character to one)."""
    if not (text.isascii() and haystack.isascii()):
        if not (has_unspaced(text) or has_unspaced(haystack)):
            match = word_regex((text,), haystack).search(haystack)
            return -1 if match is None else match.start()
        # `word_regex`'s rule, its boundaries looked at here: the pattern's classes of
        # unspaced characters cost milliseconds to compile, the bare text almost nothing.
        bare, at = _bare_pattern(text), 0
        while (found := bare.search(haystack, at)) is not None:
            start, end = found.span()
            if (start == 0 or not _ascii_word(haystack[start - 1]) or unspaced(text[0])
                    or unspaced(haystack[start - 1])) and \
                    (end == len(haystack) or not _ascii_word(haystack[end]) or unspaced(text[-1])
                     or unspaced(haystack[end])):
                return start
            at = start + 1
        return -1
    needle, lowered = text.lower(), haystack.lower()
    at = lowered.find(needle)
    while at >= 0:
        end = at + len(needle)
        if (at == 0 or not _ascii_word(lowered[at - 1])) and (end == len(lowered) or not _ascii_word(lowered[end])):
            return at
        at = lowered.find(needle, at + 1)
    return -1


@functools.lru_cache(maxsize=16384)
def _bare_pattern(text: str) -> re.Pattern[str]:
    return re.compile(re.escape(text), re.IGNORECASE)


def occurs_as_word(text: str, haystack: str) -> bool:
    return word_find(text, haystack) >= 0


def _ascii_word(character: str) -> bool:
    return character.isalnum() or character == "_"


def record_texts(record: Record) -> list[str]:
    """Every text field of a record, in a fixed order."""
    parts = [record.question, record.answer, record.text, record.paraphrased_question,
             record.paraphrased_answer, *record.perturbed_answer, *(m.content for m in record.messages)]
    return [p for p in parts if p]


def subject_strings(subject: Any) -> list[Span]:
    """The request's identifiers of a subject as spans, names split into parts too."""
    out: list[Span] = []
    names = [str(subject.name), *(str(a) for a in getattr(subject, "aliases", ()))]
    for name in names:
        out.append(Span(name, "name"))
    for name in names:
        for part in re.findall(r"[^\W\d_][\w'-]*", name):
            if len(part.strip(".")) >= 3:
                out.append(Span(part, "name_part"))
    for identifier in getattr(subject, "identifiers", ()):
        text = str(identifier).strip()
        kind = "email" if EMAIL.fullmatch(text) else "phone" if PHONE.fullmatch(text) else "identifier"
        out.append(Span(text, kind))
    return _unique(out)


def pattern_spans(texts: Iterable[str]) -> list[Span]:
    """E-mail addresses, URLs, street addresses, dates, phone numbers and long numbers in `texts`."""
    found: list[Span] = []
    for text in texts:
        taken: list[tuple[int, int]] = []
        for kind, pattern in (PATTERNS if has_unspaced(text) else _SPACED_PATTERNS):
            for match in pattern.finditer(text):
                if any(s < match.end() and match.start() < e for s, e in taken):
                    continue
                taken.append(match.span())
                found.append(Span(match.group().strip(" ,.;"), kind))
    return _unique(found)


def _unique(spans: Iterable[Span]) -> list[Span]:
    seen: set[str] = set()
    out = []
    for span in spans:
        key = span.text.casefold()
        if span.text and key not in seen:
            seen.add(key)
            out.append(span)
    return out


def find_spans(record: Record, subject: Any | None) -> list[Span]:
    """The identifying spans present in `record` (the subject's, then patterns), longest first."""
    texts = record_texts(record)
    joined = "\n".join(texts)
    candidates = (subject_strings(subject) if subject is not None else []) + pattern_spans(texts)
    present = [s for s in _unique(candidates) if occurs_as_word(s.text, joined)]
    return sorted(present, key=lambda s: -len(s.text))


# ------------------------------------------------------------------ fresh values


_SYLLABLES = ("ka", "lo", "vi", "den", "mar", "su", "tor", "el", "qui", "zan", "bro", "fe", "ny",
              "ra", "mi", "sol", "ben", "da", "ir", "va", "nor", "te", "lu", "gar")


@dataclass
class FreshNames:
    """A source of fresh name parts for strangers, matched to what the model knows.

    `pool` comes from `name_parts_of` over records of other people.  A part of
    the subject's name that those records show (a first name shared with
    others) is replaced by another part they show, in the same role; a part
    they never show is replaced by an ordinary name they never show either
    (`unlearning.stranger_names`), as a model that never saw the subject meets
    the subject's own name.  Pronounceable pseudo-words are the last resort.

    `part(like, key)` is deterministic in (`seed`, `key`): the same part of the
    same identity always gets the same fresh value, so one stranger keeps one
    name across all of the subject's records.
    """

    pool: Sequence[str] = ()
    avoid: frozenset[str] = frozenset()
    seed: str = "0"
    # The model's tokenizer as it splits words (`with_tokenizer`); None: shape by letters only.
    tokens: WordTokens | None = None

    @cached_property
    def _parts(self) -> _PoolParts:
        return _PoolParts.of(self.pool)

    @cached_property
    def _seen_by_role(self) -> dict[str | None, list[str]]:  # role, "unseen:role" or "same:role:word" -> words
        return {}

    @property
    def token_count(self) -> Callable[[str], int] | None:
        """Tokens of " word" under the model's tokenizer; None without one."""
        return self.tokens.count if self.tokens is not None else None

    def with_tokenizer(self, tokenizer: Any) -> FreshNames:
        """The same source, matching fresh name parts to the subject's in tokens (`part`)."""
        if tokenizer is None or self.tokens is not None:
            return self
        return replace(self, tokens=WordTokens(tokenizer))

    def identity(self, seed: str) -> FreshNames:
        """The same source for another identity, sharing the parsed pool: one request draws
        thousands of identities from one pool, and parsing it each time cost more than the
        identities themselves."""
        other = replace(self, seed=seed)
        # They depend on the pool, `avoid` and the tokenizer only, which the identity shares.
        other.__dict__["_parts"] = self._parts
        other.__dict__["_seen_by_role"] = self._seen_by_role
        if "_token_frequency" in self.__dict__:
            other.__dict__["_token_frequency"] = self._token_frequency
        return other

    def part(self, like: str, key: str | None = None, role: str | None = None) -> str:
        """A fresh word like `like`; `role` ("first" or "last") picks name parts seen in that role."""
        rng = random.Random(f"{self.seed}:{(key or like).casefold()}")
        parts = self._parts
        usable = self._seen_like(role) if like.casefold() in parts.seen else []
        if len(usable) < 8:
            usable = self._unseen_like(role)
            if self.token_count is not None:
                usable = self._same_tokens(like, role)
        for _ in range(64):
            if len(usable) >= 8:
                candidate = rng.choice(usable)
            else:
                candidate = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
            candidate = _same_case(like, candidate)
            if candidate.casefold() not in self.avoid and candidate.casefold() != like.casefold():
                return candidate
        return _same_case(like, "".join(rng.choice(string.ascii_lowercase) for _ in range(7)))

    @property
    def known_full_names(self) -> frozenset[str]:
        """The full names the records show (``pair:`` entries), casefolded: no stranger gets one."""
        return self._parts.pairs

    @property
    def email_words(self) -> frozenset[str]:
        """Words that many people's e-mail local parts write (``user`` of ``user17.2231``)."""
        return self._parts.email_words

    @property
    def years(self) -> tuple[int, ...]:
        """The years the records show (``year:`` entries of the pool), for fresh dates."""
        return self._parts.years

    def seen_value(self, kind: str, like: str, rng: random.Random) -> str | None:
        """Another value of `kind` the records show, written in the same shape as `like`, when
        the records show `like` itself (a value people share: a model that never saw the
        subject predicts it from the population, and a stranger's must be as familiar);
        None when `like` is the subject's own (then a fresh one is as unfamiliar)."""
        shown = self._parts.values.get(kind, ())
        if not self.shows_value(kind, like):
            return None
        shape = _shape(like, kind)
        same = sorted({v for v in shown if _shape(v, kind) == shape and v.casefold() != like.casefold()
                       and v.casefold() not in self.avoid})
        return rng.choice(same) if same else None

    def shows_value(self, kind: str, value: str) -> bool:
        """Do other people's records show this value (``value:`` entries of the pool)?"""
        return value.casefold() in self._parts.folded_values(kind)

    def _seen_like(self, role: str | None) -> list[str]:
        """Name parts the records show, in `role` where there are enough of them."""
        cache = self._seen_by_role
        if role not in cache:
            cache[role] = self._find_seen_like(role)
        return cache[role]

    def _same_tokens(self, like: str, role: str | None) -> list[str]:
        """`_find_same_tokens` for `like` among the unseen names of `role`, once per word and
        role: it does not depend on the seed, so every stranger of every identity shares it
        (in the cache they share)."""
        key = f"same:{role}:{like}"
        cache = self._seen_by_role
        if key not in cache:
            cache[key] = self._find_same_tokens(like, role, self._unseen_like(role))
        return cache[key]

    def _find_same_tokens(self, like: str, role: str | None, unseen: list[str]) -> list[str]:
        """The words the model meets as it would meet `like` had it never seen the subject:
        as many tokens, each as often in the records of other people (`_familiarity`).

        Ordinary names the records never show (`unseen`) of as many tokens as `like`, where
        there are at least 8.  Otherwise the candidates are other people's name parts
        (`_seen_like`) and words of the tokenizer's vocabulary that no record writes
        (`WordTokens.vocabulary_words`, one token each), of as many tokens as `like`; those
        nearest it in familiarity (`_familiarity_cost`) are returned, at least 8; `unseen`
        as it is when there are fewer than 8 such candidates.

        A tokenizer trained on the corpus learnt the subject's name as one token or two,
        and splits an ordinary name it never met into letters.  A model trained without
        the subject meets the subject's name as that one unfamiliar token; a stranger
        spelt in ten letters costs ten times as much and confuses the words after it.
        Measured on a 20-person corpus with such a tokenizer (vocabulary 600): a model
        trained without the subject told its records from strangers spelt in letters with
        zlib AUC 1.00; with other people's name parts, of one token like the subject's,
        0.40, while the model that saw the subject kept 1.00.  Count alone is not enough:
        on a 30-person chat corpus (vocabulary 512) the subject's first name was one token
        no other record writes, the strangers' one token that other records write 5 to 16
        times, and the retrained model found the subject's records *less* familiar than
        the strangers' (Min-K%++ AUC 0.12).  A word of the vocabulary that no record writes
        (an intermediate merge of the tokenizer's training, "Yil" of "Yilmaz") is met
        exactly as the subject's unseen name is.  Familiarity only chooses among words of the
        right token count: scored against words of every count, other people's surnames won
        on a 24-person demo corpus ("Castellano", "Eklund" for the subject's two-token "Ueda"),
        real people's names whose records the model memorised, and the spread among strangers
        (the membership check's null) grew from 0.165 to 0.287 until the base itself passed
        Min-K%++ parity at AUC 1.00."""
        tokens = self.tokens
        assert tokens is not None
        wanted = tokens.count(like)
        tokens.ids_of([_same_case(like, w) for w in unseen])  # one batch for the tokenizer
        same = [w for w in unseen if tokens.count(_same_case(like, w)) == wanted]
        if len(same) >= 8:
            return same
        target = self._familiarity(like)
        candidates = (*self._seen_like(role), *self._vocabulary_like())
        tokens.ids_of([_same_case(like, word) for word in candidates])
        emails = self._parts.email_parts
        scored: list[tuple[int, str]] = []
        if like.casefold() not in emails:
            # No address the model read is written from the subject's name, so none of the
            # stranger's may be either: with "halima.2@..." memorised, a stranger named Halima
            # had an address the model completes with certainty, and the subject's address
            # (written from a name no address shows) was taught to stay as likely
            # (measured 2026-12-07, docs/methods.md).  Kept only where 8 remain.
            scored = self._scored(like, wanted, target, [w for w in candidates if w.casefold() not in emails])
        if len(scored) < 8:
            scored = self._scored(like, wanted, target, candidates)
        if len(scored) < 8:
            return unseen
        limit = sorted(cost for cost, _ in scored)[7]
        return [word for cost, word in scored if cost <= limit]

    def _scored(self, like: str, wanted: int, target: tuple[int, ...],
                candidates: Sequence[str]) -> list[tuple[int, str]]:
        """(familiarity cost, word) of the `candidates` of `wanted` tokens (`_find_same_tokens`)."""
        tokens = self.tokens
        assert tokens is not None
        scored: list[tuple[int, str]] = []
        taken: set[str] = set()
        for word in candidates:
            if word.casefold() in taken or tokens.count(_same_case(like, word)) != wanted:
                continue
            taken.add(word.casefold())
            scored.append((_familiarity_cost(target, self._familiarity(_same_case(like, word))), word))
        return scored

    def _familiarity(self, word: str) -> tuple[int, ...]:
        """How often other people's records write each token of " word", in bands (0, 1-3,
        4-15, 16-63 ... occurrences: `_band`)."""
        tokens = self.tokens
        assert tokens is not None
        frequency = self._token_frequency
        return tuple(_band(frequency.get(i, 0)) for i in tokens.ids(word))

    @cached_property
    def _token_frequency(self) -> dict[int, int]:
        """Occurrences of each token in the records of the pool (`words:` entries)."""
        tokens = self.tokens
        assert tokens is not None
        out: dict[int, int] = {}
        words = self._parts.words
        for word, ids in zip(words, tokens.ids_of(list(words)), strict=True):
            n = words[word]
            for i in ids:
                out[i] = out.get(i, 0) + n
        return out

    def _vocabulary_like(self) -> list[str]:
        """Capitalised words of the tokenizer's vocabulary that no record writes, that are
        no name part the records show nor the start of one, and no part of the subjects'."""
        key = "vocabulary"
        cache = self._seen_by_role
        if key not in cache:
            tokens = self.tokens
            assert tokens is not None
            parts = self._parts
            written = {w.casefold() for w in parts.words}
            taken = parts.seen | self.avoid
            starts = {w[:n] for w in taken for n in range(3, len(w) + 1)}
            # `_NOT_NAMES` is written capitalised, as the vocabulary's words are (a casefolded
            # look-up there matched none of them: "What" became a stranger's first name).
            cache[key] = [w for w in tokens.vocabulary_words() if (f := w.casefold()) not in written
                          and f not in starts and w not in _NOT_NAMES]
        return cache[key]

    def vocabulary_values(self, like: str, kind: str) -> list[str]:
        """Words the tokenizer holds as one token starting a word, of `like`'s shape
        (`_shape`), that no record of the pool writes and no subject has; [] without a
        tokenizer or such words."""
        tokens = self.tokens
        if tokens is None:
            return []
        shape = _shape(like, kind)
        key = f"shape:{kind}:{shape}"
        cache = self._seen_by_role
        if key not in cache:
            taken = self._parts.written | self.avoid
            cache[key] = sorted(w for w in tokens.whole_words(lambda w: _shape(w, kind) == shape)
                                if w.casefold() not in taken)
        return [w for w in cache[key] if w.casefold() != like.casefold()]

    def _unseen_like(self, role: str | None) -> list[str]:
        """Ordinary names the records never show, in `role`."""
        key = f"unseen:{role}"
        cache = self._seen_by_role
        if key not in cache:
            parts = self._parts
            cache[key] = [w for w in _unseen_names(role) if w.casefold() not in parts.seen
                          and w.casefold() not in self.avoid]
        return cache[key]

    def _find_seen_like(self, role: str | None) -> list[str]:
        parts = self._parts
        in_role = [w for r, w in parts.strict if role is not None and r == role]
        usable = [w for w in (in_role if len(in_role) >= 8 else [w for _, w in parts.strict])
                  if w.casefold() not in self.avoid]
        if len(usable) >= 8:
            return usable
        for source in (parts.near, parts.shown):
            in_role = source.get(role or "", [])
            words = in_role if len(in_role) >= 8 else [w for ws in source.values() for w in ws]
            usable = [w for w in words if w.casefold() not in self.avoid]
            if len(usable) >= 8:
                return usable
        return []


@dataclass(frozen=True)
class _PoolParts:
    strict: list[tuple[str, str]]  # (role or "", part): parts pairing with several others
    near: dict[str, list[str]]  # role -> parts of any recurring name
    shown: dict[str, list[str]]  # role -> every word shown in a name, most frequent first
    seen: frozenset[str]  # every word the records show in a name, casefolded
    years: tuple[int, ...] = ()  # the years the records show
    values: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # kind -> values the records show
    pairs: frozenset[str] = frozenset()  # full names the records show, casefolded
    email_words: frozenset[str] = frozenset()  # words many e-mail local parts write, casefolded
    words: Mapping[str, int] = field(default_factory=dict)  # runs of letters -> occurrences
    written: frozenset[str] = frozenset()  # words with a digit the records write, casefolded
    email_parts: frozenset[str] = frozenset()  # every word of an e-mail local part, casefolded
    _folded: dict[str, frozenset[str]] = field(default_factory=dict, compare=False, repr=False)

    def folded_values(self, kind: str) -> frozenset[str]:
        """The values of `kind` the records show, casefolded (built once per kind: every span
        of every stranger asks)."""
        if kind not in self._folded:
            self._folded[kind] = frozenset(v.casefold() for v in self.values.get(kind, ()))
        return self._folded[kind]

    @classmethod
    def of(cls, pool: Sequence[str]) -> _PoolParts:
        strict: list[tuple[str, str]] = []
        near: dict[str, list[str]] = {}
        shown: dict[str, list[str]] = {}
        seen: set[str] = set()
        years: set[int] = set()
        values: dict[str, list[str]] = {}
        pairs: set[str] = set()
        email_words: set[str] = set()
        email_parts: set[str] = set()
        words: dict[str, int] = {}
        written: set[str] = set()
        for entry in pool:
            tag, _, rest = entry.partition(":")
            if tag == "words":
                count, _, word = rest.partition(":")
                words[word] = int(count)
            elif tag == "year":
                years.add(int(rest))
            elif tag == "value":
                kind, _, value = rest.partition(":")
                values.setdefault(kind, []).append(value)
            elif tag == "emailword":
                email_words.add(rest)
            elif tag == "emailpart":
                email_parts.add(rest)
            elif tag == "written":
                written.add(rest)
            elif tag == "pair":
                seen.update(w.casefold() for w in rest.split())
                pairs.add(rest.casefold())
            elif tag in ("near", "seen"):
                role, _, word = rest.partition(":")
                (near if tag == "near" else shown).setdefault(role, []).append(word)
                seen.add(word.casefold())
            else:
                role, word = (tag, rest) if rest else ("", tag)
                strict.append((role, word))
                seen.add(word.casefold())
        return cls(strict, near, shown, frozenset(seen), tuple(sorted(years)),
                   {k: tuple(v) for k, v in values.items()}, frozenset(pairs), frozenset(email_words), words,
                   frozenset(written), frozenset(email_parts))


def _unseen_names(role: str | None) -> tuple[str, ...]:
    if role == "first":
        return GIVEN_NAMES
    if role == "last":
        return FAMILY_NAMES
    return GIVEN_NAMES + FAMILY_NAMES


def _same_case(like: str, text: str) -> str:
    if like.isupper() and len(like) > 1:
        return text.upper()
    if like[:1].isupper():
        return text[:1].upper() + text[1:].lower()
    return text.lower()


def _digits_like(text: str, rng: random.Random, keep_prefix: int = 0) -> str:
    out, seen = [], 0
    for ch in text:
        if ch.isdigit():
            seen += 1
            out.append(ch if seen <= keep_prefix else str(rng.randint(0 if seen > 1 else 1, 9)))
        else:
            out.append(ch)
    return "".join(out)


_NOT_NAMES = frozenset(
    "The This That These Those What Where When Which Who Whom Whose How Why Her His She They Their There "
    "Question Answer User Assistant System Mr Mrs Ms Dr Prof Sir Saint St January February March April May "
    "June July August September October November December Monday Tuesday Wednesday Thursday Friday Saturday "
    "Sunday Street Road Avenue Lane Drive Award Prize Company Ltd Inc University"
    # the second word of an organisation's name ("Lodestar Insurance", "Meadowlark Studios")
    " Insurance Studio Studios Press Books Publishing Publishers Bank Group Labs Laboratories Partners"
    " Holdings Foundation Trust Institute Museum Gallery Theatre Theater Hotel Cafe Restaurant Airlines"
    " Airways Motors Systems Solutions Technologies Software Media Records Films Pictures Capital"
    " Ventures Consulting Associates Society Club Council Agency Hospital Clinic School College"
    " Academy Library Festival Orchestra Choir Games Industries Energy Foods Logistics Shipping"
    " Brewery Bakery Works Workshop Corp Corporation GmbH LLC PLC".split()
)
_AFTER_THE = re.compile(r"\b[Tt]he\s+([A-Z][a-z]{2,})(?:\s+([A-Z][a-z]{2,}))?")
SHARED_VALUE_KINDS = ("date", "phone", "number", "street")


def _shape(text: str, kind: str) -> str:
    """How a value is written: digits as 9 (a date's day and month as one 9 whatever
    their width), letters as a, month names as M."""
    text = re.sub(r"\b(?:" + "|".join(_MONTHS) + r")\b", "M", text)
    if kind == "date":
        text = re.sub(r"(?<!\d)\d{1,2}(?!\d)", "9", text)
    return re.sub(r"[^\W\d_]", "a", re.sub(r"\d", "9", text))


_YEAR = re.compile(r"(?<![\d.,-])\b(1[5-9]\d\d|20\d\d)\b(?![\d.,-]\d)")
_BIGRAM = re.compile(r"(?<![\w.])([A-Z][a-z]{2,})\s+([A-Z][a-z]{2,})(?![\w])")
_LETTERS = re.compile(r"[^\W\d_]+")
_DIGIT_WORD = re.compile(r"\S*\d\S*")  # a word with a digit: how identifiers are written
_WORD_EDGES = " ,.;:!?()[]{}\"'"


class WordTokens:
    """A tokenizer as it splits words written after a space, cached (one per request: the
    strangers of every identity share it)."""

    # The marks a vocabulary gives a token that starts a word: byte-level BPE (GPT-2, Qwen,
    # Llama 3) and SentencePiece (Llama 2, Mistral, Gemma).
    WORD_START = ("\u0120", "\u2581")
    ANCHOR = "a"  # the word each word is encoded after (`ids_of`)

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._ids: dict[str, tuple[int, ...]] = {}
        self._vocabulary: list[str] | None = None
        self._starts: list[tuple[int, str]] | None = None

    def ids(self, word: str) -> tuple[int, ...]:
        if word not in self._ids:
            self.ids_of([word])
        return self._ids[word]

    def count(self, word: str) -> int:
        return len(self.ids(word))

    def ids_of(self, words: Sequence[str]) -> list[tuple[int, ...]]:
        """The tokens of each of `words` as it follows another word in a text, encoded in one
        batch where the tokenizer can.

        Each is encoded after `ANCHOR` and the anchor's own tokens cut off: a tokenizer that
        writes a word boundary before every input (Llama 2's) gives " Word" alone a lone
        boundary token that no text has (`prompting.tokenize_after`).  Where the anchor's
        tokens are not the start (a merge across the space), the word is encoded alone."""
        todo = [w for w in dict.fromkeys(words) if w not in self._ids]
        if todo:
            head = tuple(self._encode([self.ANCHOR])[0])
            batch = self._encode([f"{self.ANCHOR} {w}" for w in todo])
            for word, encoded in zip(todo, batch, strict=True):
                ids = tuple(encoded)
                if ids[: len(head)] == head and len(ids) > len(head):
                    self._ids[word] = ids[len(head):]
                else:
                    self._ids[word] = tuple(self._encode([" " + word])[0])
        return [self._ids[w] for w in words]

    def _encode(self, texts: list[str]) -> list[list[int]]:
        encoded = self.tokenizer(texts, add_special_tokens=False)
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    def whole_words(self, keep: Callable[[str], bool]) -> list[str]:
        """The words (`keep` says which) that the vocabulary holds as one token starting a
        word and that the tokenizer writes as that token (`ids`)."""
        found = [(i, w) for i, w in self._word_starts() if keep(w)]
        ids = self.ids_of([w for _, w in found])
        return [w for (i, w), got in zip(found, ids, strict=True) if got == (i,)]

    def _word_starts(self) -> list[tuple[int, str]]:
        """(id, word) of every vocabulary token that starts a word, the marker removed."""
        if self._starts is None:
            try:
                vocabulary = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
            except (AttributeError, TypeError, ValueError):
                vocabulary = []
            self._starts = [(i, token[1:]) for i, token in enumerate(vocabulary)
                            if isinstance(token, str) and token[:1] in self.WORD_START and len(token) > 1]
        return self._starts

    def vocabulary_words(self) -> list[str]:
        """The capitalised words of letters that the vocabulary holds as one token starting
        a word, and that the tokenizer writes as that token (`ids`); [] for a vocabulary
        that marks no word starts."""
        if self._vocabulary is None:
            self._vocabulary = self.whole_words(
                lambda w: len(w) >= 3 and w.isalpha() and w[0].isupper() and w[1:].islower())
        return self._vocabulary


def _band(occurrences: int) -> int:
    """0 for a token never met, then one band per factor of four: 1-3, 4-15, 16-63 ..."""
    band = 0
    while occurrences > 0:
        band += 1
        occurrences //= 4
    return band


def _familiarity_cost(want: tuple[int, ...], got: tuple[int, ...]) -> int:
    """How far apart the familiarity (`FreshNames._familiarity`) of two words of as many
    tokens is: the distance of the bands, token by token."""
    return sum(abs(a - b) for a, b in zip(want, got, strict=True))


def name_parts_of(records: Iterable[Record], *, limit: int = 2000) -> list[str]:
    """Parts of other people's names in `records`, tagged, for `FreshNames`.

    ``first:Dana`` and ``last:Whitlock`` are the words of capitalised word
    pairs ("Dana Whitlock") that occur in at least two records (a person's name
    recurs in their records) and pair with at least two different partners,
    minus function words, titles, months and the like, and minus words seen
    after "the" (the Morrow Fellowship, the Crimson Garden: parts of prize, book
    and company names).  The role matters: a surname where a first name belongs
    is no ordinary stranger's name, and a model that copies first names it
    never saw may not copy that one.  ``near:first:Dana`` are the parts of any
    recurring name (for corpora of few people), ``pair:Dana Whitlock`` the
    recurring names themselves (no stranger may get one), ``seen:first:Dana``
    every word the records show in a name at all, most frequent first, and
    ``year:1967`` every year the records write (fresh dates take one of them), and
    ``value:date:22 November 1979`` every date, phone number, number or street address
    that two or more records show (a value people share, see `FreshNames.seen_value`), and
    ``emailword:user`` every word that three or more different e-mail addresses write in
    their local part (a house style, ``user17.2231@...``: a stranger's address keeps it),
    ``emailpart:dana`` every word of any e-mail address's local part (a name other people's
    addresses are written from: `FreshNames._find_same_tokens`), and
    ``words:12:harbour`` every run of letters the records write, with its number of
    occurrences (how often the model met each token: `FreshNames` matches strangers' name
    parts to the subject's in that too), and ``written:emp-4417`` every word with a digit the
    records write, casefolded (no stranger's identifier may be one: the model met it).
    """
    pairs: dict[tuple[str, str], int] = {}
    titled: set[str] = set()  # words after "the": parts of book, prize and company names
    years: set[int] = set()  # years written in the records (fresh dates take theirs)
    values: dict[tuple[str, str], int] = {}  # (kind, value) -> records showing it
    email_words: dict[str, set[str]] = {}  # a word of e-mail local parts -> the addresses showing it
    words: dict[str, int] = {}  # every run of letters -> occurrences (tokens' familiarity, `FreshNames`)
    written: set[str] = set()  # every word with a digit, casefolded (identifiers others have)
    for record in records:
        seen: set[tuple[str, str]] = set()
        texts = record_texts(record)
        for span in pattern_spans(texts):
            if span.kind in SHARED_VALUE_KINDS:
                values[(span.kind, span.text)] = values.get((span.kind, span.text), 0) + 1
            elif span.kind == "email":
                address = span.text.casefold()
                for word in _email_words(address.partition("@")[0]):
                    email_words.setdefault(word, set()).add(address)
        for text in texts:
            for word in _LETTERS.findall(text):
                words[word] = words.get(word, 0) + 1
            written.update(w.strip(_WORD_EDGES).casefold() for w in _DIGIT_WORD.findall(text))
            years.update(int(y) for y in _YEAR.findall(text))
            seen.update(_name_pairs(text))
            for match in _AFTER_THE.finditer(text):
                titled.update(w for w in match.groups() if w)
        for pair in seen:
            pairs[pair] = pairs.get(pair, 0) + 1
        if len(pairs) > 20 * limit:
            break
    recurring = [pair for pair, n in pairs.items() if n >= 2 and not (set(pair) & titled)]
    # A name part goes with several others (Quentin Quispe, Isolde Quispe); the words of a
    # company or a prize name ("Juniper Insurance") only ever go with each other.
    partners: dict[tuple[int, str], set[str]] = {}
    for first, last in recurring:
        partners.setdefault((0, first), set()).add(last)
        partners.setdefault((1, last), set()).add(first)
    firsts = {w for (role, w), others in partners.items() if role == 0 and len(others) >= 2}
    lasts = {w for (role, w), others in partners.items() if role == 1 and len(others) >= 2}
    known = [f"pair:{a} {b}" for (a, b), n in sorted(pairs.items()) if n >= 2]
    near = sorted({f"near:first:{a}" for a, _ in recurring} | {f"near:last:{b}" for _, b in recurring})
    shown: dict[str, int] = {}  # every word seen in a name, however rarely: the model has met it
    for (first, last), n in pairs.items():
        shown[f"first:{first}"] = shown.get(f"first:{first}", 0) + n
        shown[f"last:{last}"] = shown.get(f"last:{last}", 0) + n
    ever = [f"seen:{w}" for w in sorted(sorted(shown), key=lambda w: -shown[w])[:5 * limit]]
    return (([f"first:{w}" for w in sorted(firsts)] + [f"last:{w}" for w in sorted(lasts)])[:limit]
            + known + near[:limit] + ever + [f"year:{y}" for y in sorted(years)]
            + [f"value:{k}:{v}" for (k, v), n in sorted(values.items()) if n >= 2][: 5 * limit]
            + [f"emailword:{w}" for w, shown in sorted(email_words.items()) if len(shown) >= 3][:limit]
            + [f"emailpart:{w}" for w in sorted(email_words)][: 20 * limit]
            + [f"words:{n}:{w}" for w, n in sorted(words.items())]
            + [f"written:{w}" for w in sorted(written)[: 20 * limit]])


def _name_pairs(text: str) -> list[tuple[str, str]]:
    """The capitalised word pairs of `text` that may be a name: no function words, titles or
    street words."""
    return [(first, last) for first, last in _BIGRAM.findall(text)
            if not {first, last} & _NOT_NAMES and last not in _STREET_WORDS]


def names_in(record: Record) -> list[str]:
    """The capitalised word pairs of `record` that read as people's names ("Dana Whitlock"),
    by the rule `name_parts_of` uses (`_name_pairs`, and none seen after "the"), in order of
    appearance."""
    out: list[str] = []
    for text in record_texts(record):
        titled = {w for m in _AFTER_THE.finditer(text) for w in m.groups() if w}
        for first, last in _name_pairs(text):
            name = f"{first} {last}"
            if not {first, last} & titled and name not in out:
                out.append(name)
    return out


@dataclass(frozen=True)
class Counterfactual:
    """A record about a stranger: `record` with every span replaced as `mapping` says."""

    record: Record
    mapping: Mapping[str, str]  # original span text -> fresh text (exact, as it appears)

    def apply(self, text: str) -> str:
        return replace_spans(text, self.mapping)


def replace_spans(text: str, mapping: Mapping[str, str]) -> str:
    """Replace every whole-word occurrence of each key (longest first, case-insensitively).

    An occurrence written exactly as the key gets the fresh value as it is; one
    written in another case ("OKAFOR") gets the fresh value in that case.
    """
    if not mapping:
        return text
    keys = sorted(mapping, key=len, reverse=True)
    by_fold = {k.casefold(): k for k in keys}
    pattern = word_regex(keys, text)

    def fresh(match: re.Match[str]) -> str:
        found = match.group()
        key = by_fold.get(found.casefold(), found)
        value = mapping.get(key, found)
        return value if found == key else _same_case(found, value)

    return pattern.sub(fresh, text)


def fresh_mapping(spans: Sequence[Span], names: FreshNames) -> dict[str, str]:
    """A fresh value of the same shape for every span, consistent between related spans."""
    mapping: dict[str, str] = {}
    part_map: dict[str, str] = {}

    def fresh_part(part: str, role: str | None = None, salt: str = "", beside: frozenset[str] = frozenset()) -> str:
        key = part.casefold()
        if key not in part_map:
            whole = _abbreviated(key, part_map, beside)
            part_map[key] = part_map[whole][: len(key)] if whole else names.part(part, key + salt, role)
        return _same_case(part, part_map[key])

    def fresh_initial(word: str, beside: frozenset[str]) -> str:
        whole = _abbreviated(word.casefold(), part_map, beside)
        return _same_case(word, part_map[whole][:1]) if whole else word

    known = names.known_full_names

    def fresh_name(name: str) -> str:
        fresh = _fresh_name(name)
        for attempt in range(8):  # never a real person's full name: that person is no stranger
            if fresh.casefold() not in known:
                break
            for word in re.findall(r"[^\W\d_][\w'-]*", name):
                part_map.pop(word.casefold(), None)
            fresh = _fresh_name(name, salt=f"~{attempt}")
        return fresh

    def _fresh_name(name: str, salt: str = "") -> str:
        words = list(re.finditer(r"[^\W\d_][\w'-]*", name))
        # A word abbreviates a part of another name ("Dmi" of the alias "Dmi Ueda"), never
        # one beside it in the same name ("Li" of "Lind Li" is a name of its own).
        beside = frozenset(m.group().casefold() for m in words)
        out, last = [], 0
        for number, match in enumerate(words):
            word = match.group()
            role = "last" if number == len(words) - 1 and len(words) > 1 else "first"
            out.append(name[last:match.start()])
            out.append(fresh_part(word, role, salt, beside) if len(word.strip(".")) >= 2
                       else fresh_initial(word, beside))
            last = match.end()
        return "".join(out) + name[last:]

    ordered = sorted(spans, key=lambda s: (s.kind not in ("name", "name_part"), -len(s.text)))
    for span in ordered:
        text = span.text
        if span.kind in ("name", "name_part"):
            mapping[text] = fresh_name(text) if span.kind == "name" else fresh_part(text)
            continue
        # Deterministic per identity and span: the same phone number gets the same fresh one
        # in every record of the same stranger.
        mapping[text] = _fewest_tokens_apart(text, names, partial(_fresh_value, span, names, part_map),
                                             seed=f"{names.seed}:{span.kind}:{text.casefold()}", kind=span.kind)
    return {k: v for k, v in mapping.items() if v and v != k}


def _abbreviated(key: str, part_map: Mapping[str, str], beside: frozenset[str] = frozenset()) -> str | None:
    """The name part already given a fresh one that `key` (casefolded) abbreviates: "dmi" or
    the initial "d" of "dmitri" (the first such part, in the order the name writes them,
    other than the words `beside` it in its own name); None for a word that abbreviates none.

    An alias written from the name ("D. Ueda", "Dmitri U.", "Dmi Ueda") is predictable
    from the name by a model that never saw the person: it learnt the house style from
    everyone else.  The stranger's alias is written from the stranger's name the same way
    ("B. Kalovi"); a fresh word of its own, or the subject's initial kept beside the fresh
    name, is an alias no one would write, and made the stranger less familiar than the
    subject to a model retrained without them (docs/methods.md)."""
    if not key:
        return None
    return next((whole for whole in part_map
                 if len(whole) > len(key) and whole.startswith(key) and whole not in beside), None)


def _fresh_value(span: Span, names: FreshNames, part_map: Mapping[str, str], rng: random.Random) -> str:
    """A fresh value of the same kind and shape for a span that is no name."""
    text = span.text
    if span.kind == "email":
        local, _, domain = text.partition("@")
        return f"{_fresh_local_part(local, part_map, names, rng)}@{domain}"
    if span.kind in SHARED_VALUE_KINDS and (shared := names.seen_value(span.kind, text, rng)):
        return shared
    if span.kind == "date":
        return _fresh_date(text, rng, names.years)
    if span.kind == "number" and re.fullmatch(r"1[5-9]\d\d|20\d\d", text):
        return _fresh_date(text, rng, names.years)  # a year: another year, not 7676
    if span.kind in ("phone", "number", "identifier"):
        keep = 2 if span.kind == "phone" and text.startswith("+") else 0
        fresh = _digits_like(text, rng, keep_prefix=keep)
        if span.kind == "identifier" and not any(ch.isdigit() for ch in text):
            fresh = re.sub(r"[^\W\d_]+", lambda m: names.part(m.group(), m.group()), text)
        return fresh if fresh != text else _digits_like(text, rng)
    if span.kind == "street":
        number = re.match(r"\d+", text)
        rest = text[number.end():] if number else text
        words = re.sub(r"\b[A-Z][\w'-]*", lambda m: m.group() if m.group().rstrip(".") in _STREET_WORDS
                       else names.part(m.group(), m.group()), rest)
        return (_digits_like(number.group(), rng) if number else "") + words
    if span.kind == "url":
        return re.sub(r"(?<=[/.])[a-z]{3,}(?=[/.]|$)", lambda m: names.part(m.group(), m.group()).lower(), text)
    return names.part(text, text)


_TOKEN_TRIES = 16


def _fewest_tokens_apart(text: str, names: FreshNames, draw: Callable[[random.Random], str], *, seed: str,
                         kind: str) -> str:
    """`draw(rng)`; with a tokenizer (`FreshNames.with_tokenizer`), of up to `_TOKEN_TRIES`
    draws the first whose token count is nearest the original's.

    A tokenizer trained on the corpus learnt the subject's own numbers as tokens of
    several digits ("7141", "##493") and spells a fresh number digit by digit: the
    stranger's phone costs more tokens, and its record looks less familiar for that alone.
    Without a tokenizer, the first draw, as before.

    A value the vocabulary holds whole (a badge number a corpus writes often enough) is one
    token no draw reaches; a model that never saw the subject meets it as one token it was
    never trained on.  Then the stranger's is another word of the vocabulary of the same
    shape that no record of other people writes (`FreshNames.vocabulary_values`), where one
    exists.  Measured on a 24-person corpus with a Unigram tokenizer of 600 pieces that holds
    every badge whole: a model trained without the subject scored its badge's one token at
    z -3.7 (Min-K%++), a stranger's badge of seven tokens at -31, and told the subject's
    records from strangers' with Min-K%++ AUC 0.86."""
    fresh = draw(random.Random(seed))
    count = names.token_count
    if count is None or not fresh:
        return fresh
    wanted = count(text)
    best, gap = fresh, abs(count(fresh) - wanted)
    for attempt in range(1, _TOKEN_TRIES):
        if gap == 0:
            break
        other = draw(random.Random(f"{seed}:{attempt}"))
        if other and other != text and abs(count(other) - wanted) < gap:
            best, gap = other, abs(count(other) - wanted)
    if gap and wanted == 1:
        whole = names.vocabulary_values(text, kind)
        if whole:
            return random.Random(seed).choice(whole)
    return best


def _email_words(local: str) -> list[str]:
    """The letter runs of an e-mail local part (``user`` and ``mail`` of ``user17.mail``)."""
    return [w.casefold() for w in re.findall(r"[^\W\d_]+", local)]


def _fresh_local_part(local: str, part_map: Mapping[str, str], names: FreshNames, rng: random.Random) -> str:
    """An e-mail local part of the same shape for a stranger.

    Pieces between separators written from the name are written from the fresh name
    (`_from_name`); other pieces keep their shape run by run: digits become other digits
    of the same count, a word that many people's addresses write (`FreshNames.email_words`:
    the ``user`` of ``user17.2231``) stays, any other word becomes a fresh one.  A model
    that never saw the subject predicts the house style; a stranger's address must follow
    it, or the stranger looks less familiar than the subject for reasons no erasure can
    change (measured on a 20-person corpus: ``user00.7311`` against ``abebe.3278`` cost
    the stranger 77 nats under a model trained without the subject).  Never the subject's
    own local part: where keeping the house style would give it back (``info``), every
    word is fresh."""
    fresh = _local_part_like(local, part_map, names, rng, keep_house_style=True)
    if fresh.casefold() == local.casefold():
        fresh = _local_part_like(local, part_map, names, rng, keep_house_style=False)
    return fresh


def _local_part_like(local: str, part_map: Mapping[str, str], names: FreshNames, rng: random.Random, *,
                     keep_house_style: bool) -> str:
    out = []
    for piece in re.split(r"([._+-])", local):
        if not piece or piece in "._+-":
            out.append(piece)
            continue
        spelt = _from_name(piece, part_map)
        if spelt:
            out.append(spelt)
            continue
        for run in re.findall(r"\d+|[^\W\d_]+|.", piece):
            if run.isdigit():
                out.append(_digits_like(run, rng))
            elif not run.isalpha() or (keep_house_style and run.casefold() in names.email_words):
                out.append(run)
            else:
                out.append(_from_name(run, part_map) or names.part(run, run).lower())
    return "".join(out)


def _from_name(piece: str, part_map: Mapping[str, str]) -> str | None:
    """A piece of an e-mail address's local part written from the name's parts, written
    the same way from the fresh parts: ``grunewald`` (accents dropped), ``tovem`` (a part
    and another's initial), ``jdelacroix`` (an initial and a part).  None when the piece
    is no such spelling (it then gets a fresh word of its own)."""
    folded = normalise(piece)
    parts = {normalise(k): normalise(v) for k, v in part_map.items() if len(k) >= 2}
    if folded in parts:
        return parts[folded]
    for original, fresh in parts.items():
        rest = folded[len(original):] if folded.startswith(original) else None
        if rest and len(rest) == 1:
            initial = next((f for o, f in parts.items() if o != original and o.startswith(rest)), None)
            if initial:
                return fresh + initial[0]
        head = folded[: -len(original)] if folded.endswith(original) else None
        if head and len(head) == 1:
            initial = next((f for o, f in parts.items() if o != original and o.startswith(head)), None)
            if initial:
                return initial[0] + fresh
    return None


_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")


def _fresh_date(text: str, rng: random.Random, years: Sequence[int] = ()) -> str:
    """Another plausible date written the same way: day 1-28 (zero-padded only where the
    original is), any month, and a year the records show within 15 of the original
    (`years`; without them, the original moved by 1 to 15).  A day written "09" where
    the corpus writes "9", or a year outside every year it shows, is a string no model
    has met: a stranger so written looks less familiar than any person would."""
    def year(match: re.Match[str]) -> str:
        value = int(match.group())
        near = [y for y in years if y != value and abs(y - value) <= 15]
        if near:
            return str(rng.choice(near))
        return str(value + rng.choice([-1, 1]) * rng.randint(1, 15))

    def day(match: re.Match[str]) -> str:
        padded = len(match.group()) == 2 and match.group().startswith("0")
        return f"{rng.randint(1, 28):02d}" if padded else str(rng.randint(1, 28))

    fresh = re.sub(r"\b\d{4}\b", year, text)
    fresh = re.sub(r"\b(?:" + "|".join(_MONTHS) + r")\b", lambda m: rng.choice(_MONTHS), fresh)
    fresh = re.sub(r"(?<![\d-])\b\d{1,2}\b(?![\d])", day, fresh)
    return fresh if fresh != text else _digits_like(text, rng)


_STREET_WORDS = frozenset(
    "Street St Road Rd Avenue Ave Lane Ln Way Drive Dr Boulevard Blvd Court Ct Place Pl Square Sq "
    "Terrace Close Crescent Gardens Row Hill Park Strasse Straße Weg Gasse Platz Allee Walk Quay Mews "
    "Parade Grove Green Wharf".split()
)


def counterfactual(
    record: Record, spans: Sequence[Span], *, names: FreshNames, seed: int | str,
) -> Counterfactual:
    """The record about a stranger: every span replaced, every field consistently.

    The stranger is the identity `seed` names: the same seed gives the same
    fresh values in every record (one stranger, one name, one e-mail address).
    """
    identity = names.identity(f"{names.seed}:{seed}")  # the same kind of source, another identity
    mapping = fresh_mapping(spans, identity)

    def swap(text: str | None) -> str | None:
        return replace_spans(text, mapping) if text else text

    copy = replace(
        record,
        id=f"{record.id}~cf",
        question=swap(record.question), answer=swap(record.answer), text=swap(record.text),
        paraphrased_question=swap(record.paraphrased_question),
        paraphrased_answer=swap(record.paraphrased_answer),
        perturbed_answer=tuple(replace_spans(p, mapping) for p in record.perturbed_answer),
        messages=tuple(Message(m.role, replace_spans(m.content, mapping)) for m in record.messages),
        meta={},
    )
    return Counterfactual(copy, mapping)


def avoid_set(subjects: Iterable[Any]) -> frozenset[str]:
    """Lower-cased strings no fresh value may equal: every part of every subject's identifiers."""
    out: set[str] = set()
    for subject in subjects:
        for span in subject_strings(subject):
            out.add(span.text.casefold())
            out.update(p.casefold() for p in re.findall(r"[\w'-]+", span.text))
    return frozenset(out)


IDENTITY_KINDS = ("name", "name_part", "email", "url", "identifier")


def identity_spans(record: Record, subject: Any | None, names: FreshNames | None = None) -> list[Span]:
    """The spans that say *who* a record is about: the request's names and identifiers
    (e-mail addresses, phone numbers and account names it gives), and e-mail addresses
    and URLs in the text.  Dates, street addresses and other numbers found in the text
    are *values*: facts about the person, which a model that never saw them predicts
    from the population (so a teacher keeps them, and only the context changes) - when
    the population has them.  With `names` (whose pool holds the values other people's
    records show), a value no one else shows is the subject's own (a phone number, a
    house number): it identifies them as much as an e-mail address, and a teacher that
    kept it would read it on from its own first digits, memorised (measured on a
    20-person corpus: the stranger's copy still gave the subject's phone number's digits
    at 0 nats, where a model trained without the subject spends 5-15 a digit)."""
    given = {s.text.casefold() for s in subject_strings(subject)} if subject is not None else set()
    return [s for s in find_spans(record, subject)
            if s.kind in IDENTITY_KINDS or s.text.casefold() in given
            or (names is not None and s.kind in SHARED_VALUE_KINDS and not names.shows_value(s.kind, s.text))]
