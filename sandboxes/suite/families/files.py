"""Family "files": file operations (sort by extension, find files, batch rename, de-duplicate)."""
from __future__ import annotations

import random

from sandboxes.suite.families.common import py_cmd, rng_for, sentence, sha, word, words
from sandboxes.suite.spec import TaskSpec

FAMILY = "files"


def _text(rng: random.Random) -> str:
    return "\n".join(sentence(rng, rng.randint(3, 9)) for _ in range(rng.randint(1, 6))) + "\n"


def _sort_by_extension(rng: random.Random) -> dict:
    exts = rng.sample(["txt", "csv", "log", "md", "json", "ini", "xml", "yaml"], rng.randint(3, 4))
    files, expected = {}, {}
    for i, stem in enumerate(words(rng, rng.randint(8, 13))):
        ext = exts[i % len(exts)]
        shown = ext.upper() if rng.random() < 0.25 else ext
        name = f"{stem}_{rng.randint(1, 99)}.{shown}"
        files[f"inbox/{name}"] = _text(rng)
        expected[f"sorted/{ext}/{name}"] = files[f"inbox/{name}"]
    instruction = f"""Organise the files in `/app/inbox` by extension.

Move every file in `/app/inbox` into `/app/sorted/<ext>/`, where `<ext>` is the part of the file name after the
last dot, in lower case (for example `/app/inbox/notes_3.TXT` goes to `/app/sorted/txt/notes_3.TXT`).
Keep file names and contents unchanged. Afterwards `/app/inbox` must still exist but be empty, and `/app/sorted`
must hold nothing except these moved files in these extension folders."""
    tests = r'''
def test_extension_dirs_exist():
    for ext in EXTS:
        assert (APP / "sorted" / ext).is_dir(), f"missing /app/sorted/{ext}"


def test_files_moved_with_content():
    for rel, content in EXPECTED.items():
        p = APP / rel
        assert p.is_file(), f"missing {p}"
        assert p.read_text() == content, f"content of {p} changed"


def test_inbox_empty():
    assert (APP / "inbox").is_dir(), "/app/inbox must still exist"
    assert list((APP / "inbox").iterdir()) == []


def test_nothing_extra():
    found = sorted(str(p.relative_to(APP)) for p in (APP / "sorted").rglob("*") if p.is_file())
    assert found == sorted(EXPECTED)
'''
    return dict(template="sort_by_extension", difficulty="easy", instruction=instruction, files=files,
                oracle_commands=('cd /app/inbox && for f in *; do e="${f##*.}"; e="${e,,}"; mkdir -p "/app/sorted/$e"; '
                                 'mv -- "$f" "/app/sorted/$e/"; done; cd /app',),
                tests=tests, constants=dict(EXTS=sorted(exts), EXPECTED=expected),
                progress_tests=("test_extension_dirs_exist", "test_inbox_empty"))


