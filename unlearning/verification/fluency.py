"""Fluency: are the answers about the subject still sentences?

Over-aggressive unlearning makes a model babble about the forgotten person
(the failure the ASU paper sets out to avoid: gradient-ascent style methods
"forget" by emitting gibberish), or about everyone.  Two measurements:

Degenerate answers (model-free): empty (no word characters), or looping: a
word n-gram (n = 1..3) repeated three times in a row, a 2-8 character piece
repeated four times in a row ("mitrimitrimitrimitri"), or fewer than half of
its words distinct once it is six words or longer.

    fluency.degenerate_rate = degenerate greedy answers / answers (forget and control questions)

checked against the base model's own rate on the same questions.

Gibberish about the subject: degenerate, or implausible under the base
model (policy v4: over the answer's content tokens, `content_scores`): the
median per-token negative log-likelihood of the answer given the question,
under the BASE model, above the 95th percentile of the same
statistic for the base's own greedy answers about control people plus
`margin` nats.  The median, not the mean, so that a wrong but well-formed
value (one or two surprising tokens) is not called gibberish; babble makes
most tokens surprising.

    fluency.gibberish_rate         = gibberish answers / answers to forget questions
    fluency.control_gibberish_rate = the same for the candidate's answers about control people

A model that never saw the subject answers about them exactly as it answers
about strangers (a small model garbles unfamiliar names in both cases), so
the subject's rate is judged against the control rate of the same model.  The
base model knows the subject, so an answer about them is scored as the same
answer about a stranger (the subject's identifiers replaced by a fresh
person's): otherwise any answer but the memorised one would look implausible
to the base for that reason alone.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from .generation import TokenScores
from .leakage import normalise_text

_CHAR_LOOP = re.compile(r"(\S{2,8}?)\1{3,}")


def is_empty(answer: str) -> bool:
    return not normalise_text(answer)


def is_looping(answer: str) -> bool:
    text = normalise_text(answer)
    if _CHAR_LOOP.search(text.replace(" ", "")):
        return True
    words = text.split()
    for n in (1, 2, 3):
        for start in range(0, max(0, len(words) - 3 * n + 1)):
            gram = words[start : start + n]
            if words[start + n : start + 2 * n] == gram and words[start + 2 * n : start + 3 * n] == gram:
                return True
    return len(words) >= 6 and len(set(words)) < len(words) / 2


def is_degenerate(answer: str) -> bool:
    return is_empty(answer) or is_looping(answer)


def degenerate_rate(answers: Sequence[str]) -> float:
    return sum(is_degenerate(a) for a in answers) / len(answers) if answers else 0.0


def median_nll(scores: TokenScores) -> float:
    return float(np.median(-scores.logp)) if scores.logp.size else float("inf")


_CAPITALISED = re.compile(r"\b[^\W\d_][\w'-]*", re.UNICODE)


def copied_names(answer: str, prompt: str) -> list[tuple[int, int]]:
    """Character spans of the answer's capitalised words that the prompt holds too (the
    person's name the question asked about, copied into the answer)."""
    spans = []
    for match in _CAPITALISED.finditer(answer):
        word = match.group()
        if word[:1].isupper() and re.search(r"(?<!\w)" + re.escape(word) + r"(?!\w)", prompt):
            spans.append(match.span())
    return spans


def content_scores(scores: TokenScores, offsets: Sequence[tuple[int, int]],
                   names: Sequence[tuple[int, int]]) -> TokenScores:
    """The token scores without the tokens that spell a copied name (`copied_names`).

    Whether a model can spell a name it never saw is not fluency: a small model
    that cannot copy an unfamiliar name from the question finds every other
    model's correct spelling of it implausible (policy v4, module doc)."""
    if not names or len(offsets) != scores.logp.size:
        return scores
    keep = np.array([not any(start < e and s < end for s, e in names) for start, end in offsets], dtype=bool)
    return TokenScores(scores.logp[keep], scores.mu[keep], scores.sigma[keep])


def plausibility_limit(reference: Sequence[TokenScores], *, margin: float) -> float:
    meds = [median_nll(s) for s in reference if s.logp.size]
    if not meds:
        return float("inf")
    return float(np.percentile(meds, 95)) + margin


def gibberish_flags(
    answers: Sequence[str], base_scores: Sequence[TokenScores], *, limit: float
) -> list[bool]:
    return [
        is_degenerate(a) or median_nll(s) > limit
        for a, s in zip(answers, base_scores, strict=True)
    ]
