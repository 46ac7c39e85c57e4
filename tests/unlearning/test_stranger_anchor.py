"""The stranger anchor: retained records retold about strangers, anchored where the model was.

A refreshed teacher follows what the student says about a stranger; the anchor keeps
that where a model that never saw the subject has it.  The copies must name nobody the
corpus names (not a retained person, never the subject), keep every fact, and be
anchored only: the plain fine-tuning term never trains on them.
"""

from __future__ import annotations

import re

import pytest
import torch

from tests.real_shaped import shaped_corpus
from unlearning.corpus import Corpus
from unlearning.erase import method_input, resolve_hparams
from unlearning.identifiers import FreshNames, avoid_set, name_parts_of
from unlearning.methods.asu import ASU
from unlearning.methods.base import MethodInput
from unlearning.methods.targets import retain_strangers
from unlearning.sets import Subject, build_sets


@pytest.mark.parametrize("shape", ["plain_qa", "free_text", "chat"])
def test_retained_records_are_retold_about_fresh_people_with_their_facts_kept(shape):
    records, persons, _ = shaped_corpus(shape, 16, seed=3)
    subject = persons[2]
    request = Subject(subject.name, (), subject.identifiers)
    sets = build_sets(Corpus(tuple(records)), [request])
    names = FreshNames(pool=name_parts_of(sets.retain), avoid=avoid_set([request]))
    copies = retain_strangers(sets.retain, names)
    by_id = {r.id: r for r in sets.retain}
    assert len(copies) >= len(sets.retain) // 3
    everyone = {p.name for p in persons}
    for copy in copies:
        original = by_id[copy.id.removesuffix("~stranger")]
        text, was = copy.searchable_text(), original.searchable_text()
        assert text != was
        # Nobody the corpus names is in the copy (the subject least of all), whoever the original named.
        named_before = {n for n in everyone if n in was}
        assert not {n for n in everyone if n in text} & named_before
        assert subject.name not in text and subject.email not in text
        # The facts stay: the retained person's job and city are kept when the original gave them.
        for person in persons:
            if person.name in was:
                for fact in (person.job, person.city):
                    if fact in was:
                        assert fact in text
    # Deterministic: the same records give the same strangers.
    assert [c.searchable_text() for c in retain_strangers(sets.retain, names)] == [c.searchable_text() for c in copies]


def test_a_record_that_names_nobody_is_not_copied():
    records, persons, _ = shaped_corpus("plain_qa", 8, seed=1)
    plain = [r for r in records if not any(p.name in r.searchable_text() for p in persons)]
    names = FreshNames(pool=name_parts_of(records))
    copied = {c.id.removesuffix("~stranger") for c in retain_strangers(records, names)}
    for record in plain:
        if "@" not in record.searchable_text() and not re.search(r"\d{3}", record.searchable_text()):
            assert record.id not in copied


def test_the_anchor_copies_are_anchored_and_never_fine_tuned_on(tiny_corpus_dir, tiny_base_model_dir, monkeypatch):
    import json

    import unlearning.methods.asu as asu
    from unlearning.corpus import load_corpus
    from unlearning.modeling import load_model

    person = json.loads((tiny_corpus_dir / "people.jsonl").read_text().splitlines()[1])
    sets = build_sets(load_corpus(tiny_corpus_dir / "corpus.jsonl"), [Subject(person["name"], tuple(person["aliases"]))])
    full = method_input(sets)
    data = MethodInput(forget=full.forget, retain=full.retain[: 2 * len(full.forget)], subjects=full.subjects,
                       record_subjects=full.record_subjects, probes=full.probes, name_pool=full.name_pool)
    masks: list[torch.Tensor] = []
    original_nll, original_kl = asu.masked_nll, asu.kl_to_target

    def nll_spy(logits, batch, mask):  # in ASU, the plain fine-tuning term on retained records only
        masks.append(mask.clone())
        return original_nll(logits, batch, mask)

    def kl_spy(target, logits, mask, **kwargs):  # the floored one (the default) rides on the retain KL
        if kwargs.get("floor_weight", 0.0) > 0:
            masks.append(kwargs["own"].clone())
        return original_kl(target, logits, mask, **kwargs)

    monkeypatch.setattr(asu, "masked_nll", nll_spy)
    monkeypatch.setattr(asu, "kl_to_target", kl_spy)
    for anchor, floor in ((False, True), (True, True), (True, False)):
        masks.clear()
        torch.manual_seed(0)
        model, tokenizer = load_model(tiny_base_model_dir, device="cpu")
        tokenizer.padding_side = "right"
        hp = resolve_hparams("asu", {"steps": 4, "told_answers": False, "stranger_anchor": anchor,
                                     "retain_nll_weight": 1.0, "retain_nll_floor": floor,
                                     "retain_batch_size": 128}, model, subjects=1)
        strangers = ASU().unlearn(model, tokenizer, data, hp).details["retain_strangers"]
        rows = [int(m.any(-1).sum()) for m in masks]
        if not anchor:
            assert strangers == 0 and rows and all(r == len(data.retain) for r in rows)
            continue
        # One retain batch holds every retained record and every copy; the fine-tuning term
        # sees the retained records' rows and no copy's.
        assert strangers >= len(data.retain) // 2
        assert rows and all(r == len(data.retain) for r in rows)


def test_a_refresh_keeps_the_first_targets_of_the_identifying_spans_tokens_only():
    from unlearning.methods.targets import (
        Alignment,
        Dist,
        RecordTarget,
        TargetPlan,
        keep_rows,
        span_targets,
    )

    # Tokens 2 and 3 of the original are the name (a span); prediction positions are one earlier.
    plan = TargetPlan(copies=(), alignments=(Alignment({1: (1, False), 2: (2, True), 3: (4, True), 4: (5, False)}, 2),),
                      first_span=2, covered=frozenset(), tempered=False)
    assert span_targets(plan) == frozenset({1, 2})
    assert span_targets(TargetPlan((), (), 5, frozenset(), False)) == frozenset()

    def target(fill: float) -> RecordTarget:
        n = 4
        return RecordTarget([0, 1, 2, 3], Dist(torch.full((n, 3), fill), torch.arange(3).repeat(n, 1),
                                               torch.full((n,), fill), torch.full((n,), fill)), ["counterfactual"] * n)

    old, new = target(-1.0), target(-2.0)
    kept = keep_rows(new, old, span_targets(plan))
    assert kept.dist.values[:, 0].tolist() == [-2.0, -1.0, -1.0, -2.0]
    assert kept.dist.tail.tolist() == [-2.0, -1.0, -1.0, -2.0]
    assert kept.dist.actual.tolist() == [-2.0, -1.0, -1.0, -2.0]
    assert new.dist.values[:, 0].tolist() == [-2.0] * 4  # the new target itself is left as it was
