"""Family "archives": tar, gzip and zip (extract and search, create with exclusions, convert zip to tar.gz,
unpack nested archives, compress logs). Archives are built byte-deterministically here (fixed times, owners)."""
from __future__ import annotations

import gzip
import io
import random
import tarfile
import zipfile

from sandboxes.suite.families.common import rng_for, sentence, sha, word, words
from sandboxes.suite.spec import TaskSpec

FAMILY = "archives"
_MTIME = 1_700_000_000


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), _MTIME, 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=6, mtime=0)


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in sorted(files.items()):
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.external_attr, info.compress_type = 0o644 << 16, zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return buf.getvalue()


def _tree(rng: random.Random, root: str, n: int) -> dict[str, bytes]:
    subdirs = ["", *(f"{d}/" for d in words(rng, 3))]
    out = {}
    while len(out) < n:
        out[f"{root}{rng.choice(subdirs)}{word(rng)}{rng.randint(1, 9)}.{rng.choice(['txt', 'md', 'cfg'])}"] = (
            sentence(rng, rng.randint(5, 15)) + "\n").encode()
    return out


_TAR_READ = r'''
def _members(path):
    with tarfile.open(path, "r:gz") as tf:
        return {m.name[2:] if m.name.startswith("./") else m.name: tf.extractfile(m).read()
                for m in tf.getmembers() if m.isfile()}
'''


def _extract_find(rng: random.Random) -> dict:
    top = f"{word(rng)}-{rng.randint(1, 9)}.{rng.randint(0, 9)}/"
    tree = _tree(rng, top, rng.randint(8, 14))
    token = f"TICKET-{rng.randint(10000, 99999)}"
    target = rng.choice(sorted(tree))
    tree[target] = tree[target].rstrip(b"\n") + f" {token}\n".encode()
    name = f"{word(rng)}-bundle.tar.gz"
    instruction = f"""Extract the archive `/app/incoming/{name}` into the directory `/app/extracted` (create it), so that
each archive member `<path>` ends up at `/app/extracted/<path>`.

Then find the one extracted file that contains the text `{token}` and write its path relative to
`/app/extracted` (for example `{top}notes.txt`) to `/app/answer.txt` as a single line."""
    cmds = (f"mkdir -p /app/extracted && tar -xzf /app/incoming/{name} -C /app/extracted",
            f"cd /app/extracted && grep -rlF '{token}' . | sed 's|^\\./||' > /app/answer.txt")
    tests = r'''
def test_extracted_dir():
    assert (APP / "extracted").is_dir()


def test_all_files_extracted():
    for rel, digest in DIGESTS.items():
        p = APP / "extracted" / rel
        assert p.is_file() and sha(p) == digest, rel


def test_answer_exact():
    assert (APP / "answer.txt").read_text().strip() == TARGET
'''
    return dict(template="extract_find", difficulty="easy", instruction=instruction,
                files={f"incoming/{name}": _gz(_tar(tree))}, oracle_commands=cmds, tests=tests,
                constants=dict(DIGESTS={k: sha(v) for k, v in tree.items()}, TARGET=target),
                progress_tests=("test_extracted_dir", "test_all_files_extracted"))


def _create_backup(rng: random.Random) -> dict:
    project = word(rng)
    tree = _tree(rng, f"{project}/", rng.randint(6, 10))
    keep = dict(tree)
    extra = {f"{project}/{word(rng)}.log": b"log line\n", f"{project}/src/__pycache__/{word(rng)}.cpython-311.pyc": b"\x00pyc",
             f"{project}/{word(rng)}/debug.log": b"debug\n", f"{project}/__pycache__/x.pyc": b"\x00"}
    tree.update(extra)
    instruction = f"""Create a gzip-compressed tar archive `/app/backup.tar.gz` of the directory `/app/{project}`.

Member names must start with `{project}/` (for example `{project}/README.md`; a leading `./` is tolerated).
Exclude every file ending in `.log` and every `__pycache__` directory (with its contents), at any depth.
All other files must be included with their contents unchanged. Do not modify `/app/{project}`."""
    cmds = (f"cd /app && tar -czf backup.tar.gz --exclude='*.log' --exclude='__pycache__' {project}",)
    tests = _TAR_READ + r'''

def test_backup_is_tar_gz():
    assert tarfile.is_tarfile(APP / "backup.tar.gz")
    with gzip.open(APP / "backup.tar.gz") as f:
        f.read(1)


def test_included_files():
    assert sorted(_members(APP / "backup.tar.gz")) == sorted(KEEP)


def test_no_excluded_files():
    names = _members(APP / "backup.tar.gz")
    assert not [n for n in names if n.endswith(".log") or "__pycache__" in n]


def test_contents_match():
    got = _members(APP / "backup.tar.gz")
    for rel, digest in KEEP.items():
        assert rel in got and hashlib.sha256(got[rel]).hexdigest() == digest, rel
'''
    return dict(template="create_backup", difficulty="medium", instruction=instruction, files=tree,
                oracle_commands=cmds, tests=tests, constants=dict(KEEP={k: sha(v) for k, v in keep.items()}),
                progress_tests=("test_backup_is_tar_gz",))


