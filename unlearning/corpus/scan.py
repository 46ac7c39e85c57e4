"""The fast corpus scan: raw bytes first, parse and normalise only what can match.

Set building must find every record whose normalised text (`unlearning.text.normalise`)
holds a subject's name or identifier on word boundaries (`text_matching.MultiMatcher`,
the reference).  Most lines of a corpus hold none, and proving that costs far less than
parsing them:

* A line is *simple* when its bytes are ASCII and it has no `\\u` escape.  The decoded
  strings of a simple line are ASCII, so their normalised form is their lower-case form
  with whitespace collapsed, and every run of letters and digits in it appears verbatim
  in the line's lower-cased bytes (JSON never escapes a letter or a digit except by
  `\\u`).  A key's hit therefore implies that the key's longest letter-and-digit run
  (its *token*) occurs in the lower-cased line.
* One pass of a byte-level Aho-Corasick automaton over the tokens (`ahocorasick_rs`, Rust)
  on each lower-cased block finds the simple lines that may hold a hit.
* A line with non-ASCII bytes (and no `\\u` escape) is *folded*: each run of non-ASCII
  characters is replaced by its normalised form, the ASCII bytes are lower-cased.  Every
  run of word characters of the normalised text is a substring of the folded line (the
  normalisation acts character by character but for canonical composition, and no ASCII
  character composes into a character that keeps a word character normalisation would
  keep: `_lines_holding`), so the tokens are looked for in the folded line.  Where every
  token is ASCII and the needles are used (`_Needles`), only the non-ASCII lines that hold
  a needle or a character that may fold to a token's letter or to nothing are folded
  (`Prefilter._needle_lines`): the others cannot hold a token.
  Lines with a `\\u` escape are always parsed.
* The lines that may hold a hit alone are parsed (`orjson`) and matched by the reference
  matcher, so the result is the reference's, hit for hit.  A key without a letter or
  digit makes every line a candidate.

Records of a forget group (same `doc`/`source`/`thread`) are found the same way with the
group values as tokens (compared verbatim, not normalised: a non-ASCII line needs a parse
only when a group value is non-ASCII); the retain pool is the records under a rank threshold
(`sampling`), found from line positions alone.  Parquet, Arrow and CSV shards run the same
filter over their string columns; JSON arrays are parsed whole.  Memory: one block (8 MB)
plus what is found.  Every function works on one shard, so shards can run in parallel
(`workers.scan`) and merge into the same result as one pass.
"""

from __future__ import annotations

import copy
import mmap
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from unlearning.corpus.formats import (
    COLUMNAR,
    SHARD_BITS,
    Shard,
    columnar_batches,
    jsonl_windows,
    looks_like_array,
    parse_json,
    shard_items,
)
from unlearning.corpus.records import (
    GROUP_FIELDS,
    Record,
    RecordMisfit,
    parse_record,
    record_from_json,
    searchable_text_of,
)
from unlearning.corpus.sampling import RANK_SPACE, rank, ranks, threshold_for
from unlearning.corpus.source import CorpusSource, open_source
from unlearning.text import _COMBINING, _TRANSLITERATE, normalise
from unlearning.text_matching import MultiMatcher

_RUN = re.compile(r"[a-z0-9]+")
_WORD = re.compile(r"[^\W_]+")  # a run of letters and digits, in any script
_FOLD_CACHE_MAX = 1 << 16
# Columns whose strings `Record.searchable_text` reads (the rest cannot hold a hit).
SEARCH_COLUMNS = ("text", "question", "answer", "prompt", "response", "completion", "paraphrased_question",
                  "paraphrased_answer", "perturbed_answer", "messages", "instruction", "input", "output",
                  "context", "conversations")
# The text field of a chat column's turns: `messages` {role, content}, ShareGPT {from, value}.
TURN_TEXT = {"messages": "content", "conversations": "value"}

FORGET_GUESS = 12  # forget records per subject that the first rank threshold is sized for
Hit = tuple[int, Record, tuple[int, ...]]  # (position, record, subject indices)
PoolEntry = tuple[int, int, Record]  # (rank, position, record)
Sampled = tuple[int, int, "Record | Pending"]  # a pool entry whose line may not be parsed yet


def _automaton(patterns: Iterable[str]) -> Any:
    import ahocorasick_rs

    encoded = sorted({p.encode("utf-8") for p in patterns})
    # The DFA: about twice the NFA's speed on a corpus (measured: 630 vs 290 MB/s, 1,500
    # patterns), at a build cost of milliseconds.  Leftmost-first matching lets the crate
    # use its SIMD prefilter (a few patterns: 1 ms instead of 10 ms per 5 MB); it reports
    # fewer overlapping matches, but still one in every line that holds a pattern, as no
    # pattern holds a newline, and lines are all the scan asks for.
    return ahocorasick_rs.BytesAhoCorasick(encoded, matchkind=ahocorasick_rs.MATCHKIND_LEFTMOST_FIRST,
                                           implementation=ahocorasick_rs.Implementation.DFA) \
        if encoded else None


@cache
def _double_space() -> Any:
    return _automaton(["  "])  # one pattern: the crate's memmem, far faster than numpy here


def _starts(automaton: Any, lowered: bytes) -> Iterator[int]:
    if automaton is not None:
        for _, start, _ in automaton.find_matches_as_indexes(lowered):
            yield start


# Whether phrase prefilters look for needles first: None decides by the shard's first
# window (`_Needles.plan`); tests set True or False to run one way only.
NEEDLES: bool | None = None
NEEDLE_VARIANTS = 64  # the most patterns the crate's SIMD search (Teddy) takes: past it, 0.5 GB/s
NEEDLE_LETTERS = 3  # letters of a needle at most: 2**3 case variants each
# Bytes per needle hit, at least, for the needles to pay: a hit costs 1.5 us (Intel) to 4 us (AMD,
# 2026-12-06), lower-casing and searching an 8 MB window 6 ms (Intel) to 30 ms (AMD, where
# bytes.lower() ran at 420 MB/s): break-even near 2,700 and 1,200 bytes a hit.
NEEDLE_SPACING = 2048
_UNPLANNED = object()


