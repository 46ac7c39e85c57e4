"""The legal codes the service records: Art. 17(1) grounds and coded refusals."""

from __future__ import annotations

# Art. 17(1): the grounds on which a data subject may obtain erasure.
GROUNDS: dict[str, str] = {
    "17(1)(a)": "no longer necessary for the purposes collected or processed",
    "17(1)(b)": "consent withdrawn and no other legal ground",
    "17(1)(c)": "objection under Art. 21 and no overriding legitimate grounds",
    "17(1)(d)": "unlawfully processed",
    "17(1)(e)": "erasure required by a legal obligation",
    "17(1)(f)": "collected in relation to information society services to a child",
}

# Art. 17(3) exemptions, and the two refusals Art. 12 allows before any of them.
DENIAL_REASONS: dict[str, str] = {
    "17(3)(a)": "freedom of expression and information",
    "17(3)(b)": "compliance with a legal obligation or a task in the public interest",
    "17(3)(c)": "public interest in the area of public health",
    "17(3)(d)": "archiving, scientific or historical research or statistics",
    "17(3)(e)": "establishment, exercise or defence of legal claims",
    "manifestly_unfounded_or_excessive": "Art. 12(5): manifestly unfounded or excessive",
    "identity_not_verified": "Art. 12(6): the identity of the requester could not be confirmed",
}

PRIORITIES = ("batch", "immediate")
