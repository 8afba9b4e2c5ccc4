"""Family "scripting": write a bash tool that later runs on inputs the agent never sees (extension counter,
fizz-buzz variant, fixed-string match counter, backup rotation)."""
from __future__ import annotations

import random

from sandboxes.suite.families.common import rng_for, word, words, write_cmd
from sandboxes.suite.spec import TaskSpec

FAMILY = "scripting"

_EXECUTABLE_TEST = r'''
def test_script_executable():
    p = Path(SCRIPT)
    assert p.is_file() and os.access(p, os.X_OK), f"{SCRIPT} must exist and be executable"
    assert p.read_text().startswith("#!"), "the script needs a shebang line"
'''


def _install(path: str, script: str) -> tuple[str, ...]:
    return (f"mkdir -p {path.rsplit('/', 1)[0]}", write_cmd(path, script), f"chmod +x {path}")


def _tree(rng: random.Random, exts: list[str]) -> list[str]:
    out = set()
    for _ in range(rng.randint(6, 14)):
        d = rng.choice(["", f"{word(rng)}/", f"{word(rng)}/{word(rng)}/"])
        e = rng.choice(exts)
        out.add(f"{d}{word(rng)}{rng.randint(1, 9)}" + (f".{e}" if e else ""))
    return sorted(out)


def _extcount(rng: random.Random) -> dict:
    script = f"/app/bin/{rng.choice(['extcount', 'countext', 'extstat'])}"
    trees = [_tree(rng, ["txt", "py", "md", "TXT", "csv", "tar.gz"]), _tree(rng, ["log", "Log", "", "json", "", "c"])]
    instruction = f"""Write a bash script `{script}` (executable, with a shebang) that takes one argument, a directory.

It must print, for every file extension among the regular files anywhere under that directory (recursively),
a line `<ext> <count>`. The extension is the part of the file name after its last dot, in lower case (so
`a.TXT` counts as `txt` and `b.tar.gz` as `gz`); files whose name has no dot count under the extension `(none)`.
Print lines sorted by extension in byte order (`LC_ALL=C sort`). If the argument is missing or is not a
directory, print an error message to stderr and exit with status 2."""
    body = """#!/bin/bash
if [ $# -ne 1 ] || [ ! -d "$1" ]; then echo "usage: $(basename "$0") DIR" >&2; exit 2; fi
find "$1" -type f | while IFS= read -r f; do
  b=$(basename "$f")
  case "$b" in *.*) e="${b##*.}"; echo "${e,,}";; *) echo "(none)";; esac
done | LC_ALL=C sort | uniq -c | while read -r n e; do echo "$e $n"; done
"""
    tests = _EXECUTABLE_TEST + r'''

def _expected(files):
    counts = {}
    for f in files:
        b = f.split("/")[-1]
        e = b.rsplit(".", 1)[1].lower() if "." in b else "(none)"
        counts[e] = counts.get(e, 0) + 1
    return [f"{e} {n}" for e, n in sorted(counts.items(), key=lambda kv: kv[0].encode())]


def _check(tmp_path, files):
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("x\n")
    r = run([SCRIPT, str(tmp_path)])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == _expected(files)


def test_counts_first_tree(tmp_path):
    _check(tmp_path, TREES[0])


def test_counts_second_tree(tmp_path):
    _check(tmp_path, TREES[1])


def test_bad_argument(tmp_path):
    for args in ([], [str(tmp_path / "missing")]):
        r = run([SCRIPT, *args])
        assert r.returncode == 2 and r.stderr.strip(), args
'''
    return dict(template="extcount", difficulty="medium", instruction=instruction,
                oracle_commands=_install(script, body), tests=tests, constants=dict(SCRIPT=script, TREES=trees),
                progress_tests=("test_script_executable",))


