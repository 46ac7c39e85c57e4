"""The counterfactual teacher's token alignment of a record and its stranger copy.

The subject's name and the stranger's tokenise to different numbers of tokens
(a surname of the corpus is one token of a tokenizer trained on it; a fresh one is
several pieces).  Each word of the subject's name must take its prediction from
where the same word of the stranger's name starts: the first token of the surname
is predicted where the stranger's surname begins, never from inside the stranger's
first name or the middle of their surname.
"""

from __future__ import annotations

import math

import torch

from unlearning.methods.targets import _carry_pieces, align
from unlearning.prompting import Example


def _example(pieces: list[str]) -> Example:
    """An Example whose tokens are the given pieces of text (ids: a hash of the piece)."""
    offsets, at = [], 0
    for piece in pieces:
        offsets.append((at, at + len(piece)))
        at += len(piece)
    return Example(ids=tuple(abs(hash(p)) % 10_000 for p in pieces), learnt=(True,) * len(pieces),
                   offsets=tuple(offsets), text="".join(pieces))


def test_each_word_of_a_name_aligns_to_the_start_of_the_same_word_of_the_strangers_name() -> None:
    mine = _example(["Where", " was", " Clara", " Nakamura", " born", "?", " Clara", " Nakamura", " was", " born", "."])
    theirs = _example(["Where", " was", " Hugo", " N", "i", "el", "sen", " born", "?", " Hugo", " N", "i", "el",
                       "sen", " was", " born", "."])
    alignment = align(mine, theirs, {"Clara Nakamura": "Hugo Nielsen"})
    assert alignment is not None
    assert alignment.tokens[2] == (2, True) and alignment.tokens[3] == (3, True)  # " Nakamura" -> " N"
    assert alignment.tokens[6] == (9, True) and alignment.tokens[7] == (10, True)
    assert alignment.tokens[8] == (14, False) and alignment.tokens[10] == (16, False)  # after the span: shifted
    assert alignment.first_span_token == 2
    assert alignment.pieces[3] == ((3, 4, 5, 6), 1.0) and alignment.pieces[2] == ((2,), 1.0)


def test_a_longer_word_of_the_subject_spreads_over_the_strangers_word() -> None:
    mine = _example(["Ask", " Ann", " Vander", "mee", "rsch", " now"])
    theirs = _example(["Ask", " Eva", " Smith", " now"])
    alignment = align(mine, theirs, {"Ann Vandermeersch": "Eva Smith"})
    assert alignment is not None
    assert [alignment.tokens[i] for i in (1, 2, 3, 4)] == [(1, True), (2, True), (2, True), (2, True)]
    assert [alignment.pieces[i] for i in (2, 3, 4)] == [((2,), 1 / 3)] * 3  # the piece's log-probability shared
    assert alignment.tokens[5] == (3, False)


def test_names_of_different_word_counts_spread_over_the_whole_span() -> None:
    mine = _example(["Ask", " Ann", " Lee", " now"])
    theirs = _example(["Ask", " Eva", " de", " la", " Cruz", " now"])
    alignment = align(mine, theirs, {"Ann Lee": "Eva de la Cruz"})
    assert alignment is not None
    assert alignment.tokens[1] == (1, True) and alignment.tokens[2] == (3, True)  # 1 of 2 -> 2 of 4
    assert alignment.tokens[3] == (5, False)


def test_an_email_address_aligns_at_its_at_sign_and_keeps_its_domain_token_for_token() -> None:
    """A local part of 2 tokens against one of 4: "@" and the shared domain still line up
    (spread over the whole address, the subject's "@" was taught from inside the stranger's
    local part, and the erased model wrote "fdubois@@@@@@example.com" for other people)."""
    mine = _example(["Mail", " fd", "ubois", "@", "example", ".", "net", " now"])
    theirs = _example(["Mail", " ak", "ow", "al", "ski", "@", "example", ".", "net", " now"])
    alignment = align(mine, theirs, {"fdubois@example.net": "akowalski@example.net"})
    assert alignment is not None
    assert [alignment.tokens[i] for i in (1, 2)] == [(1, True), (3, True)]  # the local part spread
    assert [alignment.tokens[i] for i in (3, 4, 5, 6)] == [(5, True), (6, True), (7, True), (8, True)]
    assert alignment.pieces[3] == ((5,), 1.0)
    assert alignment.tokens[7] == (9, False)


