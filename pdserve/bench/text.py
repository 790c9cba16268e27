"""Deterministic synthetic English: prompts whose length in tokens is close to their length in words.

The vocabulary is common words that the embedded tokenizer encodes as one token each (with their
leading space), so a prompt of n words is about 1.1 n tokens once punctuation is counted.
"""

from __future__ import annotations

import random

WORDS = tuple("""
the of and to in is that for it as was with be by on not he this are or his from at which but have
an they you were her she there been one all we their has would when if so no will more can out other
into some could them what only its time these may first than then two any like new over such our man
me even most made after also did many before must through years where much your way well down should
because each just those people how too little state good very make world still see own men work long
get here between both life being under never day same another know while last might us great old
year off come since against go came right used take three city water river house number market
report service system data model page question answer people school company plan order team power
""".split())

QUESTION_STARTS = ("What does the text say about", "Why does the author mention", "How is",
                   "Summarise the part about", "Who is responsible for", "When does the report discuss")


def sentence(rng: random.Random, length: int) -> str:
    words = [rng.choice(WORDS) for _ in range(length)]
    return " ".join(words).capitalize() + "."


def paragraph(rng: random.Random, n_words: int) -> str:
    """About n_words words in sentences of 8-20 words; exactly n_words words."""
    sentences = []
    left = n_words
    while left > 0:
        length = min(left, rng.randint(8, 20))
        sentences.append(sentence(rng, length))
        left -= length
    return " ".join(sentences)


def question(rng: random.Random, n_words: int) -> str:
    topic = " ".join(rng.choice(WORDS) for _ in range(max(1, n_words)))
    return f"{rng.choice(QUESTION_STARTS)} {topic}?"