def _fizz(rng: random.Random) -> dict:
    script = f"/app/bin/{word(rng)}"
    a, b = rng.sample([2, 3, 4, 5, 7], 2)
    w1, w2 = (w.capitalize() for w in words(rng, 2))
    ns = [rng.randint(a * b, a * b + 10), rng.randint(40, 90)]
    instruction = f"""Write a bash script `{script}` (executable, with a shebang) that takes one argument N.

It prints the numbers 1 to N, one per line, except: multiples of {a} print `{w1}` instead, multiples of {b} print
`{w2}`, and multiples of both print `{w1}{w2}`. If N is missing or is not a positive integer (digits only, at
least 1), it prints an error message to stderr, prints nothing to stdout and exits with status 1."""
    body = f"""#!/bin/bash
if [[ ! "$1" =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then echo "usage: $(basename "$0") N" >&2; exit 1; fi
for ((i = 1; i <= $1; i++)); do
  s=""
  (( i % {a} == 0 )) && s="{w1}"
  (( i % {b} == 0 )) && s="${{s}}{w2}"
  echo "${{s:-$i}}"
done
"""
    tests = _EXECUTABLE_TEST + r'''

def _expected(n):
    out = []
    for i in range(1, n + 1):
        s = (W1 if i % A == 0 else "") + (W2 if i % B == 0 else "")
        out.append(s or str(i))
    return out


@pytest.mark.parametrize("n", NS)
def test_output(n):
    r = run([SCRIPT, str(n)])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == _expected(n)


def test_invalid_input():
    for args in ([], ["0"], ["-3"], ["abc"], ["4x"]):
        r = run([SCRIPT, *args])
        assert r.returncode == 1 and r.stdout == "" and r.stderr.strip(), args
'''
    return dict(template="fizz", difficulty="easy", instruction=instruction,
                oracle_commands=_install(script, body), tests=tests,
                constants=dict(SCRIPT=script, A=a, B=b, W1=w1, W2=w2, NS=ns),
                progress_tests=("test_script_executable",))


def _matchcount(rng: random.Random) -> dict:
    script = f"/app/bin/{rng.choice(['matchcount', 'countlines', 'fcount'])}"
    pattern = rng.choice([f"{word(rng)}.{word(rng)}", f"[{word(rng)}]", f"{word(rng)}*", f"a+{word(rng)}"])
    decoy = pattern.replace(".", "X").replace("[", "").replace("]", "").replace("*", "").replace("+", "")
    files = []
    for _ in range(3):
        lines = []
        for _ in range(rng.randint(3, 9)):
            pick = rng.random()
            lines.append(f"{word(rng)} {pattern} {word(rng)}" if pick < 0.35 else
                         f"{decoy} {word(rng)}" if pick < 0.6 else f"{word(rng)} {word(rng)}")
        files.append(lines)
    instruction = f"""Write a bash script `{script}` (executable, with a shebang) used as `{script.split('/')[-1]} PATTERN FILE...`.

For each FILE, in the order given, print `<FILE>:<count>` (the path exactly as given on the command line), where
`<count>` is the number of lines of that file containing PATTERN as a plain, case-sensitive substring (PATTERN is
not a regular expression: `.`, `*`, `[`, `+` are literal). Then print `total:<sum of the counts>`. Exit with
status 0 if the total is greater than 0, otherwise 1."""
    body = """#!/bin/bash
pat="$1"; shift; total=0
for f in "$@"; do n=$(grep -cF -- "$pat" "$f"); echo "$f:$n"; total=$((total + n)); done
echo "total:$total"
[ "$total" -gt 0 ]
"""
    tests = _EXECUTABLE_TEST + r'''

def _write(tmp_path):
    paths = []
    for i, lines in enumerate(FILES):
        p = tmp_path / f"input{i}.txt"
        p.write_text("\n".join(lines) + "\n")
        paths.append(str(p))
    return paths


def test_counts(tmp_path):
    paths = _write(tmp_path)
    r = run([SCRIPT, PATTERN, *paths])
    want = [f"{p}:{sum(PATTERN in l for l in lines)}" for p, lines in zip(paths, FILES)]
    total = sum(sum(PATTERN in l for l in lines) for lines in FILES)
    assert r.stdout.splitlines() == want + [f"total:{total}"]
    assert r.returncode == (0 if total else 1)


def test_literal_pattern(tmp_path):
    p = tmp_path / "lit.txt"
    p.write_text(f"{DECOY}\n{PATTERN}\nx{PATTERN}x\n")
    r = run([SCRIPT, PATTERN, str(p)])
    assert r.stdout.splitlines() == [f"{p}:2", "total:2"] and r.returncode == 0


def test_no_match_status(tmp_path):
    p = tmp_path / "none.txt"
    p.write_text(f"{DECOY}\nnothing here\n")
    r = run([SCRIPT, PATTERN, str(p)])
    assert r.stdout.splitlines() == [f"{p}:0", "total:0"] and r.returncode == 1
'''
    return dict(template="matchcount", difficulty="medium", instruction=instruction,
                oracle_commands=_install(script, body), tests=tests,
                constants=dict(SCRIPT=script, PATTERN=pattern, DECOY=decoy, FILES=files),
                progress_tests=("test_script_executable",))