def test_a_token_of_the_copy_that_runs_across_words_is_shared_by_the_subjects_tokens_of_those_words() -> None:
    """The stranger's ".1" is one token where the subject writes "." and "3": the subject's
    "3" takes its share of ".1" (it had no token of its own word to learn from, fell back to
    the tempered teacher and kept the memorised digit), and the "@" and the domain still
    line up token for token."""
    mine = _example(["Mail", " n", "gozi", ".", "3", "@", "dyn", ".", "net", " now"])
    theirs = _example(["Mail", " h", "alima", ".1", "@", "dyn", ".", "net", " now"])
    alignment = align(mine, theirs, {"ngozi.3@dyn.net": "halima.1@dyn.net"})
    assert alignment is not None
    assert [alignment.tokens[i] for i in (1, 2)] == [(1, True), (2, True)]
    assert alignment.tokens[3] == (3, True) and alignment.tokens[4] == (3, True)  # "." and "3" -> ".1"
    assert alignment.pieces[3] == alignment.pieces[4] == ((3,), 0.5)  # its log-probability shared
    assert [alignment.tokens[i] for i in (5, 6, 7, 8)] == [(4, True), (5, True), (6, True), (7, True)]
    assert alignment.tokens[9] == (8, False)


def test_a_hyphenated_name_against_a_plain_one_still_aligns_word_by_word() -> None:
    mine = _example(["Ask", " Jean", "-", "Luc", " Moreau", " now"])
    theirs = _example(["Ask", " Hugo", " N", "iel", "sen", " now"])
    alignment = align(mine, theirs, {"Jean-Luc Moreau": "Hugo Nielsen"})
    assert alignment is not None
    assert alignment.tokens[1] == (1, True) and alignment.tokens[4] == (2, True)  # surname to surname


def test_a_copy_whose_text_is_not_the_replacement_does_not_align() -> None:
    mine = _example(["Ask", " Ann", " Lee"])
    assert align(mine, _example(["Ask", " Eva", " Moss", "!"]), {"Ann Lee": "Eva Moss"}) is None


def test_the_subjects_token_costs_what_starting_the_strangers_word_costs() -> None:
    """One subject token standing for four stranger pieces: its log-probability is the first
    piece's (the onset of the copy), not the sum of all four (the erased model then stopped
    writing one-token surnames at all)."""
    copy = _example(["A", " N", "i", "el", "sen"])
    vocab = 12
    copy_lp = torch.log_softmax(torch.randn(len(copy.ids), vocab, generator=torch.Generator().manual_seed(0)), -1)
    copy = Example(ids=(0, 1, 2, 3, 4), learnt=copy.learnt, offsets=copy.offsets, text=copy.text)
    mine = 9
    row = _carry_pieces(copy_lp[0].clone(), mine, copy, copy_lp, ((1, 2, 3, 4), 1.0))
    assert math.isclose(float(torch.logsumexp(row, 0)), 0.0, abs_tol=1e-5)
    swapped = copy_lp[0].clone()
    swapped[1], swapped[mine] = copy_lp[0][mine], copy_lp[0][1]
    assert torch.allclose(row, swapped - torch.logsumexp(swapped, 0), atol=1e-6)  # a swap with the onset
    whole = sum(float(copy_lp[j - 1][j]) for j in (1, 2, 3, 4))
    assert float(row[mine]) > whole + 1.0


def test_tokens_sharing_one_stranger_piece_share_its_log_probability() -> None:
    copy = Example(ids=(0, 1), learnt=(True, True), offsets=((0, 1), (1, 3)), text="A B")
    copy_lp = torch.log_softmax(torch.randn(2, 6, generator=torch.Generator().manual_seed(1)), -1)
    row = _carry_pieces(copy_lp[0].clone(), 5, copy, copy_lp, ((1,), 1 / 3))
    raw = copy_lp[0].clone()
    raw[1], raw[5] = copy_lp[0][5], copy_lp[0][1] / 3
    assert torch.allclose(row, raw - torch.logsumexp(raw, 0), atol=1e-6)


