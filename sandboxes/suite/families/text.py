"""Family "text": text processing (log report, word replacement, email extraction, word frequency, INI edit)."""
from __future__ import annotations

import collections
import random
import re

from sandboxes.suite.families.common import FIRST, LAST, py_cmd, rng_for, sentence, sha, word, words
from sandboxes.suite.spec import TaskSpec

FAMILY = "text"


def _status_report(rng: random.Random) -> dict:
    ips = [f"10.{rng.randint(0, 9)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}" for _ in range(6)]
    paths = [f"/{w}" for w in words(rng, 5)] + ["/", "/api/items"]
    codes = rng.sample([200, 201, 204, 301, 302, 304, 400, 401, 403, 404, 500, 502, 503], rng.randint(4, 7))
    weights = [rng.randint(1, 10) for _ in codes]
    lines, counts = [], collections.Counter()
    for i in range(rng.randint(40, 90)):
        code = rng.choices(codes, weights)[0]
        counts[code] += 1
        method = rng.choice(["GET", "GET", "POST", "PUT"])
        lines.append(f'{rng.choice(ips)} - - [12/Mar/2024:{10 + i // 60:02d}:{i % 60:02d}:{rng.randint(0, 59):02d} +0000] '
                     f'"{method} {rng.choice(paths)} HTTP/1.1" {code} {rng.randint(0, 5000)}')
    expected = [f"{c} {n}" for c, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    instruction = """Summarise the web server log `/app/access.log` (common log format: the HTTP status code is the
field right after the quoted request).

Write `/app/report.txt` with one line per distinct status code, formatted `<status> <count>` (single space),
where `<count>` is the number of requests with that status. Order lines by count, largest first; break ties by
status code, smallest first. No header and no other lines."""
    tests = r'''
def test_report_exists():
    assert (APP / "report.txt").is_file()


def test_report_format():
    lines = (APP / "report.txt").read_text().splitlines()
    assert lines and all(re.fullmatch(r"[1-5]\d\d [1-9]\d*", l) for l in lines), lines


def test_counts_right():
    got = dict(l.split() for l in (APP / "report.txt").read_text().splitlines())
    assert got == dict(l.split() for l in EXPECTED)


def test_order_right():
    assert (APP / "report.txt").read_text().splitlines() == EXPECTED
'''
    cmd = ("awk '{print $(NF-1)}' /app/access.log | sort | uniq -c | sort -k1,1nr -k2,2n "
           "| awk '{print $2\" \"$1}' > /app/report.txt")
    return dict(template="status_report", difficulty="easy", instruction=instruction,
                files={"access.log": "\n".join(lines) + "\n"}, oracle_commands=(cmd,), tests=tests,
                constants=dict(EXPECTED=expected), progress_tests=("test_report_exists", "test_report_format"))


def _replace_word(rng: random.Random) -> dict:
    old, new = words(rng, 2)
    decoy = f"{old}{rng.choice(['s', 'ing', 'wood', 'field'])}"
    docs, expected, keep = {}, {}, {}
    for i, stem in enumerate(words(rng, rng.randint(4, 6))):
        ext = ["md", "txt", "cfg", "md", "txt", "json"][i]
        sub = rng.choice(["", "notes/", "guide/"])
        lines = []
        for _ in range(rng.randint(3, 7)):
            toks = sentence(rng, rng.randint(4, 9)).split()
            for _ in range(rng.randint(0, 2)):
                toks.insert(rng.randrange(len(toks) + 1), rng.choice([old, old, decoy, old.capitalize(), f"({old})",
                                                                     f"{old},", f"{old}_id"]))
            lines.append(" ".join(toks))
        lines.append(f"see {old}.")
        text = "\n".join(lines) + "\n"
        rel = f"docs/{sub}{stem}.{ext}"
        docs[rel] = text
        if ext in ("md", "txt"):
            expected[rel] = re.sub(rf"\b{old}\b", new, text)
        else:
            keep[rel] = sha(text)
    instruction = f"""In every `.md` and `.txt` file under `/app/docs` (subdirectories included), replace each
whole-word occurrence of `{old}` with `{new}`.

Whole word means case-sensitive and not part of a longer word: the characters right before and after must not
be letters, digits or `_` (so `{decoy}`, `{old}_id` and `{old.capitalize()}` stay as they are, while `({old})` and
`{old},` change). Do not modify files with other extensions, and change nothing else."""
    script = f"""
import pathlib, re
for p in pathlib.Path("/app/docs").rglob("*"):
    if p.suffix in (".md", ".txt"):
        p.write_text(re.sub(r"\\b{old}\\b", "{new}", p.read_text()))
"""
    tests = r'''
def test_no_whole_word_left():
    for rel in EXPECTED:
        assert not re.search(r"\b" + OLD + r"\b", (APP / rel).read_text()), f"{rel} still has {OLD}"


def test_replacements_exact():
    for rel, text in EXPECTED.items():
        assert (APP / rel).read_text() == text, f"{rel} differs from the expected result"


def test_other_files_untouched():
    for rel, digest in KEEP.items():
        assert sha(APP / rel) == digest, f"{rel} must not change"


def test_new_word_present():
    assert all(re.search(r"\b" + NEW + r"\b", (APP / rel).read_text()) for rel in EXPECTED)
'''
    return dict(template="replace_word", difficulty="medium", instruction=instruction, files=docs,
                oracle_commands=(py_cmd(script),), tests=tests,
                constants=dict(EXPECTED=expected, KEEP=keep, OLD=old, NEW=new),
                progress_tests=("test_no_whole_word_left",))


EMAIL_RE = r"[A-Za-z0-9._+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+"


def _extract_emails(rng: random.Random) -> dict:
    domains = [f"{word(rng)}.{rng.choice(['com', 'org', 'net', 'io'])}" for _ in range(3)] + ["mail.example.co"]
    emails = []
    for _ in range(rng.randint(6, 10)):
        f, l = rng.choice(FIRST), rng.choice(LAST)
        local = rng.choice([f"{f}.{l}", f"{f}{rng.randint(1, 99)}", f"{f}+{word(rng)}", f"{f[0]}_{l}"])
        emails.append(f"{local}@{rng.choice(domains)}")
    out = []
    for _ in range(rng.randint(8, 14)):
        e = rng.choice(emails)
        e = e.upper() if rng.random() < 0.2 else (e.capitalize() if rng.random() < 0.3 else e)
        wrap = rng.choice(["{} ", "<{}> ", "({}), ", "{}. ", "mailto:{} ", "{};"])
        out.append(sentence(rng, rng.randint(2, 6)) + " " + wrap.format(e))
    out.append(f"not an address: {word(rng)}@localhost and @{word(rng)} or {word(rng)}@")
    text = "\n".join(out) + "\n"
    expected = sorted({m.lower() for m in re.findall(EMAIL_RE, text)})
    instruction = f"""Extract the email addresses from `/app/messages.txt`.

An email address is a maximal match of the regular expression `{EMAIL_RE}` (a local part, `@`, then at least
two dot-separated domain labels). Write every distinct address, converted to lower case, to `/app/emails.txt`,
one per line, sorted in byte order, without duplicates or other lines."""
    cmd = f"grep -oE '{EMAIL_RE.replace('(?:', '(')}' /app/messages.txt | tr 'A-Z' 'a-z' | LC_ALL=C sort -u > /app/emails.txt"
    tests = r'''
def test_emails_exists():
    assert (APP / "emails.txt").is_file()


def test_emails_format():
    lines = (APP / "emails.txt").read_text().splitlines()
    assert lines and all(l == l.lower() and "@" in l for l in lines), lines
    assert lines == sorted(set(lines)), "must be sorted and unique"


def test_emails_exact():
    assert (APP / "emails.txt").read_text().splitlines() == EXPECTED
'''
    return dict(template="extract_emails", difficulty="easy", instruction=instruction, files={"messages.txt": text},
                oracle_commands=(cmd,), tests=tests, constants=dict(EXPECTED=expected),
                progress_tests=("test_emails_exists", "test_emails_format"))


def _word_freq(rng: random.Random) -> dict:
    vocab = words(rng, rng.randint(15, 25))
    weights = [rng.randint(1, 12) for _ in vocab]
    lines = []
    for _ in range(rng.randint(15, 30)):
        toks = [rng.choices(vocab, weights)[0] for _ in range(rng.randint(4, 10))]
        toks = [t.capitalize() if rng.random() < 0.15 else t for t in toks]
        lines.append(" ".join(toks).replace(" ", rng.choice([" ", ", ", " - ", "; "]), 2) + rng.choice([".", "!", "?", ""]))
    text = "\n".join(lines) + "\n"
    k = rng.randint(3, 7)
    counts = collections.Counter(w.lower() for w in re.findall(r"[A-Za-z]+", text))
    expected = [f"{w} {n}" for w, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]
    instruction = f"""Find the {k} most frequent words in `/app/book.txt`.

A word is a maximal run of ASCII letters (`[A-Za-z]+`), compared case-insensitively (count `River` and `river`
as `river`). Write `/app/top.txt` with exactly {k} lines `<word> <count>` (word in lower case, single space),
most frequent first; break ties alphabetically."""
    script = f"""
import collections, re
c = collections.Counter(w.lower() for w in re.findall(r"[A-Za-z]+", open("/app/book.txt").read()))
top = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:{k}]
open("/app/top.txt", "w").write("".join(f"{{w}} {{n}}\\n" for w, n in top))
"""
    tests = r'''
def test_top_exists():
    assert (APP / "top.txt").is_file()


def test_top_format():
    lines = (APP / "top.txt").read_text().splitlines()
    assert len(lines) == len(EXPECTED) and all(re.fullmatch(r"[a-z]+ \d+", l) for l in lines), lines


def test_top_exact():
    assert (APP / "top.txt").read_text().splitlines() == EXPECTED
'''
    return dict(template="word_freq", difficulty="easy", instruction=instruction, files={"book.txt": text},
                oracle_commands=(py_cmd(script),), tests=tests, constants=dict(EXPECTED=expected),
                progress_tests=("test_top_exists", "test_top_format"))


def _ini_edit(rng: random.Random) -> dict:
    sections = words(rng, 4)
    body, values = [f"; configuration for {word(rng)} service", ""], {}
    for s in sections:
        body.append(f"[{s}]")
        for key in words(rng, rng.randint(3, 5)):
            v = str(rng.randint(1, 999)) if rng.random() < 0.5 else word(rng)
            values[(s, key)] = v
            body.append(f"{key} = {v}")
            if rng.random() < 0.3:
                body.append(f"# {sentence(rng, 4)}")
        body.append("")
    original = "\n".join(body)
    keys = list(values)
    set_s, set_k = rng.choice(keys)
    new_val = f"{word(rng)}{rng.randint(10, 99)}"
    add_s = rng.choice(sections)
    add_k = f"{word(rng, exclude=[k for s, k in keys if s == add_s])}_limit"
    add_v = str(rng.randint(100, 9999))
    del_s, del_k = rng.choice([k for k in keys if k != (set_s, set_k)])
    final = dict(values)
    final[(set_s, set_k)] = new_val
    final[(add_s, add_k)] = add_v
    del final[(del_s, del_k)]
    expected = {s: {k: v for (s2, k), v in final.items() if s2 == s} for s in sections}
    kept_lines = [l for l in body if l.strip() and l not in (f"{set_k} = {values[(set_s, set_k)]}",
                                                                f"{del_k} = {values[(del_s, del_k)]}")]
    instruction = f"""Edit the INI file `/app/config/app.ini` in place:

1. In section `[{set_s}]`, change the value of `{set_k}` to `{new_val}`.
2. In section `[{add_s}]`, add the key `{add_k}` with value `{add_v}` (write it as `{add_k} = {add_v}`).
3. In section `[{del_s}]`, remove the key `{del_k}` entirely.

Every other line (comments included) must stay, in its original order."""
    script = f"""
lines = open("/app/config/app.ini").read().split("\\n")
out, sec = [], None
for i, l in enumerate(lines):
    if l.startswith("["):
        sec = l.strip("[]")
    key = l.split(" = ")[0] if " = " in l else None
    if sec == "{set_s}" and key == "{set_k}":
        l = "{set_k} = {new_val}"
    if sec == "{del_s}" and key == "{del_k}":
        continue
    out.append(l)
    if sec == "{add_s}" and (i + 1 == len(lines) or lines[i + 1].startswith("[") or not lines[i + 1].strip()):
        if not any(x.startswith("{add_k} = ") for x in out):
            out.append("{add_k} = {add_v}")
open("/app/config/app.ini", "w").write("\\n".join(out))
"""
    tests = r'''
import configparser


def _parse():
    cp = configparser.ConfigParser(interpolation=None, comment_prefixes=(";", "#"))
    cp.optionxform = str
    cp.read_string((APP / "config" / "app.ini").read_text())
    return {s: dict(cp[s]) for s in cp.sections()}


def test_ini_parses():
    assert sorted(_parse()) == sorted(EXPECTED)


def test_value_changed():
    assert _parse()[SET[0]][SET[1]] == SET[2]


def test_key_added():
    assert _parse()[ADD[0]].get(ADD[1]) == ADD[2]


def test_key_removed():
    assert DEL[1] not in _parse()[DEL[0]]


def test_rest_preserved():
    assert _parse() == EXPECTED
    lines = [l for l in (APP / "config" / "app.ini").read_text().splitlines() if l.strip()]
    it = iter(lines)
    assert all(any(l == x for x in it) for l in KEPT_LINES), "other lines must stay in their original order"
'''
    return dict(template="ini_edit", difficulty="medium", instruction=instruction,
                files={"config/app.ini": original}, oracle_commands=(py_cmd(script),), tests=tests,
                constants=dict(EXPECTED=expected, SET=[set_s, set_k, new_val], ADD=[add_s, add_k, add_v],
                               DEL=[del_s, del_k], KEPT_LINES=kept_lines),
                progress_tests=("test_value_changed", "test_key_added", "test_key_removed"))


TEMPLATES = (_status_report, _replace_word, _extract_emails, _word_freq, _ini_edit)


def make(seed: int) -> TaskSpec:
    """Generate the text task for `seed` (template = seed mod number of templates)."""
    rng = rng_for(FAMILY, seed)
    fields = TEMPLATES[seed % len(TEMPLATES)](rng)
    return TaskSpec(family=FAMILY, seed=seed, setup=(), **fields)
