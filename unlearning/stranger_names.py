"""Name parts for strangers whose names the model never saw.

A stranger stands in for the subject as a model that never saw the subject
would see them.  Where a part of the subject's name is common in the corpus
("Dmitri", shared with other people), such a model knows it, and the stranger
gets another name part seen in the corpus.  Where it is not ("Ueda", only in
the subject's records), such a model has never met it, and the stranger gets
a name it never met either: an ordinary name of the world from these lists,
minus every word the corpus shows in a name.  A pronounceable pseudo-word
would not do: it scores as implausible under any model, so the subject would
look more familiar than strangers even to a model retrained without them.

The lists mix languages and regions so that any corpus leaves enough of them
unseen.  They are engine data, not anyone's record.
"""

from __future__ import annotations

GIVEN_NAMES = (
    "Abebe", "Adaeze", "Adrian", "Agnieszka", "Ahmed", "Aino", "Akira", "Alberto", "Aleksander",
    "Alessia", "Alina", "Amelie", "Anders", "Andrea", "Aneta", "Anika", "Anton", "Arjun", "Astrid",
    "Aurora", "Beatriz", "Benedikt", "Bilal", "Blanca", "Bogdan", "Carmen", "Cecilia", "Chidi",
    "Cosmin", "Daniel", "Dagny", "Daphne", "Deniz", "Diego", "Dolores", "Eamon", "Eduardo", "Eero",
    "Eliska", "Elodie", "Enzo", "Erik", "Eszter", "Fatima", "Fernando", "Filip", "Freya", "Gabriel",
    "Giulia", "Gunnar", "Hanna", "Haruto", "Hassan", "Heidi", "Ibrahim", "Ingrid", "Irene", "Ivan",
    "Jana", "Javier", "Joanna", "Johan", "Julia", "Kamala", "Karim", "Karolina", "Kasper", "Keiko",
    "Lars", "Laura", "Leandro", "Lidia", "Linnea", "Luca", "Lucia", "Lukas", "Magdalena", "Malik",
    "Marco", "Margit", "Mariana", "Martin", "Mateusz", "Meera", "Miguel", "Mikael", "Milan",
    "Monika", "Nasrin", "Nicolas", "Nikolai", "Olga", "Oliver", "Omar", "Patrik", "Petra", "Rania",
    "Ravi", "Renata", "Ricardo", "Rolf", "Ruth", "Sabine", "Sakura", "Sandra", "Santiago", "Sara",
    "Sebastian", "Simone", "Stefan", "Susanna", "Tamar", "Teresa", "Theo", "Timo", "Tomas", "Ursula",
    "Valentina", "Walter", "Wiktoria", "Yasmin", "Yuki", "Zofia",
)

FAMILY_NAMES = (
    "Adeyemi", "Aguilar", "Andersson", "Aydin", "Bakker", "Barros", "Becker", "Bergman", "Blanco",
    "Bogdanov", "Borg", "Brandt", "Campbell", "Chowdhury", "Costa", "Dalton", "Demir", "Diallo",
    "Dimitrov", "Duarte", "Eriksen", "Farouk", "Ferrari", "Fischer", "Fournier", "Gallo", "Garcia",
    "Gonzalez", "Gustafsson", "Hakimi", "Hansen", "Hartmann", "Horvath", "Hughes", "Ishikawa",
    "Jansen", "Jensen", "Johansson", "Kang", "Karlsson", "Kato", "Keller", "Kim", "Klein", "Kovacs",
    "Kozlov", "Kraus", "Kumar", "Lambert", "Larsen", "Lehmann", "Lopez", "Lund", "Maier", "Martins",
    "Mazur", "Meyer", "Molina", "Monteiro", "Morales", "Murphy", "Nagy", "Navarro", "Nielsen",
    "Nowak", "Nunez", "Olsen", "Osei", "Park", "Pereira", "Popescu", "Rossi", "Russo", "Saito",
    "Santos", "Schmidt", "Schulz", "Silva", "Simonsen", "Sousa", "Stoica", "Suzuki", "Svensson",
    "Tomic", "Torres", "Vogel", "Wagner", "Walsh", "Weber", "Wolff", "Wozniak", "Yamamoto", "Zhou",
    "Ziegler", "Zielinski",
)
