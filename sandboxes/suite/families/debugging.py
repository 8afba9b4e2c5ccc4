"""Family "debugging": a small Python program with one planted bug and a reported failing behaviour; the agent
fixes it in place. Tests import the program and compare it with a reference on inputs the agent never sees."""
from __future__ import annotations

import random

from sandboxes.suite.families.common import py_cmd, rng_for, word
from sandboxes.suite.spec import TaskSpec

FAMILY = "debugging"

_LOAD = r'''
import importlib.util


def _prog():
    spec = importlib.util.spec_from_file_location("prog", PROG)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_interface():
    mod = _prog()
    assert callable(getattr(mod, FN, None)), f"{PROG} must still define {FN}()"
    assert callable(getattr(mod, "main", None)), f"{PROG} must still define main()"
'''


def _call(src: str, fn: str, args: tuple) -> str:
    """repr of fn(*args) under the given source, or the exception it raises (generation-time only, our own code)."""
    ns: dict = {"__name__": "generated"}
    exec(compile(src, "<generated>", "exec"), ns)
    try:
        return repr(ns[fn](*args))
    except Exception as e:  # noqa: BLE001 - the planted bug may raise anything
        return f"raises {type(e).__name__}: {e}"


def _plant(rng: random.Random, good: str, variants: list[tuple[str, str]]) -> tuple[str, str, str]:
    fixed, buggy = rng.choice(variants)
    if good.count(fixed) != 1:
        raise AssertionError(f"fix snippet {fixed!r} must occur once in the program")
    src = good.replace(fixed, buggy)
    if src.count(buggy) != 1:
        raise AssertionError(f"bug snippet {buggy!r} must occur once in the buggy program")
    return src, fixed, buggy


def _task(rng, template, good, variants, fn, example, expect_cli, tests, constants, what,
          progress="test_function_cases") -> dict:
    path = f"/app/{word(rng)}_{template}.py"
    good = good.replace("FN", fn).replace("PROG", path)
    variants = [(a.replace("FN", fn), b.replace("FN", fn)) for a, b in variants]
    src, fixed, buggy = _plant(rng, good, variants)
    if isinstance(example, str):
        symptom = example.replace("FN", fn)
    else:
        got, want = _call(src, fn, example), _call(good, fn, example)
        if got == want:
            raise AssertionError(f"{template}: example {example} does not expose the bug")
        symptom = f"For example, `{fn}({', '.join(repr(a) for a in example)})` currently gives `{got}`, but it should return `{want}`."
    instruction = f"""The program `{path}` ({what}) has a bug.

{symptom} {expect_cli.replace("PROGRAM", path)}

Fix the bug in `{path}` itself: keep the function `{fn}` (same name and arguments) and the command-line behaviour
described in its docstrings. Other inputs will be tested too."""
    fix = f"""
p = {path!r}
s = open(p).read()
assert s.count({buggy!r}) == 1
open(p, "w").write(s.replace({buggy!r}, {fixed!r}))
"""
    return dict(template=template, difficulty="medium", instruction=instruction, files={path[5:]: src},
                oracle_commands=(py_cmd(fix),), tests=_LOAD + tests,
                constants=dict(PROG=path, FN=fn, **constants), progress_tests=(progress,))


def _window(rng: random.Random) -> dict:
    fn = rng.choice(["moving_average", "window_means", "rolling_mean"])
    good = '''"""Moving averages: `python3 PROG K < numbers` prints the mean of every K consecutive numbers, 2 decimals."""
import sys


def FN(values, k):
    """Means of every run of k consecutive values: len(values) - k + 1 of them, [] if k > len(values)."""
    out = []
    for i in range(len(values) - k + 1):
        window = values[i:i + k]
        out.append(sum(window) / k)
    return out


def main():
    k = int(sys.argv[1])
    values = [float(x) for x in sys.stdin.read().split()]
    for mean in FN(values, k):
        print(f"{mean:.2f}")


if __name__ == "__main__":
    main()
'''
    variants = [("range(len(values) - k + 1)", "range(len(values) - k)"),
                ("values[i:i + k]", "values[i:i + k - 1]"), ("sum(window) / k", "sum(window) / len(values)")]
    cases = [([float(rng.randint(-50, 99)) for _ in range(rng.randint(5, 12))], rng.randint(2, 4)) for _ in range(3)]
    tests = r'''


def _ref(values, k):
    return [sum(values[i:i + k]) / k for i in range(len(values) - k + 1)]


def test_function_cases():
    f = getattr(_prog(), FN)
    for values, k in CASES:
        got = f(values, k)
        want = _ref(values, k)
        assert len(got) == len(want) and all(abs(a - b) < 1e-9 for a, b in zip(got, want)), (values, k)


def test_edge_cases():
    f = getattr(_prog(), FN)
    assert f([4.0, 6.0], 2) == [5.0]
    assert f([1.0, 2.0], 3) == []


def test_cli():
    values, k = CASES[0]
    r = run([sys.executable, PROG, str(k)], input=" ".join(str(v) for v in values))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [f"{m:.2f}" for m in _ref(values, k)]
'''
    return _task(rng, "window", good, variants, fn, ([1.0, 2.0, 3.0, 4.0], 2),
                 "`echo 1 2 3 4 | python3 PROGRAM 2` must print `1.50`, `2.50` and `3.50` on three lines.",
                 tests, dict(CASES=cases), "moving averages of a number series")