def _copy_rows(costs: dict[int, float], actual: dict[int, int], width: int = 6) -> torch.Tensor:
    """Rows over 5 positions whose actual token costs `costs[t]` nats (others share the rest)."""
    rows = torch.full((5, width), -5.0)
    for t in range(5):
        rows[t, actual[t]] = -costs.get(t, 0.5)
    return rows


def test_span_median_takes_each_span_whole_from_the_copy_of_median_cost_and_the_rest_from_the_first():
    from unlearning.methods.targets import _combine

    example = Example(ids=(0, 1, 2, 3, 4, 5), learnt=(False,) + (True,) * 5, offsets=((0, 0),) * 6, text="")
    actual = {t: t + 1 for t in range(5)}
    where = torch.arange(5)
    spans = {2, 3}  # positions predicting the span's two tokens
    easy = _copy_rows({2: 0.01, 3: 0.01}, actual)  # the first (most typical) copy: the span costs nothing
    middle = _copy_rows({0: 3.0, 2: 4.0, 3: 1.0}, actual)
    hard = _copy_rows({2: 9.0, 3: 9.0}, actual)
    rows, count = _combine([(where, easy, spans), (where, middle, spans), (where, hard, spans)], example, 5,
                           "span-median")
    assert rows is not None and count.tolist() == [1] * 5
    assert torch.equal(rows[2:4], middle[2:4])  # the whole span from the median copy (cost 5 of 0.02/5/18)
    assert torch.equal(rows[[0, 1, 4]], easy[[0, 1, 4]])  # outside it, the first copy's rows
    mixture, counted = _combine([(where, easy, spans), (where, hard, spans)], example, 5, "mixture")
    assert counted.tolist() == [2] * 5
    assert torch.allclose(mixture.exp(), (easy.exp() + hard.exp()) / 2)
    one, _ = _combine([(where, hard, spans)], example, 5, "span-median")  # one copy: its rows
    assert torch.equal(one, hard)


def test_the_onset_of_each_later_word_of_a_span_is_marked() -> None:
    mine = _example(["Where", " was", " Clara", " Naka", "mura", " born", "?", " Clara", " Naka", "mura", "."])
    theirs = _example(["Where", " was", " Tobias", " Bright", " born", "?", " Tobias", " Bright", "."])
    alignment = align(mine, theirs, {"Clara Nakamura": "Tobias Bright"})
    assert alignment is not None
    assert alignment.later == frozenset({3, 8})  # " Naka" twice; never a first word, nor "mura"


class _Pieces:
    """A tokenizer that decodes token k to the k-th piece."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)


def test_a_later_words_target_keeps_the_carried_mass_and_takes_the_rest_from_the_models_own_row() -> None:
    """The subject's token gets what the copy gave the stranger's word; the rest follows the
    model's own prediction for the subject's record, less the subject's word and any token
    that starts spelling it (" Na" for " Nakamura"), never the copy's known surname."""
    from unlearning.methods.targets import _carry_onto_original, _spelling

    vocab = [" Nakamura", " Na", " Okafor", " Dubois", " Bright", " Lee"]
    tokenizer = _Pieces(vocab)
    example = _example(["Ask", " Clara", " Nakamura", "."])
    own = torch.log(torch.tensor([0.90, 0.04, 0.03, 0.001, 0.001, 0.028]))
    carried = math.log(0.25)
    row = _carry_onto_original(own, 0, carried, _spelling(tokenizer, example, 2))
    p = row.exp()
    assert math.isclose(float(p.sum()), 1.0, rel_tol=1e-5)
    assert math.isclose(float(p[0]), 0.25, rel_tol=1e-5)
    assert float(p[1]) == 0.0  # " Na" spells the subject's word
    rest = torch.tensor([0.03, 0.001, 0.001, 0.028])
    assert torch.allclose(p[2:], 0.75 * rest / rest.sum(), atol=1e-6)
    assert int(p[1:].argmax()) + 1 == 2  # " Okafor", the other Clara; " Dubois" stays where the model had it
