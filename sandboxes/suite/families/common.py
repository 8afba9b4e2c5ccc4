"""Shared vocabulary and shell-quoting helpers for the family generators."""
from __future__ import annotations

import hashlib
import random
import shlex

WORDS = (
    "alpha amber anchor apple arrow aspen atlas autumn badger basil beacon birch bison blossom breeze bridge brook "
    "cactus canyon carbon cedar cherry cinder cobalt comet copper coral cosmic cotton crane crystal cypress dawn "
    "delta desert dingo dolphin dune eagle ember falcon fern fjord flint forest fossil galaxy garnet glacier granite "
    "harbor hazel heron hollow horizon indigo iris island ivory jade jasper juniper kelp kestrel lagoon lantern lemon "
    "lilac linen lotus lunar maple marble meadow mango meteor mint monsoon moss nebula nectar nickel nimbus oak oasis "
    "olive onyx orbit orchid otter pebble pepper pine planet plum polar poppy prairie quartz quill raven reef ridge "
    "river robin ruby saffron sage salmon sapphire shadow sierra silver slate sparrow spruce storm summit sunset "
    "thistle thunder tidal timber topaz tulip tundra umber valley velvet violet walnut willow winter yarrow zephyr"
).split()
FIRST = ("ada alan alice arun bea boris carla chen dana diego elena emil fatima felix greta hana ivan jonas kai "
         "lara leo mei mira nadia omar priya rafael rosa sami tara theo uma vera wen yusuf zoe").split()
LAST = ("adams baker chen diaz evans fischer garcia haddad ito jensen khan lopez moreau nagy okafor patel "
        "quinn rossi silva tanaka urban varga weber xu young zhang").split()
CITIES = ("Lisbon Oslo Nairobi Lima Osaka Denver Porto Quito Tallinn Hanoi Perth Dakar Bergen Cusco Kyoto "
          "Austin Leeds Malmo Turin Recife").split()
COUNTRIES = ("PT NO KE PE JP US BR EC EE VN AU SN DE FR IT").split()


def rng_for(family: str, seed: int) -> random.Random:
    """A generator private to (family, seed): str seeds hash with SHA-512, so this is stable across runs."""
    return random.Random(f"{family}:{seed}")


def word(rng: random.Random, exclude=()) -> str:
    return rng.choice([w for w in WORDS if w not in exclude])


def words(rng: random.Random, n: int) -> list[str]:
    return rng.sample(WORDS, n)


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def person(rng: random.Random) -> tuple[str, str]:
    return rng.choice(FIRST), rng.choice(LAST)


def write_cmd(path: str, text: str) -> str:
    """A one-line shell command writing `text` (which must end in a newline) to `path` byte-exactly."""
    if not text.endswith("\n"):
        raise ValueError(f"text for {path} must end with a newline")
    lines = text[:-1].split("\n")
    return "printf '%s\\n' " + " ".join(shlex.quote(l) for l in lines) + " > " + shlex.quote(path)


def py_cmd(script: str) -> str:
    """A shell command running a Python script given inline."""
    return "python3 -c " + shlex.quote(script.strip() + "\n")


def sha(data: str | bytes) -> str:
    """sha256 hex digest, to pin file contents in tests without embedding them."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()