def _median(rng: random.Random) -> dict:
    fn = rng.choice(["median", "middle_value", "med"])
    good = '''"""Median of numbers: `python3 PROG FILE` prints the median of the numbers in FILE with 2 decimals."""
import sys


def FN(xs):
    """Median of a non-empty list of numbers; for an even count, the mean of the two middle values."""
    s = sorted(xs)
    n = len(s)
    mid = n // 2
    if n % 2 == 1:
        return s[mid]
    return (s[mid - 1] + s[mid]) / 2


def main():
    xs = [float(x) for x in open(sys.argv[1]).read().split()]
    print(f"{FN(xs):.2f}")


if __name__ == "__main__":
    main()
'''
    variants = [("s = sorted(xs)", "s = list(xs)"), ("return (s[mid - 1] + s[mid]) / 2", "return (s[mid] + s[mid + 1]) / 2"),
                ("mid = n // 2", "mid = (n - 1) // 2")]
    cases = [[rng.randint(-100, 100) for _ in range(n)] for n in (rng.choice([5, 7]), rng.choice([6, 8]), 4)]
    tests = r'''


def _ref(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def test_function_cases():
    f = getattr(_prog(), FN)
    for xs in CASES:
        assert f(list(xs)) == _ref(xs), xs


def test_even_counts():
    f = getattr(_prog(), FN)
    assert f([7, 1, 3, 5]) == 4
    assert f([10, 2]) == 6


def test_cli(tmp_path):
    p = tmp_path / "nums.txt"
    p.write_text("\n".join(str(x) for x in CASES[1]) + "\n")
    r = run([sys.executable, PROG, str(p)])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{_ref(CASES[1]):.2f}"
'''
    return _task(rng, "median", good, variants, fn, ([9, 1, 7, 3],),
                 "`python3 PROGRAM FILE` must print the median of the numbers in FILE with two decimals.",
                 tests, dict(CASES=cases), "median of a list of numbers")


def _duration(rng: random.Random) -> dict:
    fn = rng.choice(["parse_duration", "to_seconds", "duration_seconds"])
    good = '''"""Durations: `python3 PROG D1 D2 ...` prints the total number of seconds of durations like 1h30m or 2d45s."""
import re
import sys

UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def FN(text):
    """Seconds in a duration made of <int><unit> parts, units d, h, m, s each at most once in that order.
    Raises ValueError on anything else (including the empty string)."""
    m = re.fullmatch(r"(?:(\\d+)d)?(?:(\\d+)h)?(?:(\\d+)m)?(?:(\\d+)s)?", text)
    if not text or not m:
        raise ValueError(f"bad duration: {text!r}")
    return sum(int(v) * UNITS[u] for v, u in zip(m.groups(), "dhms") if v)


def main():
    print(sum(FN(a) for a in sys.argv[1:]))


if __name__ == "__main__":
    main()
'''
    variants = [('"m": 60', '"m": 3600'), ('zip(m.groups(), "dhms")', 'zip(m.groups(), "hdms")'),
                ("(?:(\\d+)h)", "(?:(\\d)h)")]
    cases = [f"{rng.randint(1, 3)}d{rng.randint(10, 23)}h", f"{rng.randint(10, 59)}m{rng.randint(1, 59)}s",
             f"{rng.randint(10, 30)}h{rng.randint(1, 59)}m", f"{rng.randint(1, 9)}d{rng.randint(1, 59)}s", "45s"]
    tests = r'''


def _ref(text):
    m = re.fullmatch(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    assert text and m
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    return sum(int(v) * units[u] for v, u in zip(m.groups(), "dhms") if v)


def test_function_cases():
    f = getattr(_prog(), FN)
    for text in CASES:
        assert f(text) == _ref(text), text


def test_invalid_rejected():
    f = getattr(_prog(), FN)
    for bad in ["", "5x", "1m1h", "h"]:
        with pytest.raises(ValueError):
            f(bad)


def test_cli():
    r = run([sys.executable, PROG, *CASES[:3]])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(sum(_ref(c) for c in CASES[:3]))
'''
    return _task(rng, "duration", good, variants, fn, ("12h30m",),
                 "`python3 PROGRAM 1h 30m` must print `5400`.", tests, dict(CASES=cases),
                 "parsing durations like `2d4h` into seconds")


