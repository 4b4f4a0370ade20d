"""Guess the number: seeded secrets for a game the ``guess_number`` environment plays turn by turn.

Each row asks the policy to guess a whole number between LOWEST and HIGHEST; its reference answer is the
secret.  After a wrong guess the environment says whether the secret is higher or lower
(``rollout/multiturn/environments.py``), so a policy that halves the range finds it in 6 guesses.  The rows are
fixed per split (the train and test secrets come from their own seeded sequences); a row is a math task,
so a single-turn evaluation scores one guess with the math verifier.
"""

from __future__ import annotations

import random

from reasonrl.data.examples import Example

LOWEST, HIGHEST = 1, 50
TRAIN_GAMES, TEST_GAMES = 2000, 200
QUESTION = (
    f"I am thinking of a whole number between {LOWEST} and {HIGHEST}. Guess it: reply with one number, and I "
    "will tell you whether mine is higher or lower."
)


def guess_number_examples(split: str) -> list[Example]:
    """The ``train`` (TRAIN_GAMES) or ``test`` (TEST_GAMES) rows, the same on every call."""
    rng = random.Random(f"guess_number:{split}")
    count = TEST_GAMES if split == "test" else TRAIN_GAMES
    return [
        Example(f"guess_number:{split}:{i}", QUESTION, str(rng.randint(LOWEST, HIGHEST)), data_source="guess_number")
        for i in range(count)
    ]