def _find_files(rng: random.Random) -> dict:
    dirs = ["", *(f"{a}/" for a in words(rng, 3)), f"{word(rng)}/{word(rng)}/"]
    by_size = rng.random() < 0.5
    token = f"ERR-{rng.randint(1000, 9999)}"
    threshold = rng.choice([300, 500, 800])
    files, match = {}, []
    for _ in range(rng.randint(12, 18)):
        ext = rng.choice(["log", "log", "txt", "dat"])
        rel = f"{rng.choice(dirs)}{word(rng)}{rng.randint(1, 9)}.{ext}"
        if rel in files:
            continue
        body = _text(rng) * rng.randint(1, 12)
        if not by_size and rng.random() < 0.45:
            lines = body.splitlines()
            lines.insert(rng.randrange(len(lines) + 1), f"{word(rng)} {token} {word(rng)}")
            body = "\n".join(lines) + "\n"
        files[f"data/{rel}"] = body
        hit = len(body.encode()) > threshold if by_size else (ext == "log" and token in body)
        if hit:
            match.append(rel)
    if not match:  # keep the task non-trivial: some but not all files match
        rel = f"{word(rng)}_extra.log"
        files[f"data/{rel}"] = f"x {token} y\n" + "z" * (threshold + 10) + "\n"
        match.append(rel)
    if len(match) == len(files):
        files[f"data/{word(rng)}_small.txt"] = "tiny\n"
    if by_size:
        crit = f"are larger than {threshold} bytes (strictly)"
        cmd = f"cd /app/data && find . -type f -size +{threshold}c | sed 's|^\\./||' | LC_ALL=C sort > /app/result.txt"
    else:
        crit = f"have the extension `.log` and contain the text `{token}`"
        cmd = f"cd /app/data && grep -rlF --include='*.log' '{token}' . | sed 's|^\\./||' | LC_ALL=C sort > /app/result.txt"
    instruction = f"""Find every file under `/app/data` (searching all subdirectories) that {crit}.

Write their paths relative to `/app/data` (for example `logs/app1.log`, no leading `./`) to `/app/result.txt`,
one per line, sorted in byte order (as `LC_ALL=C sort` does), with no other lines. Do not modify `/app/data`."""
    tests = r'''
def test_result_exists():
    assert (APP / "result.txt").is_file()


def test_result_format():
    lines = (APP / "result.txt").read_text().splitlines()
    assert lines and all(l and not l.startswith(("./", "/")) for l in lines), lines
    assert lines == sorted(set(lines), key=lambda s: s.encode()), "lines must be unique and byte-sorted"


def test_result_exact():
    assert (APP / "result.txt").read_text().splitlines() == sorted(MATCH, key=lambda s: s.encode())


def test_data_untouched():
    for rel, digest in FILES.items():
        assert sha(APP / rel) == digest, f"{rel} was modified"
'''
    return dict(template="find_files", difficulty="easy", instruction=instruction, files=files,
                oracle_commands=(cmd,), tests=tests, constants=dict(MATCH=sorted(set(match)), FILES={k: sha(v) for k, v in files.items()}),
                progress_tests=("test_result_exists", "test_result_format"))


def _batch_rename(rng: random.Random) -> dict:
    prefix = f"{word(rng)}-{rng.choice(['trip', 'event', 'shoot', 'album'])}"
    nums = sorted(rng.sample(range(1, 10000), rng.randint(5, 10)))
    files = {f"photos/IMG_{n:04d}.JPG": f"JPEGDATA {n} {word(rng)}\n" for n in nums}
    others = {f"photos/{word(rng)}.txt": _text(rng), "photos/README": "keep me\n"}
    files.update(others)
    expected = {f"photos/{prefix}-{i + 1:03d}.jpg": files[f"photos/IMG_{n:04d}.JPG"] for i, n in enumerate(nums)}
    instruction = f"""Rename the camera files in `/app/photos`.

Every file named `IMG_<number>.JPG` must be renamed to `{prefix}-<NNN>.jpg`, where `<NNN>` is the file's position
(starting at 1, zero-padded to 3 digits) when the files are ordered by their number, smallest first. So the
smallest-numbered image becomes `{prefix}-001.jpg`. Keep the contents unchanged and leave every other file in
`/app/photos` alone. No `IMG_*.JPG` file may remain."""
    tests = r'''
def test_renamed_files_exist():
    for rel in EXPECTED:
        assert (APP / rel).is_file(), f"missing {rel}"


def test_renamed_content_order():
    for rel, content in EXPECTED.items():
        assert (APP / rel).read_text() == content, f"{rel} holds the wrong image"


def test_no_originals_left():
    assert not list((APP / "photos").glob("IMG_*")), "IMG_ files remain"


def test_other_files_untouched():
    for rel, content in OTHERS.items():
        assert (APP / rel).read_text() == content
    names = sorted(p.name for p in (APP / "photos").iterdir())
    assert names == sorted([r.split("/")[-1] for r in EXPECTED] + [r.split("/")[-1] for r in OTHERS])
'''
    cmd = (f"cd /app/photos && i=0; for f in $(ls IMG_*.JPG | LC_ALL=C sort); do i=$((i+1)); "
           f"mv \"$f\" \"$(printf '{prefix}-%03d.jpg' $i)\"; done; cd /app")
    return dict(template="batch_rename", difficulty="easy", instruction=instruction, files=files,
                oracle_commands=(cmd,), tests=tests, constants=dict(EXPECTED=expected, OTHERS=others),
                progress_tests=("test_renamed_files_exist", "test_no_originals_left"))


