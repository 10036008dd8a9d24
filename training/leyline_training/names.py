"""Name pools for the synthetic worlds, split into disjoint train / test pools.

Entity names (services, modules, keys, functions, owners) are built from the
noun pool of the task's split, so a held-out task never mentions an entity a
training transcript could have memorised. The split of a word is a stable
hash of the word (crc32), not Python's salted ``hash``.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path

_NOUNS = [
    "acorn", "alder", "amber", "anchor", "anvil", "apex", "arbor", "arcade", "archer", "argon", "arrow",
    "aspen", "atlas", "aurora", "avalanche", "badger", "bamboo", "banner", "barley", "basalt", "basil",
    "beacon", "beaver", "birch", "bishop", "bison", "blossom", "bobcat", "bonsai", "boulder", "bramble",
    "brook", "buckle", "bugle", "cabin", "cactus", "caliper", "camel", "canary", "canyon", "caper", "cargo",
    "carver", "cascade", "cedar", "cellar", "chalk", "charter", "cherry", "chisel", "cinder", "citadel",
    "clover", "cobalt", "comet", "condor", "copper", "coral", "cotton", "cougar", "crane", "crater", "cricket",
    "crown", "cypress", "dagger", "dahlia", "delta", "dingo", "dolphin", "domino", "dune", "eagle", "easel",
    "ebony", "echo", "eclipse", "ember", "emerald", "falcon", "fathom", "fennel", "fern", "ferret", "fiddle",
    "finch", "fjord", "flint", "forge", "fossil", "fox", "garnet", "gazelle", "geyser", "ginger", "glacier",
    "glider", "granite", "gravel", "griffin", "grove", "gull", "harbor", "harp", "hawk", "hazel", "heron",
    "hickory", "hornet", "husky", "iris", "island", "ivory", "jackal", "jade", "jaguar", "jasmine", "jasper",
    "juniper", "kayak", "kelp", "kestrel", "kiln", "koala", "lagoon", "lantern", "larch", "lark", "laurel",
    "lemur", "lentil", "lichen", "lilac", "linden", "lotus", "lynx", "magnet", "mallow", "mango", "maple",
    "marble", "marlin", "marsh", "meadow", "mesa", "meteor", "mint", "mistral", "moose", "mosaic", "moth",
    "nectar", "nickel", "nimbus", "nutmeg", "oak", "oasis", "obsidian", "ocelot", "olive", "onyx", "opal",
    "orbit", "orchard", "orchid", "osprey", "otter", "owl", "oyster", "paddle", "panda", "panther", "papyrus",
    "parrot", "pebble", "pelican", "pepper", "petal", "pewter", "pheasant", "pilot", "pine", "piper", "plaza",
    "plume", "pollen", "poplar", "poppy", "prairie", "prism", "puffin", "pulsar", "quail", "quarry", "quartz",
    "quill", "quiver", "radish", "raven", "reef", "ridge", "robin", "rocket", "rowan", "ruby", "saffron",
    "sage", "salmon", "sapphire", "satchel", "sequoia", "shale", "sierra", "silo", "sparrow", "spruce",
    "squall", "starling", "stoat", "summit", "swallow", "sycamore", "tamarind", "tapir", "teal", "tern",
    "thicket", "thistle", "thrush", "tidal", "timber", "topaz", "torrent", "toucan", "tulip", "tundra",
    "turnip", "umber", "valley", "vapor", "velvet", "verbena", "vervet", "viper", "walnut", "walrus", "willow",
    "wombat", "wren", "yarrow", "yew", "zebra", "zenith", "zephyr", "zinnia",
]

_TEST_MOD = 5  # about a fifth of the nouns are held out for the test split


def _is_test_word(word: str) -> bool:
    return zlib.crc32(word.encode()) % _TEST_MOD == 0


def _pseudo_words(n: int) -> list[str]:
    """``n`` pronounceable made-up words (2-3 syllables), none of them a pool noun: seeded, stable."""
    rng = random.Random("wide-nouns")
    onsets, vowels, codas = "bdfgklmnprstvz", "aeiou", ["", "", "n", "r", "l", "s", "k"]
    taken, words = set(_NOUNS), []
    while len(words) < n:
        word = "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                       for _ in range(rng.choice([2, 2, 3])))
        if word not in taken:
            taken.add(word)
            words.append(word)
    return words


def _english_words() -> list[str]:
    """2,997 real English words, disjoint from the other pools (made by :mod:`.english_words`)."""
    return Path(__file__).with_name("english_words.txt").read_text().split()


NOUNS = {
    "train": sorted(w for w in set(_NOUNS) if not _is_test_word(w)),
    "test": sorted(w for w in set(_NOUNS) if _is_test_word(w)),
    # Training-side only: a pool too large to memorise, so a name can only be got right by copying it
    # from the prompt or a tool result (the train pool's 200 nouns are learnt as the only names).
    "wide": _pseudo_words(4000),
    # Training-side only: real words, too many to memorise, spelt like the held-out nouns (the made-up
    # words' syllables alone taught the model to write syllables of that kind instead of copying).
    "english": _english_words(),
}

# Shared, non-entity vocabulary (suffixes, attributes, verbs): the same in both splits.
SERVICE_SUFFIXES = ["api", "sync", "worker", "gateway", "store", "proxy", "indexer", "scheduler", "cache", "relay"]
VERBS = ["compute", "apply", "scale", "merge", "score", "count", "adjust", "estimate", "normalize", "combine",
         "weigh", "balance", "convert", "total", "measure", "rank"]
ATTRS = ["timeout_ms", "max_retries", "batch_size", "pool_size", "port", "replicas", "ttl_seconds", "workers",
         "queue_depth", "rate_limit", "buffer_kb", "shard_count", "owner", "region", "version", "endpoint",
         "log_level", "retry_backoff_ms", "heartbeat_s", "max_connections"]
REGIONS = ["eu-west-1", "eu-west-2", "eu-central-1", "us-east-1", "us-east-2", "us-west-2", "ap-south-1",
           "ap-northeast-1", "sa-east-1", "ca-central-1"]
LOG_LEVELS = ["debug", "info", "warning", "error"]
ENVS = ["prod", "staging", "dev", "canary"]
TEST_CASES = ["basic", "zero", "large", "negative", "small", "mixed", "edge", "identity", "double", "rounding"]


def nouns(split: str) -> list[str]:
    if split not in NOUNS:
        raise ValueError(f"split must be one of {sorted(NOUNS)}, not {split!r}")
    return NOUNS[split]