def _zip_to_tar(rng: random.Random) -> dict:
    name = f"{word(rng)}-assets"
    tree = _tree(rng, "", rng.randint(5, 9))
    tree[f"{word(rng)}.bin"] = bytes(rng.randrange(256) for _ in range(rng.randint(50, 300)))
    instruction = f"""Convert the zip archive `/app/in/{name}.zip` into a gzip-compressed tar archive `/app/out/{name}.tar.gz`
(create `/app/out`). The tar archive must contain exactly the same files, under exactly the same member names as in
the zip (for example `docs/a.txt`, no extra top-level directory; a leading `./` is tolerated), with identical bytes.
`unzip` may not be installed; Python's `zipfile` module is."""
    cmds = (f"mkdir -p /tmp/conv /app/out && python3 -m zipfile -e /app/in/{name}.zip /tmp/conv",
            f"cd /tmp/conv && tar -czf /app/out/{name}.tar.gz * && cd /app")
    tests = _TAR_READ + r'''

def test_tar_exists():
    assert tarfile.is_tarfile(APP / "out" / f"{NAME}.tar.gz")


def test_same_names():
    assert sorted(_members(APP / "out" / f"{NAME}.tar.gz")) == sorted(DIGESTS)


def test_same_bytes():
    got = _members(APP / "out" / f"{NAME}.tar.gz")
    for rel, digest in DIGESTS.items():
        assert rel in got and hashlib.sha256(got[rel]).hexdigest() == digest, rel
'''
    return dict(template="zip_to_tar", difficulty="medium", instruction=instruction,
                files={f"in/{name}.zip": _zip(tree)}, oracle_commands=cmds, tests=tests,
                constants=dict(NAME=name, DIGESTS={k: sha(v) for k, v in tree.items()}),
                progress_tests=("test_tar_exists",))


def _nested(rng: random.Random) -> dict:
    key = f"KEY-{rng.randint(10 ** 7, 10 ** 8)}-{word(rng).upper()}\n"
    vault = f"{word(rng)}/{word(rng)}"
    inner = _tree(rng, "", rng.randint(2, 4))
    inner[f"{vault}/key.txt.gz"] = _gz(key.encode())
    inner[f"{vault}/key.txt.bak"] = b"KEY-00000000-OLD\n"
    layer = f"{word(rng)}-layer.tar.gz"
    outer = _tree(rng, "", rng.randint(2, 4))
    outer[layer] = _gz(_tar(inner))
    name = word(rng)
    data = _tar(outer)
    instruction = f"""The archive `/app/drop/{name}.tar` contains nested archives. Somewhere inside there is exactly one
gzip-compressed file named `key.txt.gz`. Write its decompressed content to `/app/key.txt` (byte-identical, including
the trailing newline). Do not modify `/app/drop`."""
    cmds = (f"mkdir -p /tmp/n1 /tmp/n2 && tar -xf /app/drop/{name}.tar -C /tmp/n1",
            f"tar -xzf /tmp/n1/{layer} -C /tmp/n2", f"gunzip -c /tmp/n2/{vault}/key.txt.gz > /app/key.txt")
    tests = r'''
def test_key_exists():
    assert (APP / "key.txt").is_file()


def test_key_exact():
    assert (APP / "key.txt").read_text() == KEY


def test_drop_untouched():
    assert sorted(p.name for p in (APP / "drop").iterdir()) == [f"{NAME}.tar"]
    assert sha(APP / "drop" / f"{NAME}.tar") == DIGEST
'''
    return dict(template="nested", difficulty="medium", instruction=instruction,
                files={f"drop/{name}.tar": data}, oracle_commands=cmds, tests=tests,
                constants=dict(KEY=key, NAME=name, DIGEST=sha(data)), progress_tests=("test_key_exists",))


def _gzip_logs(rng: random.Random) -> dict:
    logs = {f"logs/{w}.log": (sentence(rng, 8) + "\n") * rng.randint(1, 20) for w in words(rng, rng.randint(3, 6))}
    current = "\n".join(sentence(rng, 5) for _ in range(3)) + "\n"
    others = {"logs/current.log": current, f"logs/{word(rng)}.txt": sentence(rng, 4) + "\n"}
    instruction = """Compress the old logs in `/app/logs`: every `*.log` file there except `current.log` must be replaced
by a gzip file of the same name plus `.gz` (for example `app.log` becomes `app.log.gz`, and `app.log` no longer
exists), whose decompressed content equals the original. Leave `current.log` and all non-`.log` files untouched."""
    cmds = ('cd /app/logs && for f in *.log; do [ "$f" = current.log ] || gzip "$f"; done; cd /app',)
    tests = r'''
def test_gz_files_exist():
    for rel in OLD:
        assert (APP / (rel + ".gz")).is_file(), rel + ".gz"


def test_gz_content():
    for rel, digest in OLD.items():
        with gzip.open(APP / (rel + ".gz")) as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, rel


def test_originals_removed():
    assert not [rel for rel in OLD if (APP / rel).exists()]


def test_others_untouched():
    for rel, digest in OTHERS.items():
        assert sha(APP / rel) == digest, rel
    assert not (APP / "logs" / "current.log.gz").exists()
'''
    return dict(template="gzip_logs", difficulty="easy", instruction=instruction, files={**logs, **others},
                oracle_commands=cmds, tests=tests,
                constants=dict(OLD={k: sha(v) for k, v in logs.items()}, OTHERS={k: sha(v) for k, v in others.items()}),
                progress_tests=("test_gz_files_exist", "test_originals_removed"))


TEMPLATES = (_extract_find, _create_backup, _zip_to_tar, _nested, _gzip_logs)


def make(seed: int) -> TaskSpec:
    """Generate the archives task for `seed` (template = seed mod number of templates)."""
    rng = rng_for(FAMILY, seed)
    fields = TEMPLATES[seed % len(TEMPLATES)](rng)
    return TaskSpec(family=FAMILY, seed=seed, setup=(), **fields)