class _Needles:
    """Short pieces of the keys' tokens in all their case variants, found in raw bytes.

    Lower-casing a whole window costs more than the search that follows it (2.2 GB/s on
    the bench machine, against 3.7 GB/s for the search).  A key's hit in a line whose
    lower-cased bytes are its text up to risky bytes (`Prefilter`) puts the key's token in
    the lower-cased line, so any piece of the token, in one of its case variants, in the
    raw line.  One piece of up to `NEEDLE_LETTERS` letters per token, with every case
    variant, `NEEDLE_VARIANTS` patterns at most in all, is found at memory speed in raw
    bytes (the crate's SIMD search); only the lines holding one are lower-cased and
    searched for the keys.  The pieces are the ones least frequent in the shard's first
    window; a window where they occur more often than once in `NEEDLE_SPACING` bytes (a
    short or common token, a stretch of text about the subject's namesakes) is lower-cased
    whole instead.  Non-ASCII lines are folded and searched either way, so the lines found
    are the same.
    """

    def __init__(self, pieces: Iterable[str]) -> None:
        self.pieces = tuple(sorted(set(pieces)))
        variants = {v for p in self.pieces for v in _case_variants(p.encode("ascii"))}
        self.variants = len(variants)
        import ahocorasick_rs

        # Leftmost-first, as `_automaton`: every line holding a needle still reports one.
        self._automaton = ahocorasick_rs.BytesAhoCorasick(sorted(variants),
                                                          matchkind=ahocorasick_rs.MATCHKIND_LEFTMOST_FIRST)

    def starts(self, view: Any) -> list[int]:
        return [at for _, at, _ in self._automaton.find_matches_as_indexes(view)]

    @classmethod
    def plan(cls, tokens: Sequence[str], lines: _Lines) -> _Needles | None:
        """Needles for these tokens, each the piece of its token least frequent in this
        window (the shard's first; its first megabyte), or None where they would be too
        many for the SIMD search."""
        if not tokens or lines.count == 0:
            return None
        import ahocorasick_rs

        if NEEDLES is None and len(tokens) > NEEDLE_VARIANTS:
            return None  # at least one pattern a token
        pieces = {t: _pieces_of(t) for t in tokens}
        fewest = sum(min(2 ** sum(c.isalpha() for c in p) for p in options) for options in pieces.values())
        if NEEDLES is None and fewest > NEEDLE_VARIANTS:
            return None  # many subjects: the needles cannot all fit the SIMD search
        every = sorted({p for options in pieces.values() for p in options})
        counter = ahocorasick_rs.BytesAhoCorasick([p.encode("ascii") for p in every],
                                                  matchkind=ahocorasick_rs.MATCHKIND_STANDARD)
        sample = bytes(lines.view[:1 << 20]).lower()
        counts = [0] * len(every)
        for index, _, _ in counter.find_matches_as_indexes(sample, overlapping=True):
            counts[index] += 1
        seen = dict(zip(every, counts, strict=True))
        needles = cls(min(options, key=lambda p: (seen[p], -len(p), p)) for options in pieces.values())
        return None if NEEDLES is None and needles.variants > NEEDLE_VARIANTS else needles


def _pieces_of(token: str) -> set[str]:
    """The substrings of a token that may be its needle: three to eight bytes with at most
    `NEEDLE_LETTERS` letters (a shorter token: itself, if it has no more letters)."""
    out: set[str] = set()
    for i in range(len(token)):
        letters = 0
        for j in range(i, min(len(token), i + 8)):
            letters += token[j].isalpha()
            if letters > NEEDLE_LETTERS:
                break
            if j - i >= 2 or (i == 0 and j == len(token) - 1):
                out.add(token[i:j + 1])
    return out or {token[:NEEDLE_LETTERS]}


def _case_variants(piece: bytes) -> Iterator[bytes]:
    """Every spelling of an ASCII piece that lower-cases to it."""
    import itertools

    options = [(bytes([c]), bytes([c]).upper()) if 0x61 <= c <= 0x7A else (bytes([c]),) for c in piece]
    for parts in itertools.product(*options):
        yield b"".join(parts)


# Risky bytes, after which a simple line's text may differ from its raw bytes by more than
# case: runs of spaces and escaped whitespace (collapsed by normalisation), an escaped
# slash; that is, two spaces, or a backslash followed by one of these.
_RISKY_ESCAPES = np.frombuffer(b"ntrf/NTRF", dtype=np.uint8)