def _wordcount(rng: random.Random) -> dict:
    fn = rng.choice(["count_words", "word_counts", "tally"])
    good = '''"""Word counts: `python3 PROG N FILE` prints the N most frequent words of FILE as `<word> <count>`,
most frequent first, ties alphabetical."""
import re
import sys


def FN(text):
    """Case-insensitive counts {word: count}; a word is a maximal run of letters, digits and apostrophes."""
    counts = {}
    for w in re.findall(r"[A-Za-z0-9']+", text):
        w = w.lower()
        counts[w] = counts.get(w, 0) + 1
    return counts


def main():
    n, path = int(sys.argv[1]), sys.argv[2]
    ranked = sorted(FN(open(path).read()).items(), key=lambda kv: (-kv[1], kv[0]))
    for w, c in ranked[:n]:
        print(w, c)


if __name__ == "__main__":
    main()
'''
    variants = [("counts[w] = counts.get(w, 0) + 1", "counts[w] += 1"), ("w = w.lower()", "w = w.strip()"),
                ("[A-Za-z0-9']+", "[A-Za-z']+")]
    texts = [" ".join(rng.choice([word(rng), word(rng).capitalize(), "it's", f"v{rng.randint(1, 3)}"])
                      for _ in range(rng.randint(15, 30))) for _ in range(2)]
    tests = r'''


def _ref(text):
    out = {}
    for w in re.findall(r"[A-Za-z0-9']+", text):
        out[w.lower()] = out.get(w.lower(), 0) + 1
    return out


def test_function_cases():
    f = getattr(_prog(), FN)
    for text in TEXTS:
        assert f(text) == _ref(text)


def test_case_and_digits():
    f = getattr(_prog(), FN)
    assert f("Go go GO v2 v2 don't") == {"go": 3, "v2": 2, "don't": 1}


def test_cli(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text(TEXTS[0])
    r = run([sys.executable, PROG, "3", str(p)])
    assert r.returncode == 0, r.stderr
    want = sorted(_ref(TEXTS[0]).items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    assert r.stdout.splitlines() == [f"{w} {c}" for w, c in want]
'''
    return _task(rng, "wordcount", good, variants, fn, ("The cat saw the 2 cats",),
                 "`python3 PROGRAM N FILE` must print the N most frequent words as `<word> <count>` lines.",
                 tests, dict(TEXTS=texts), "counting words case-insensitively")


def _tags(rng: random.Random) -> dict:
    fn = rng.choice(["tag_item", "with_tag", "add_label"])
    tag = word(rng)
    good = f'''"""Tagging: `python3 PROG ITEM [TAG...]` prints the JSON record FN(ITEM, TAGS) builds."""
import json
import sys


def FN(item, tags=None):
    """A new record {{"item": item, "tags": [*tags, "{tag}"]}}. Never modifies the caller's list."""
    result = [] if tags is None else list(tags)
    result.append("{tag}")
    return {{"item": item, "tags": result}}


def main():
    print(json.dumps(FN(sys.argv[1], sys.argv[2:] or None)))


if __name__ == "__main__":
    main()
'''
    variants = [("[] if tags is None else list(tags)", "[] if tags is None else tags")]
    items = [f"{word(rng)}-{rng.randint(1, 99)}" for _ in range(3)]
    symptom = (f"After `mine = [\"a\"]; FN(\"box\", mine)`, the caller's list `mine` has become `[\"a\", \"{tag}\"]`; it "
               f"must stay `[\"a\"]` while the returned record holds `[\"a\", \"{tag}\"]`.")
    tests = r'''


def test_fresh_records():
    f = getattr(_prog(), FN)
    a, b = f(ITEMS[0]), f(ITEMS[1])
    assert a == {"item": ITEMS[0], "tags": [TAG]} and b == {"item": ITEMS[1], "tags": [TAG]}


def test_caller_list_untouched():
    f = getattr(_prog(), FN)
    mine = ["x", "y"]
    rec = f(ITEMS[2], mine)
    assert mine == ["x", "y"] and rec["tags"] == ["x", "y", TAG]
    again = f(ITEMS[2], mine)
    assert again["tags"] == ["x", "y", TAG] and again["tags"] is not rec["tags"]


def test_cli():
    r = run([sys.executable, PROG, ITEMS[0], "a", "b"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"item": ITEMS[0], "tags": ["a", "b", TAG]}
'''
    return _task(rng, "tags", good, variants, fn, symptom, "", tests, dict(ITEMS=items, TAG=tag),
                 "building tagged records", progress="test_caller_list_untouched")


TEMPLATES = (_window, _median, _duration, _wordcount, _tags)


def make(seed: int) -> TaskSpec:
    """Generate the debugging task for `seed` (template = seed mod number of templates)."""
    rng = rng_for(FAMILY, seed)
    fields = TEMPLATES[seed % len(TEMPLATES)](rng)
    return TaskSpec(family=FAMILY, seed=seed, setup=(), **fields)