def _dedupe(rng: random.Random) -> dict:
    dirs = ["", *(f"{d}/" for d in words(rng, 3))]
    uniques = [_text(rng) for _ in range(rng.randint(4, 7))]
    files, target = {}, len(uniques) + rng.randint(4, 7)
    while len(files) < target:
        files[f"store/{rng.choice(dirs)}{word(rng)}{rng.randint(1, 99)}.txt"] = rng.choice(uniques)
    for i, u in enumerate(uniques):  # every unique content appears at least once
        files.setdefault(f"store/unique{i}.txt", u)
    groups: dict[str, list[str]] = {}
    for rel in sorted(files, key=lambda s: s.encode()):
        groups.setdefault(files[rel], []).append(rel[len("store/"):])
    kept = sorted(g[0] for g in groups.values())
    removed = sorted((r for g in groups.values() for r in g[1:]), key=lambda s: s.encode())
    if not removed:
        raise AssertionError("dedupe generator produced no duplicates")
    instruction = """Remove duplicate files from `/app/store` (all subdirectories included).

Files are duplicates when their contents are byte-identical. From each group of duplicates keep only the file
whose path relative to `/app/store` sorts first in byte order, and delete the others. Write the deleted paths,
relative to `/app/store` (no leading `./`), to `/app/removed.txt`, one per line, byte-sorted. Files without a
duplicate stay untouched."""
    script = r"""
import hashlib, os
root = "/app/store"
paths = sorted((os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs), key=str.encode)
seen, removed = set(), []
for p in paths:
    h = hashlib.sha256(open(os.path.join(root, p), "rb").read()).hexdigest()
    if h in seen:
        os.remove(os.path.join(root, p)); removed.append(p)
    seen.add(h)
open("/app/removed.txt", "w").write("".join(r + "\n" for r in removed))
"""
    tests = r'''
def test_removed_list_exists():
    assert (APP / "removed.txt").is_file()


def test_removed_list_exact():
    assert (APP / "removed.txt").read_text().splitlines() == REMOVED


def test_duplicates_deleted():
    left = [r for r in REMOVED if (APP / "store" / r).exists()]
    assert not left, f"still present: {left}"


def test_kept_files_intact():
    for rel in KEPT:
        assert sha(APP / "store" / rel) == FILES["store/" + rel], rel
    found = sorted(str(p.relative_to(APP / "store")) for p in (APP / "store").rglob("*") if p.is_file())
    assert found == sorted(KEPT)
'''
    return dict(template="dedupe", difficulty="medium", instruction=instruction, files=files,
                oracle_commands=(py_cmd(script),), tests=tests,
                constants=dict(REMOVED=removed, KEPT=kept, FILES={k: sha(v) for k, v in files.items()}),
                progress_tests=("test_removed_list_exists", "test_duplicates_deleted"))


TEMPLATES = (_sort_by_extension, _find_files, _batch_rename, _dedupe)


def make(seed: int) -> TaskSpec:
    """Generate the files task for `seed` (template = seed mod number of templates)."""
    rng = rng_for(FAMILY, seed)
    fields = TEMPLATES[seed % len(TEMPLATES)](rng)
    return TaskSpec(family=FAMILY, seed=seed, setup=(), **fields)