class Prefilter:
    """Byte patterns whose absence from a line proves that no key occurs in it.

    Token mode (`phrases=False`, keys compared verbatim: group values): a key's hit
    implies its token (longest run of letters and digits) in the lower-cased line.
    Phrase mode (normalised keys, JSONL lines; non-ASCII lines are folded first): a line
    with no risky bytes (`_RISKY_ESCAPES`) holds its strings' text verbatim up to case, so a key's
    hit implies the key itself in the lower-cased line, or, when the hit spans two
    fields (which set building joins with whitespace), the key's part up to a space
    followed by the quote that ends the first field (`mara"` or `mara "`).  Lines with
    risky bytes fall back to the tokens; keys with a quote or backslash always do.
    """

    def __init__(self, keys: Iterable[str], *, phrases: bool = False) -> None:
        tokens: set[str] = set()
        always: set[str] = set()  # tokens checked on every line (keys no phrase can stand for)
        phrase_set: set[str] = set()
        wide: set[str] = set()  # tokens of non-ASCII keys (looked for in folded lines only)
        self.scan_all = False
        self.every_non_ascii_line = False
        for key in keys:
            if not key.isascii():
                # Cannot occur in a simple line's ASCII text.  In phrase mode (normalised
                # keys) its longest run of word characters occurs in the folded line; a
                # verbatim key, or one without word characters, makes every non-ASCII
                # line a candidate.
                words = _WORD.findall(key)
                if phrases and words:
                    wide.add(max(words, key=len))
                else:
                    self.every_non_ascii_line = True
                continue
            low = key.lower()
            runs = _RUN.findall(low)
            if not runs:
                self.scan_all = True
                continue
            token = _token_of(low, runs)
            tokens.add(token)
            if not phrases or '"' in low or "\\" in low:
                always.add(token)
                continue
            phrase_set.add(low)
            phrase_set.update(_split_phrases(low))
        self.tokens = tuple(sorted(tokens))
        self.phrases = phrases
        self._tokens = _automaton(tokens)
        self._always = _automaton(always | phrase_set)  # what makes a simple line a candidate
        self._folded = _automaton([*tokens, *wide]) if phrases else None
        # The characters of the tokens: a non-ASCII line whose folded text holds a token
        # holds it in its ASCII bytes (a needle's line) or holds a character that may fold
        # to one of these (`_folds_to`).  None where a token is not ASCII.
        self._alphabet = frozenset("".join(tokens)) if phrases and not wide else None
        self._needles: Any = _UNPLANNED
        self._plans: dict[str, Any] = {}  # the needles planned first, shared by `for_shard` copies

    def for_shard(self) -> Prefilter:
        """This prefilter for another shard: the same automata, and the needles planned on
        the first shard of this scan that planned any (planning reads and counts a megabyte:
        once per scan, not once per shard).  Where they hit too often in this shard's
        windows, those windows are lower-cased whole (`candidate_lines`): the lines are
        the same either way."""
        fresh = copy.copy(self)
        fresh._needles = self._plans.get("needles", _UNPLANNED)
        return fresh

    def candidate_lines(self, lines: _Lines) -> list[int]:
        """Indexes (in the window) of the lines of a JSONL window that may hold a key.

        Simple lines with a hit in their lower-cased bytes (phrase mode: a phrase, or a
        token where the line holds a risky byte); every line with a `\\u` escape; lines
        with non-ASCII bytes: in phrase mode those whose folded text holds a token, in
        token mode (keys compared verbatim: an ASCII key's token is in the raw bytes
        whatever else the line holds) all of them when a key is non-ASCII.

        Phrase mode finds the lines worth lower-casing with its needles first where they
        pay (`_Needles`); the lines it returns are the same.
        """
        if self.scan_all:
            return list(range(lines.count))
        if self.phrases and self._needles is _UNPLANNED:
            self._needles = _Needles.plan(self.tokens, lines) if NEEDLES is not False else None
            if lines.count:
                self._plans.setdefault("needles", self._needles)
        needles = self._needles if self.phrases else None
        starts = needles.starts(lines.view) if needles is not None else None
        use_needles = starts is not None and (NEEDLES or len(starts) * NEEDLE_SPACING <= len(lines.view))
        risky: list[int] = []  # with needles: risky bytes are looked for in the needles' lines alone
        escaped, risky = (lines.escaped(), risky) if use_needles else lines.escapes()
        found = set(escaped)
        if use_needles and not self.every_non_ascii_line and self._alphabet is not None:
            return self._needle_lines(lines, starts or [], found)
        non_ascii = [k for k in lines.non_ascii() if k not in found]
        unfolded: list[int] = []  # non-ASCII lines whose fold can hold a token only in their ASCII bytes
        if self.every_non_ascii_line:
            found.update(non_ascii)
        elif self.phrases:
            # As `_needle_lines`: only the lines with a character that may fold to a token's
            # letter or vanish are folded; in the others a token lies within the ASCII bytes,
            # which the fold keeps as they are, so their lower-cased bytes tell.
            folding = lines.lines_folding_to(self._alphabet) if self._alphabet is not None and non_ascii else None
            if folding is not None and not use_needles:
                chosen = set(folding)
                unfolded = [k for k in non_ascii if k not in chosen]
                non_ascii = [k for k in non_ascii if k in chosen]
            found.update(_lines_holding(self._folded, lines, non_ascii, folded=True))
        if use_needles:
            # Lines with a needle: the phrases where the line's bytes are its text up to
            # case, the tokens where a risky byte may stand between (non-ASCII lines: above).
            skip = found | set(non_ascii)
            hit = [k for k in np.unique(lines.line_of(starts)).tolist() if k not in skip] if starts else []
            risky_lines = lines.risky(hit)
            found.update(_lines_holding(self._always, lines, [k for k in hit if k not in risky_lines]))
            found.update(_lines_holding(self._tokens, lines, [k for k in hit if k in risky_lines]))
            return sorted(found)
        lowered = lines.lower()
        hits = list(_starts(self._always if self.phrases else self._tokens, lowered))
        if hits:
            found.update(lines.line_of(hits).tolist())
        if self.phrases:
            found.update(_lines_holding(self._tokens, lines, [k for k in risky if k not in found], lowered))
            found.update(_lines_holding(self._tokens, lines, [k for k in unfolded if k not in found], lowered))
        return sorted(found)

    def _needle_lines(self, lines: _Lines, starts: Sequence[int], found: set[int]) -> list[int]:
        """`candidate_lines` from the needles' lines (`starts`) and the lines with a `\\u`
        escape (`found`), where every token is ASCII: without folding every non-ASCII line.

        A non-ASCII line is a candidate when its fold holds a token (as in
        `candidate_lines`).  The fold is its lower-cased ASCII bytes with each run of
        non-ASCII characters replaced by that run's normalised form, so a token in it lies
        within the ASCII bytes (the line holds the token's needle: a needle's line), or
        takes a character from a run's normalised form, which the run's characters may
        give (`_folds_to`), or spans a run whose normalised form is empty, which only a
        character that may vanish leaves (`_vanishes`).  Only those non-ASCII lines are
        folded; the others cannot hold a token, and the lines found are the ones
        `candidate_lines` finds by folding all.
        """
        assert self._alphabet is not None
        hit = [k for k in np.unique(lines.line_of(starts)).tolist() if k not in found] if len(starts) else []
        raws = lines.raws(hit)
        wide = {k for k, raw in zip(hit, raws, strict=True) if not raw.isascii()}
        folding = lines.lines_folding_to(self._alphabet)
        if folding is None:  # not UTF-8 (it fails in the fold, as in the reference), or dense: fold them all
            folding = lines.non_ascii()
        folding = sorted((set(folding) | wide) - found)
        found.update(_lines_holding(self._folded, lines, folding, folded=True))
        plain = [(k, raw) for k, raw in zip(hit, raws, strict=True) if k not in wide]
        risky = {k for k, raw in plain if _RISKY.search(raw)}
        found.update(_lines_holding(self._always, lines, [k for k, _ in plain if k not in risky]))
        found.update(_lines_holding(self._tokens, lines, [k for k, _ in plain if k in risky]))
        return sorted(found)

    def token_starts(self, lowered: bytes) -> Iterator[int]:
        """Offsets of token hits (token mode)."""
        return _starts(self._tokens, lowered)


def _lines_holding(automaton: Any, lines: _Lines, which: Sequence[int], lowered: bytes | None = None, *,
                   folded: bool = False) -> list[int]:
    """The lines among `which` whose lower-cased bytes (`folded`: their folded text) hold
    one of the automaton's patterns: one pass over the lines joined (lower-cased here
    unless the window's `lowered` bytes are given).

    Folding (for lines with non-ASCII bytes and no `\\u` escape) replaces each run of
    non-ASCII characters by `normalise(run)` and keeps the lower-cased ASCII bytes.
    `normalise` works character by character except for canonical composition, and a
    composition that starts at an ASCII character only ever joins it to marks that
    normalisation strips, or yields no word character (checked for every code point:
    tests/unlearning/test_scan.py), so each run of word characters of `normalise(line)` is a
    substring of the folded line.  The keys' tokens are such runs, and so is any run of a
    field's normalised text (JSON's quotes, backslashes and escape letters are ASCII and
    compose with nothing).
    """
    if not which or automaton is None:
        return []
    joined = b"\n".join(lines.raws(which)).lower() if lowered is None else \
        b"\n".join(lowered[lines.start(k):lines.end(k)] for k in which)
    if folded:
        try:
            joined.decode("utf-8")
        except UnicodeDecodeError:
            return list(which)  # parsed, so that a malformed line fails as the reference's read fails
        joined = fold(joined)
    hits = [at for _, at, _ in automaton.find_matches_as_indexes(joined)]
    if not hits:
        return []
    newlines = np.flatnonzero(np.frombuffer(joined, dtype=np.uint8) == 0x0A)
    return [which[i] for i in np.unique(np.searchsorted(newlines, hits)).tolist()]


_folds: dict[bytes, bytes] = {}


