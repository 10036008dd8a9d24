"""Regenerate ``english_words.txt``, the "english" split's name pool (see :mod:`.names`).

    python -m leyline_training.english_words > training/leyline_training/english_words.txt

Real words of the stdlib's prose: lowercase words of 4-9 letters seen at least 4 times,
minus the 300 most common, Python keywords and builtins, the worlds' shared vocabulary,
every pool noun and any word sharing a prefix with one, and the made-up words; 3,000
candidates drawn with a fixed seed, then the made-up ones removed. The committed list
came from CPython 3.11's stdlib; another Python's stdlib gives a different list, which is
why the list is committed rather than built at training time.
"""

from __future__ import annotations

import builtins
import collections
import keyword
import random
import re

from . import names as N
from .corpus import _read, stdlib_files

_PROSE_WORD = re.compile(r"(?<![A-Za-z_.])([a-z]{4,9})(?![A-Za-z_(])")


def english_words(n: int = 3000) -> list[str]:
    counts: collections.Counter[str] = collections.Counter()
    for path in stdlib_files(None):
        counts.update(_PROSE_WORD.findall(_read(path) or ""))
    reserved = set(N._NOUNS) | set(keyword.kwlist) | {w.lower() for w in dir(builtins)}
    reserved |= set(N.SERVICE_SUFFIXES) | set(N.VERBS) | set(N.TEST_CASES) | set(N.ENVS) | set(N.LOG_LEVELS)
    reserved |= {part for attr in N.ATTRS for part in attr.split("_")}
    reserved |= {part for region in N.REGIONS for part in region.split("-")}
    reserved |= {w for w, _ in counts.most_common(300)}
    candidates = sorted(w for w, c in counts.items() if c >= 4 and w not in reserved
                        and not any(w.startswith(noun) or noun.startswith(w) for noun in N._NOUNS))
    made_up = set(N.nouns("wide"))
    return [w for w in sorted(random.Random("english-words").sample(candidates, n)) if w not in made_up]


if __name__ == "__main__":
    print("\n".join(english_words()))