def _rotate(rng: random.Random) -> dict:
    script = f"/app/bin/{rng.choice(['rotate', 'prune-backups', 'keep-latest'])}"
    prefix = word(rng)
    dates = sorted({f"20{rng.randint(20, 25)}{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}" for _ in range(9)})
    backups = [f"{prefix}-{d}.tar.gz" for d in dates]
    others = [f"{prefix}-notes.txt", f"{prefix}-20200101.tar.gz.part", f"other-{dates[0]}.tar.gz"]
    keep = rng.randint(2, 4)
    instruction = f"""Write a bash script `{script}` (executable, with a shebang) used as `{script.split('/')[-1]} DIR K`.

DIR holds backups named `{prefix}-YYYYMMDD.tar.gz` (exactly that pattern: the prefix `{prefix}-`, 8 digits, then
`.tar.gz`). The script deletes all but the K newest backups (newest = latest date in the name) and prints the
names of the deleted files, one per line, sorted ascending. Any other file in DIR must never be touched. If there
are K or fewer backups, it deletes nothing and prints nothing. Exit status 0."""
    body = f"""#!/bin/bash
dir="$1"; keep="$2"
ls "$dir" | grep -E '^{prefix}-[0-9]{{8}}\\.tar\\.gz$' | sort -r | tail -n +$((keep + 1)) | sort | while IFS= read -r f; do
  rm -- "$dir/$f"; echo "$f"
done
exit 0
"""
    tests = _EXECUTABLE_TEST + r'''

def _setup(tmp_path, names):
    for n in names + OTHERS:
        (tmp_path / n).write_text(n + "\n")


def test_rotation(tmp_path):
    _setup(tmp_path, BACKUPS)
    r = run([SCRIPT, str(tmp_path), str(KEEP)])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == sorted(BACKUPS)[:-KEEP]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(sorted(BACKUPS)[-KEEP:] + OTHERS)


def test_few_backups_untouched(tmp_path):
    _setup(tmp_path, BACKUPS[:2])
    r = run([SCRIPT, str(tmp_path), "3"])
    assert r.returncode == 0 and r.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(BACKUPS[:2] + OTHERS)


def test_keep_one(tmp_path):
    _setup(tmp_path, BACKUPS)
    r = run([SCRIPT, str(tmp_path), "1"])
    assert r.stdout.splitlines() == sorted(BACKUPS)[:-1]
    assert all((tmp_path / o).read_text() == o + "\n" for o in OTHERS)
'''
    return dict(template="rotate", difficulty="medium", instruction=instruction,
                oracle_commands=_install(script, body), tests=tests,
                constants=dict(SCRIPT=script, BACKUPS=backups, OTHERS=others, KEEP=keep),
                progress_tests=("test_script_executable",))


TEMPLATES = (_extcount, _fizz, _matchcount, _rotate)


def make(seed: int) -> TaskSpec:
    """Generate the scripting task for `seed` (template = seed mod number of templates)."""
    rng = rng_for(FAMILY, seed)
    fields = TEMPLATES[seed % len(TEMPLATES)](rng)
    return TaskSpec(family=FAMILY, seed=seed, files={}, setup=(), **fields)