def fold(lowered: bytes) -> bytes:
    """UTF-8 text with each run of non-ASCII characters replaced by its normalised form
    (`_lines_holding`); the ASCII bytes are left as they are (lower-case them first)."""
    high = np.frombuffer(lowered, dtype=np.uint8) >= 0x80
    edges = np.flatnonzero(high[1:] != high[:-1]) + 1
    if not len(edges) and not (len(high) and high[0]):
        return lowered
    if len(_folds) > _FOLD_CACHE_MAX:
        _folds.clear()
    bounds = [0, *edges.tolist(), len(lowered)]
    parts = []
    run = bool(high[0])  # the pieces alternate: ASCII, non-ASCII run, ASCII ...
    for at, end in zip(bounds, bounds[1:], strict=False):
        piece = lowered[at:end]
        if run:
            folded = _folds.get(piece)
            if folded is None:
                folded = _folds[piece] = normalise(piece.decode("utf-8")).encode("utf-8")
            piece = folded
        parts.append(piece)
        run = not run
    return b"".join(parts)


@cache
def _folds_to(code: int) -> frozenset[str]:
    """The ASCII letters and digits that the character `code` may give to the normalised
    form of a run of non-ASCII characters holding it, wherever it stands: those of its
    normalised form, of its compatibility decomposition, its case folding, lower and upper
    case, and the transliteration of each (a generous superset: composition with the
    characters around it only ever joins marks to a letter, whose case folding decomposes
    to that letter's and the marks' own; tests/unlearning/test_scan.py checks every code
    point and every canonical composition)."""
    char = chr(code)
    forms = {char, char.casefold(), char.lower(), char.upper(), normalise(char)}
    for form in list(forms):
        decomposed = unicodedata.normalize("NFKD", form)
        forms.update((decomposed, decomposed.casefold(), unicodedata.normalize("NFKD", decomposed.casefold())))
    for form in list(forms):
        forms.add(unicodedata.normalize("NFKD", form.translate(_TRANSLITERATE)))
    return frozenset(c for form in forms for c in form.lower() if c.isascii() and c.isalnum())


@cache
def _vanishes(code: int) -> bool:
    """Whether the character `code` may leave nothing in the normalised form of a run of
    non-ASCII characters (a mark, a space, a spacing accent): such a run joins the ASCII
    bytes on either side into one word of the fold ("O\u0308kafor" folds to "okafor")."""
    char = chr(code)
    return not normalise(char) or all(c.isspace() or unicodedata.combining(c) or _COMBINING.match(c)
                                      for c in unicodedata.normalize("NFKD", char))


def _split_phrases(key: str) -> set[str]:
    """Patterns one of which a hit of `key` spanning two or more fields leaves in the line.

    Such a hit puts the key's part up to its first split at the end of one string
    (`mara"`, or `mara "` with one trailing space) and its part after its last split at
    the start of another (`"okafor`, `" okafor`); either family will do, so take the one
    whose shortest member is longest (short parts such as `m.` end many strings).
    """
    spaces = [i for i, c in enumerate(key) if c == " "]
    if not spaces:
        return set()
    heads = [key[:i] for i in spaces]
    tails = [key[i + 1:] for i in spaces]
    if min(map(len, heads)) > min(map(len, tails)):
        return {head + end for head in heads for end in ('"', ' "')}
    return {start + tail for tail in tails for start in ('"', '" ')}


def _token_of(key: str, runs: list[str]) -> str:
    """The run of a key least likely to be common: the longest, but from an e-mail address's
    own part (its domain, "example" or "com", is shared by everyone at that domain)."""
    if "@" in key:
        local: list[str] = _RUN.findall(key.split("@", 1)[0])
        if local and len(max(local, key=len)) >= 3:
            return max(local, key=len)
    return max(runs, key=len)


class _Lines:
    """Where the lines of one window start and end: its newlines found once (numpy), so
    a line's bounds and an offset's line are look-ups, not scans.

    The window is `data[offset:stop]`, whole lines, where `data` is the bytes of a block
    read from a compressed file or a memory map of a plain one (`formats.jsonl_windows`):
    numpy and the automata read it in place, and only the lines asked for are copied.
    """

    def __init__(self, data: Any, offset: int = 0, stop: int | None = None) -> None:
        stop = len(data) if stop is None else stop
        self.data, self.offset, self.stop = data, offset, stop
        self.view = memoryview(data)[offset:stop]
        self.bytes = np.frombuffer(self.view, dtype=np.uint8)
        ends, self._high_chunks = _newlines(self.bytes)
        size = stop - offset
        if size and self.bytes[-1] != 0x0A:
            ends = np.append(ends, size)  # the file's last line, without its newline
        self.ends = ends
        self.starts = np.concatenate(([0], ends[:-1] + 1)) if len(ends) else ends
        self.count = len(ends)
        self._high: np.ndarray | None = None
        self._dense = False

    def start(self, line: int) -> int:
        return int(self.starts[line])

    def end(self, line: int) -> int:
        return int(self.ends[line])

    def raw(self, line: int) -> bytes:
        return bytes(self.data[self.offset + int(self.starts[line]):self.offset + int(self.ends[line])])

    def raws(self, lines: Sequence[int]) -> list[bytes]:
        """`raw` of many lines (their offsets read from the index in one go)."""
        if not len(lines):
            return []
        at = np.asarray(lines, dtype=np.int64)
        data, offset = self.data, self.offset
        pairs = zip(self.starts[at].tolist(), self.ends[at].tolist(), strict=True)
        if type(data) is bytes or isinstance(data, mmap.mmap):  # their slices are bytes already
            return [data[offset + a:offset + b] for a, b in pairs]
        return [bytes(data[offset + a:offset + b]) for a, b in pairs]

    def lower(self) -> bytes:
        return bytes(self.data[self.offset:self.stop]).lower()

    def holds(self, needle: bytes) -> bool:
        return bool(self.data.find(needle, self.offset, self.stop) >= 0)

    def line_of(self, offsets: Sequence[int] | np.ndarray) -> np.ndarray:
        """The line (in the window) of each offset."""
        return np.searchsorted(self.ends, np.asarray(offsets, dtype=np.int64))

    def is_ascii(self) -> bool:
        return not len(self._high_chunks)

    def _high_positions(self) -> np.ndarray | None:
        """Offsets of the bytes over 0x7f, looked for in the `_CHUNK`s that hold one; None
        where they are more than one in `_DENSE` bytes of the window (a window of non-Latin
        text: its offsets would take several times the window's memory)."""
        if self._high is None:
            data, most = self.bytes, len(self.bytes) // _DENSE + 1
            parts, total = [], 0
            for at in self._high_chunks.tolist():
                found = np.flatnonzero(data[at * _CHUNK:(at + 1) * _CHUNK] >= 0x80)
                total += len(found)
                if total > most:
                    self._dense = True
                    return None
                parts.append(found + at * _CHUNK)
            self._high = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return None if self._dense else self._high

    def non_ascii(self) -> list[int]:
        """Lines that hold a byte over 0x7f: the lines of those bytes, or, in a window
        where they are many, the largest byte of each line (one pass)."""
        if self.is_ascii():
            return []
        high = self._high_positions()
        if high is None:
            return np.flatnonzero(np.maximum.reduceat(self.bytes, self.starts) >= 0x80).tolist()
        holding: list[int] = np.unique(self.line_of(high)).tolist()
        return holding

    def blank(self) -> list[int]:
        """Lines that hold nothing but spaces, tabs, carriage returns, vertical tabs or form
        feeds (JSONL lines that have a position but no item): an empty line, or one whose
        first byte is one of those, looked at further (a JSON line starts with its value)."""
        if not self.count:
            return []
        lengths = self.ends - self.starts
        first = self.bytes[np.minimum(self.starts, max(len(self.bytes) - 1, 0))]
        maybe = np.flatnonzero((lengths == 0) | _BLANK_BYTES[first])
        return [k for k in maybe.tolist() if not self.raw(k).strip(b" \t\r\x0b\x0c")]

    def lines_folding_to(self, alphabet: frozenset[str]) -> list[int] | None:
        """The lines that hold a non-ASCII character that may fold to a character of
        `alphabet` (`_folds_to`) or to nothing (`_vanishes`), or None where the window's
        non-ASCII bytes are not UTF-8 or too many to read one by one (`_high_positions`).

        Read from the window's bytes over 0x7f alone (`_utf8_codes`), each distinct code
        point looked up once."""
        if self.is_ascii():
            return []
        high = self._high_positions()
        decoded = _utf8_codes(self.bytes, high) if high is not None else None
        if decoded is None:
            return None
        leads, codes = decoded
        active = [code for code in np.unique(codes).tolist() if _vanishes(code) or _folds_to(code) & alphabet]
        if not active:
            return []
        chosen = leads[np.isin(codes, np.asarray(active, dtype=np.int64))]
        holding: list[int] = np.unique(self.line_of(chosen)).tolist()
        return holding

    def _slashes(self) -> tuple[np.ndarray, np.ndarray]:
        """(offsets of the backslashes that have a next byte, those next bytes)."""
        data = self.bytes
        slashes = _positions_of(data[:-1], 0x5C) if self.holds(b"\\") else np.zeros(0, dtype=np.int64)
        return slashes, data[slashes + 1]

    def escaped(self) -> list[int]:
        """Lines with a `\\u` escape."""
        slashes, after = self._slashes()
        return sorted(set(self.line_of(slashes[after == 0x75]).tolist()))  # "u"

    def escapes(self) -> tuple[list[int], list[int]]:
        """(lines with a `\\u` escape, lines with a risky byte (`_RISKY_ESCAPES`))."""
        slashes, after = self._slashes()
        escaped = self.line_of(slashes[after == 0x75]).tolist()  # "u"
        risky = [*slashes[np.isin(after, _RISKY_ESCAPES)].tolist(),
                 *(at for _, at, _ in _double_space().find_matches_as_indexes(self.view))]
        return sorted(set(escaped)), sorted(set(self.line_of(risky).tolist())) if risky else []

    def risky(self, which: Sequence[int]) -> set[int]:
        """The lines among `which` with a risky byte (`escapes`, line by line: for a few lines)."""
        return {k for k, raw in zip(which, self.raws(which), strict=True) if _RISKY.search(raw)}


_DENSE = 64  # bytes per byte over 0x7f, at most, for the scan to look at those bytes one by one
_CHUNK = 1 << 18  # bytes compared at a time when looking for one byte value (fits a core's cache)
_RISKY = re.compile(rb"  |\\[ntrf/NTRF]")  # what `_Lines.escapes` calls risky, in one line


def _positions_of(data: np.ndarray, value: int) -> np.ndarray:
    """Offsets of the bytes equal to `value`, a cache-sized chunk at a time: a comparison of
    a whole window writes (and faults in) a mask as large as the window, twice the time."""
    if len(data) <= _CHUNK:
        return np.flatnonzero(data == value)
    mask = np.empty(_CHUNK, dtype=bool)
    parts = []
    for at in range(0, len(data), _CHUNK):
        piece = data[at:at + _CHUNK]
        found = np.flatnonzero(np.equal(piece, value, out=mask[:len(piece)]))
        if len(found):
            parts.append(found + at if at else found)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _utf8_codes(data: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(offsets of the lead bytes, their code points) of the UTF-8 sequences whose bytes
    are `high` (the offsets of every byte over 0x7f in `data`, in order), or None where
    those bytes are not well-formed UTF-8 as Python's strict decoder reads it: a lead byte
    C2-F4 followed by exactly its continuation bytes (80-BF), every continuation byte
    one's, no overlong form, no surrogate, nothing past U+10FFFF."""
    if not len(high):
        return high, high
    size = len(data)
    values = data[high]
    continuation = (values & 0xC0) == 0x80
    leads = high[~continuation]
    lead = values[~continuation].astype(np.int64)
    if bool(((lead < 0xC2) | (lead > 0xF4)).any()):
        return None
    length = np.where(lead >= 0xF0, 4, np.where(lead >= 0xE0, 3, 2))
    if int((length - 1).sum()) != int(continuation.sum()) or int((leads + length).max()) > size:
        return None
    tails = []
    for k in (1, 2, 3):
        following = data[np.minimum(leads + k, size - 1)].astype(np.int64)
        if bool(((length > k) & ((following & 0xC0) != 0x80)).any()):
            return None  # a lead byte without all its continuation bytes
        tails.append(following & 0x3F)
    second = tails[0] | 0x80
    if bool((((lead == 0xE0) & (second < 0xA0)) | ((lead == 0xED) & (second > 0x9F))
             | ((lead == 0xF0) & (second < 0x90)) | ((lead == 0xF4) & (second > 0x8F))).any()):
        return None  # overlong, a surrogate, past U+10FFFF
    c1, c2, c3 = tails
    codes = np.where(length == 2, ((lead & 0x1F) << 6) | c1,
                     np.where(length == 3, ((lead & 0x0F) << 12) | (c1 << 6) | c2,
                              ((lead & 0x07) << 18) | (c1 << 12) | (c2 << 6) | c3))
    return leads, codes


def _newlines(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets of the newlines, indexes of the `_CHUNK`s that hold a byte over 0x7f):
    one pass, each chunk read while it is in the cache."""
    mask = np.empty(min(len(data), _CHUNK), dtype=bool)
    parts, high = [], []
    for number, at in enumerate(range(0, len(data), _CHUNK)):
        piece = data[at:at + _CHUNK]
        found = np.flatnonzero(np.equal(piece, 0x0A, out=mask[:len(piece)]))
        if len(found):
            parts.append(found + at if at else found)
        if int(piece.max()) >= 0x80:
            high.append(number)
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)), np.asarray(high, dtype=np.int64)


_BLANK_BYTES = np.zeros(256, dtype=bool)  # by byte value: the bytes a blank line may hold
_BLANK_BYTES[list(b" \t\r\x0b\x0c")] = True


def _blank_lines(block: bytes, first: int) -> list[int]:
    """Line indexes of the blank lines of a block (they have positions but hold no item):
    the scan's own rule (`_Lines.blank`), for the corpus index."""
    return [first + k for k in _Lines(block).blank()]


@dataclass(frozen=True)
class Pending:
    """A sampled line not parsed yet: most of a rank sample is never needed, so a line is
    parsed only when the merged, rank-ordered pool reaches it (`resolve_pool`)."""

    path: str
    where: str
    raw: bytes | str  # str once it came back from a shard task's result (orjson reads both)
    id_prefix: str  # the default id, for a record without one, is id_prefix + rec-<ordinal>
    ordinal: int

    @classmethod
    def of(cls, path: str, where: str, raw: bytes | str, id_prefix: str, ordinal: int) -> Pending:
        """`Pending(path, where, raw, id_prefix, ordinal)` without the frozen dataclass's
        `__init__` (a scan makes thousands): the same fields in the same order."""
        pending = object.__new__(cls)
        pending.__dict__.update(path=path, where=where, raw=raw, id_prefix=id_prefix, ordinal=ordinal)
        return pending

    @property
    def default_id(self) -> str:
        return f"{self.id_prefix}rec-{self.ordinal:07d}"

    def record(self) -> Record | None:
        try:
            value = orjson.loads(self.raw)
        except orjson.JSONDecodeError:
            raw = self.raw.encode("utf-8", "surrogatepass") if isinstance(self.raw, str) else self.raw
            value = parse_json(raw, Shard(Path(self.path), "", "jsonl", None, 0), self.where)
        # The default id is read only where the object has no `id` (formatting it for each
        # of a pool's thousands of lines cost more than their parse's look-ups).
        default = "" if type(value) is dict and "id" in value else self.default_id
        try:
            return parse_record(self.path, self.where, value, default)
        except RecordMisfit:
            return None

    def row(self) -> list[Any]:
        """[where, ordinal, line, base64 bytes]: the line as text, or its bytes when they are
        not UTF-8 (its parse will name the line); path and id prefix are the shard's."""
        if isinstance(self.raw, str):
            return [self.where, self.ordinal, self.raw, None]
        try:
            return [self.where, self.ordinal, self.raw.decode("utf-8"), None]
        except UnicodeDecodeError:
            import base64

            return [self.where, self.ordinal, None, base64.b64encode(self.raw).decode("ascii")]

    @classmethod
    def from_row(cls, path: str, id_prefix: str, row: list[Any]) -> Pending:
        where, ordinal, line, encoded = row
        if line is None:
            import base64

            line = base64.b64decode(encoded)
        return cls(path, where, line, id_prefix, ordinal)


@dataclass
class _Blocks:
    """Line bookkeeping of one JSONL shard: positions, and the non-blank count behind default ids."""

    source: CorpusSource
    shard: Shard
    blanks_before: int = 0

    lines: int = 0  # lines of the block being read

    def each(self) -> Iterator[tuple[int, _Lines, list[int]]]:
        first = 0
        for data, start, stop in jsonl_windows(self.shard):
            lines = _Lines(data, start, stop)
            blanks = [first + k for k in lines.blank()]
            self.lines = lines.count
            yield first, lines, blanks
            self.blanks_before += len(blanks)
            first += lines.count

    def ordinal(self, line: int, blanks: list[int]) -> int:
        """The line's index among the shard's non-blank lines (behind default ids)."""
        return line - self.blanks_before - (sum(1 for b in blanks if b < line) if blanks else 0)

    def default_id(self, line: int, blanks: list[int]) -> str:
        return self.source.default_id(self.shard, self.ordinal(line, blanks))

    def value(self, raw: bytes, line: int) -> Any:
        """The JSON value of a line's bytes (None for a blank line)."""
        return parse_json(raw, self.shard, str(line + 1)) if raw.strip() else None

    def record(self, value: Any, line: int, blanks: list[int]) -> Record | None:
        """The record of a line's value (None for a blank line or one that fits no shape:
        registration names those in the load report)."""
        if value is None:
            return None
        try:
            return parse_record(self.shard.path, str(line + 1), value, self.default_id(line, blanks))
        except RecordMisfit:
            return None

    def parse(self, raw: bytes, line: int, blanks: list[int]) -> Record | None:
        return self.record(self.value(raw, line), line, blanks)


def _sampled_lines(count: int, first: int, shard: Shard, seed: int, threshold: int) -> list[tuple[int, int]]:
    """(line index, rank) of the `count` lines from `first` whose rank is under the threshold."""
    indexes = np.arange(first, first + count, dtype=np.uint64)
    positions = indexes | np.uint64(shard.number << 40) if shard.number else indexes
    keys = ranks(positions, seed)
    chosen = np.arange(count) if threshold >= RANK_SPACE else np.flatnonzero(keys < np.uint64(threshold))
    return list(zip((first + chosen).tolist(), keys[chosen].tolist(), strict=True))


@dataclass
class ShardScan:
    """What one shard holds for a request: its hits and its records under the rank threshold."""

    shard: int
    hits: list[Hit] = field(default_factory=list)
    pool: list[Sampled] = field(default_factory=list)
    positions: int = 0  # lines or rows seen (to size a threshold)

    def to_json(self) -> dict[str, Any]:
        # Pending lines as compact rows under their shard's path and id prefix: the
        # coordinator of a sharded scan reads thousands of them, serially.
        pending: dict[tuple[str, str], list[list[Any]]] = {}
        records = []
        for k, p, r in self.pool:
            if isinstance(r, Pending):
                pending.setdefault((r.path, r.id_prefix), []).append([str(k), p, *r.row()])
            else:
                records.append([str(k), p, r.to_json()])
        return {"shard": self.shard, "positions": self.positions,
                "hits": [[p, r.to_json(), list(s)] for p, r, s in self.hits], "pool": records,
                "pending": [{"path": path, "id_prefix": prefix, "rows": rows}
                            for (path, prefix), rows in pending.items()]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardScan:
        pool: list[Sampled] = [(int(k), int(p), record_from_json(r)) for k, p, r in data["pool"]]
        for group in data["pending"]:
            path, prefix = str(group["path"]), str(group["id_prefix"])
            pool += [(int(row[0]), row[1], Pending.from_row(path, prefix, row[2:])) for row in group["rows"]]
        return cls(int(data["shard"]), [(int(p), record_from_json(r), tuple(s)) for p, r, s in data["hits"]],
                   pool, int(data["positions"]))


def _match(matcher: MultiMatcher, found: list[tuple[int, Record]]) -> list[Hit]:
    if not found:
        return []
    subjects = matcher.scan([r.searchable_text() for _, r in found])
    return [(p, r, tuple(sorted(subjects[i]))) for i, (p, r) in enumerate(found) if i in subjects]


def scan_shard(source: CorpusSource, shard: Shard, matcher: MultiMatcher, *, seed: int,
               threshold: int, exclude_ids: frozenset[str] = frozenset(),
               prefilter: Prefilter | None = None) -> ShardScan:
    """One shard's hits (records naming a subject) and retain pool (records under `threshold`).

    `prefilter` is `Prefilter(matcher.keys, phrases=True)` built once for a scan of many
    shards (its automata take about 15 ms for 100 subjects); the needles are planned on the
    first window of the first shard that has lines (`Prefilter.for_shard`)."""
    prefilter = Prefilter(matcher.keys, phrases=True) if prefilter is None else prefilter.for_shard()
    result = ShardScan(shard.number)
    if shard.format == "jsonl" and not looks_like_array(shard):
        blocks = _Blocks(source, shard)
        for first, lines, blanks in blocks.each():
            candidates = [] if matcher.empty else prefilter.candidate_lines(lines)
            # Match the values' text first; build records only for the lines that hit.
            values = [blocks.value(raw, first + k) for k, raw in zip(candidates, lines.raws(candidates),
                                                                       strict=True)]
            subjects = matcher.scan([searchable_text_of(v) for v in values]) if values else {}
            for i in sorted(subjects):
                line = first + candidates[i]
                record = blocks.record(values[i], line, blanks)
                if record is not None and record.id not in exclude_ids:
                    result.hits.append((shard.position(line), record, tuple(sorted(subjects[i]))))
            sampled = _sampled_lines(blocks.lines, first, shard, seed, threshold) if threshold else []
            prefix = "" if source.single else f"{shard.name}:"
            path, base, before = str(shard.path), shard.number << SHARD_BITS, blocks.blanks_before
            for (line, key), raw in zip(sampled, lines.raws([line - first for line, _ in sampled]), strict=True):
                if raw.strip():
                    ordinal = blocks.ordinal(line, blanks) if blanks else line - before
                    result.pool.append((key, base | line, Pending.of(path, str(line + 1), raw, prefix, ordinal)))
            result.positions = first + blocks.lines
        return result
    if shard.format in COLUMNAR:
        return _scan_columnar(source, shard, matcher, prefilter, seed=seed, threshold=threshold,
                              exclude_ids=exclude_ids)
    found = []
    for index, where, value in shard_items(shard):  # JSON arrays: parsed whole
        record = _record(source, shard, where, value, index)
        if record is None or record.id in exclude_ids:
            continue
        position = shard.position(index)
        found.append((position, record))
        key = rank(position, seed)
        if key < threshold:
            result.pool.append((key, position, record))
        result.positions = index + 1
    result.hits = _match(matcher, found)
    return result


def _record(source: CorpusSource, shard: Shard, where: str, value: Any, ordinal: int) -> Record | None:
    try:
        return parse_record(shard.path, where, value, source.default_id(shard, ordinal))
    except RecordMisfit:
        return None


# ------------------------------------------------------------------ Parquet, Arrow, CSV


def _column_strings(column: Any, turn_text: str = "content") -> tuple[list[Any], np.ndarray] | None:
    """(strings, row of each string) of a column `searchable_text` reads (of a chat column,
    its turns' `turn_text` field), or None for a type the filter does not know (its rows are
    then parsed)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return column.to_pylist(), np.arange(len(column))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        rows = np.asarray(pc.list_parent_indices(column))
        values = pc.list_flatten(column)
        inner = values.type
        if pa.types.is_struct(inner) and inner.get_field_index(turn_text) >= 0:
            values = values.field(turn_text)
            inner = values.type
        if pa.types.is_string(inner) or pa.types.is_large_string(inner):
            return values.to_pylist(), rows
    return None


def _columnar_flags(batch: Any, prefilter: Prefilter) -> np.ndarray:
    flags = np.zeros(batch.num_rows, dtype=bool)
    for name in SEARCH_COLUMNS:
        if name not in batch.schema.names:
            continue
        column = batch.column(name)
        strings = None if prefilter.scan_all else _column_strings(column, TURN_TEXT.get(name, "content"))
        if strings is None:
            flags |= np.asarray(column.is_valid())
            continue
        values, rows = strings
        simple: list[str] = []
        owners: list[int] = []
        for value, row in zip(values, rows, strict=True):
            if value is None:
                continue
            if value.isascii() and "\\u" not in value:
                simple.append(value)
                owners.append(int(row))
            else:
                flags[row] = True
        if not simple:
            continue
        joined = "\n".join(simple).encode("ascii").lower()
        ends = np.cumsum([len(v) + 1 for v in simple])
        for start in prefilter.token_starts(joined):
            flags[owners[int(np.searchsorted(ends, start, side="right"))]] = True
    return flags


def _row(batch: Any, row: int) -> dict[str, Any]:
    from unlearning.corpus.formats import _drop_nulls

    value: dict[str, Any] = _drop_nulls(batch.slice(row, 1).to_pylist()[0])
    return value


def _scan_columnar(source: CorpusSource, shard: Shard, matcher: MultiMatcher, prefilter: Prefilter, *,
                   seed: int, threshold: int, exclude_ids: frozenset[str]) -> ShardScan:
    result = ShardScan(shard.number)
    base = 0
    for batch in columnar_batches(shard):
        flags = np.zeros(batch.num_rows, dtype=bool) if matcher.empty else _columnar_flags(batch, prefilter)
        found = []
        for row in np.flatnonzero(flags):
            index = base + int(row)
            record = _record(source, shard, f"row {index}", _row(batch, int(row)), index)
            if record is not None and record.id not in exclude_ids:
                found.append((shard.position(index), record))
        result.hits += _match(matcher, found)
        if threshold:
            positions = np.arange(base, base + batch.num_rows, dtype=np.uint64) | np.uint64(shard.number << 40)
            chosen = (np.arange(batch.num_rows) if threshold >= RANK_SPACE
                      else np.flatnonzero(ranks(positions, seed) < np.uint64(threshold)))
            for row in chosen:
                index = base + int(row)
                record = _record(source, shard, f"row {index}", _row(batch, int(row)), index)
                if record is not None and record.id not in exclude_ids:
                    result.pool.append((rank(shard.position(index), seed), shard.position(index), record))
        base += batch.num_rows
        result.positions = base
    return result


# ---------------------------------------------------------------------- groups


GroupKey = tuple[str, str]  # (group field, group value)


def group_key(record: Record) -> GroupKey | None:
    return None if record.group is None else (record.group_field or "doc", record.group)


def group_shard(source: CorpusSource, shard: Shard, groups: frozenset[GroupKey], *,
                exclude_ids: frozenset[str] = frozenset()) -> list[tuple[int, Record]]:
    """(position, record) of every record of one shard that belongs to one of `groups`."""
    if not groups:
        return []
    prefilter = Prefilter(value.lower() for _, value in groups)
    out: list[tuple[int, Record]] = []

    def keep(position: int, record: Record | None) -> None:
        if record is not None and record.id not in exclude_ids and group_key(record) in groups:
            out.append((position, record))

    if shard.format == "jsonl" and not looks_like_array(shard):
        blocks = _Blocks(source, shard)
        for first, lines, blanks in blocks.each():
            for k in prefilter.candidate_lines(lines):
                keep(shard.position(first + k), blocks.parse(lines.raw(k), first + k, blanks))
        return out
    if shard.format in COLUMNAR:
        base = 0
        for batch in columnar_batches(shard):
            names = [n for n in GROUP_FIELDS if n in batch.schema.names]
            if names:
                columns = [batch.column(n).to_pylist() for n in names]
                for row in range(batch.num_rows):
                    for name, column in zip(names, columns, strict=True):
                        if column[row] is not None:
                            if (name, str(column[row])) in groups:
                                index = base + row
                                keep(shard.position(index), _record(source, shard, f"row {index}",
                                                                    _row(batch, row), index))
                            break
            base += batch.num_rows
        return out
    for index, where, value in shard_items(shard):
        keep(shard.position(index), _record(source, shard, where, value, index))
    return out


# ------------------------------------------------------------------ whole corpus


def estimate_positions(source: CorpusSource) -> int:
    """About how many lines and rows a corpus has (only to size a rank threshold): the
    bytes of each shard over the mean line length of its first block, Parquet's own count."""
    total = 0
    for shard in source.shards:
        if shard.format == "parquet":
            import pyarrow.parquet as pq

            try:
                total += pq.ParquetFile(shard.path).metadata.num_rows
                continue
            except (OSError, ValueError):
                pass  # the scan itself reports an unreadable file
        size = shard.path.stat().st_size
        if shard.format == "jsonl" and not shard.compression:
            with shard.path.open("rb") as handle:
                head = handle.read(1 << 20)
            size = max(1, size * max(1, head.count(b"\n")) // max(1, len(head)))
            total += size
        else:
            total += max(1, size * (4 if shard.compression else 1) // 200)
    return total


def initial_threshold(source: CorpusSource, wanted: int) -> int:
    """A rank threshold expected to keep a little more than `wanted` records of the corpus."""
    if wanted <= 0:
        return 0
    return threshold_for((1.15 * wanted + 64) / estimate_positions(source))


def sample_shard(source: CorpusSource, shard: Shard, *, seed: int, threshold: int,
                 exclude_ids: frozenset[str] = frozenset()) -> list[Sampled]:
    """A shard's records under a rank threshold (no subjects: the matcher matches nothing)."""
    return scan_shard(source, shard, MultiMatcher([]), seed=seed, threshold=threshold,
                      exclude_ids=exclude_ids).pool


def sample_pool(source: str | Path | CorpusSource, wanted: int, *, seed: int,
                exclude_ids: frozenset[str] = frozenset()) -> list[PoolEntry]:
    """The `wanted` lowest-ranked records of a corpus whose ids are not excluded, by rank."""
    corpus = open_source(source)
    threshold = initial_threshold(corpus, wanted)
    while True:
        sampled = [entry for shard in corpus.shards
                   for entry in sample_shard(corpus, shard, seed=seed, threshold=threshold, exclude_ids=exclude_ids)]
        pool = resolve_pool(sampled, wanted, exclude_ids)
        if len(pool) >= wanted or threshold >= RANK_SPACE:
            return pool
        threshold = min(RANK_SPACE, threshold * 4)


def sample_records(source: str | Path | CorpusSource, n: int, *, seed: int,
                   exclude_ids: Iterable[str] = ()) -> tuple[Record, ...]:
    """`n` records of a corpus (a file, a directory, a source), seeded, without loading it:
    the `n` lowest-ranked records whose ids are not excluded, in rank order.

    Streams the corpus, parsing only the records under a rank threshold sized from the
    corpus's bytes (and a second pass with a larger one in the rare case it was too small).
    """
    if n <= 0:
        return ()
    drop = frozenset(exclude_ids)
    pool = sample_pool(source, n + len(drop), seed=seed, exclude_ids=drop)
    return tuple(record for _, _, record in pool[:n])


def resolve_pool(sampled: Iterable[Sampled], wanted: int, excluded: Iterable[str]) -> list[PoolEntry]:
    """The first `wanted` records by rank whose ids are not excluded, parsing pending lines
    only as far as needed."""
    drop = set(excluded)
    out: list[PoolEntry] = []
    for key, position, item in sorted(sampled, key=lambda entry: entry[0]):
        if len(out) >= wanted:
            break
        record = item.record() if isinstance(item, Pending) else item
        if record is not None and record.id not in drop:
            out.append((key, position, record))
    return out


@dataclass
class CorpusScan:
    """Everything set building needs from a corpus for one request."""

    hits: list[Hit]
    group_members: list[tuple[int, Record]]
    pool: list[PoolEntry]  # by rank, without forget records
    method: str = "scan"  # how it was found: the scan, or the index (`corpus.index`)


def merge_hits(parts: Iterable[ShardScan]) -> list[Hit]:
    return sorted((hit for part in parts for hit in part.hits), key=lambda hit: hit[0])


def forget_groups(hits: Iterable[Hit]) -> frozenset[GroupKey]:
    return frozenset(key for _, record, _ in hits if (key := group_key(record)) is not None)


def first_threshold(source: CorpusSource, subjects: int, pool_size: Callable[[int], int]) -> int:
    """The rank threshold of the first pass, before the forget set is known: sized for
    `FORGET_GUESS` records per subject (a larger forget set reads the sample again)."""
    return initial_threshold(source, pool_size(FORGET_GUESS * max(1, subjects)))


def scan_corpus(source: CorpusSource, patterns_by_subject: Sequence[Iterable[str]], *, seed: int,
                pool_size: Callable[[int], int],
                exclude_ids: frozenset[str] = frozenset()) -> CorpusScan:
    """Hits, group members and the retain pool of a corpus, one shard after the other.

    The pool is sized once the forget set is known (`pool_size(forget records)`); a
    threshold that kept too few is raised and the sample alone is read again.
    """
    matcher = MultiMatcher(patterns_by_subject)
    threshold = first_threshold(source, len(patterns_by_subject), pool_size)
    prefilter = Prefilter(matcher.keys, phrases=True)
    parts = [scan_shard(source, shard, matcher, seed=seed, threshold=threshold, exclude_ids=exclude_ids,
                        prefilter=prefilter) for shard in source.shards]
    hits = merge_hits(parts)
    groups = forget_groups(hits)
    direct = {record.id for _, record, _ in hits}
    members = sorted((m for shard in source.shards for m in group_shard(source, shard, groups,
                                                                         exclude_ids=exclude_ids)
                      if m[1].id not in direct), key=lambda m: m[0]) if groups else []
    excluded = direct | {record.id for _, record in members}
    wanted = pool_size(len(excluded))
    pool = resolve_pool((entry for part in parts for entry in part.pool), wanted, excluded | exclude_ids)
    while len(pool) < wanted and threshold < RANK_SPACE:
        threshold = min(RANK_SPACE, threshold * 4)
        sampled = [entry for shard in source.shards
                   for entry in sample_shard(source, shard, seed=seed, threshold=threshold, exclude_ids=exclude_ids)]
        pool = resolve_pool(sampled, wanted, excluded | exclude_ids)
    return CorpusScan(hits, members, pool)
