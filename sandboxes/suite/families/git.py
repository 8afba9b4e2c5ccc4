"""Family "git": repository tasks (find a commit, feature branch, revert, merge with conflicts, untrack, tag).

Each repository is built at environment set-up by RUN lines in /app/repo on branch main, with fixed author
dates so the history (and its hashes) is the same every time."""
from __future__ import annotations

import random
import shlex

from sandboxes.suite.families.common import FIRST, LAST, rng_for, sentence, sha, word, words, write_cmd
from sandboxes.suite.spec import TaskSpec

FAMILY = "git"
ENV = {"GIT_AUTHOR_NAME": "Agent", "GIT_AUTHOR_EMAIL": "agent@example.com", "GIT_COMMITTER_NAME": "Agent",
       "GIT_COMMITTER_EMAIL": "agent@example.com", "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory",
       "GIT_CONFIG_VALUE_0": "*"}


class _Repo:
    """Records set-up commands that build a history; tracks the files on the current branch."""

    def __init__(self, rng: random.Random):
        self.rng, self.cmds, self.n, self.tree, self.messages = rng, ["git init -q -b main repo"], 0, {}, []

    def commit(self, message: str, changes: dict[str, str], author: str | None = None) -> None:
        parts = ["cd repo"]
        for path, text in sorted(changes.items()):
            if "/" in path:
                parts.append(f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])}")
            parts.append(write_cmd(path, text))
        self.n += 1
        date = f"2024-01-{1 + self.n // 24:02d}T{self.n % 24:02d}:00:00Z"
        who = author or f"{self.rng.choice(FIRST).capitalize()} {self.rng.choice(LAST).capitalize()}"
        parts.append(f"git add -A && GIT_AUTHOR_NAME={shlex.quote(who)} GIT_AUTHOR_DATE={date} "
                     f"GIT_COMMITTER_DATE={date} git commit -q -m {shlex.quote(message)}")
        self.cmds.append(" && ".join(parts))
        self.tree.update(changes)
        self.messages.append(message)

    def run(self, cmd: str) -> None:
        self.cmds.append(f"cd repo && {cmd}")

    def filler(self, k: int) -> None:
        """k ordinary commits that add or extend source files."""
        for _ in range(k):
            path = self.rng.choice([p for p in self.tree if p.startswith("src/") and p.endswith(".py")] + [f"src/{word(self.rng)}.py"])
            text = self.tree.get(path, "") + f"def {word(self.rng)}_{self.rng.randint(1, 99)}():\n    return {self.rng.randint(0, 999)}\n"
            self.commit(f"{self.rng.choice(['Add', 'Update', 'Refactor', 'Tweak'])} {path.split('/')[-1][:-3]} helpers",
                        {path: text})


def _start(rng: random.Random) -> _Repo:
    repo = _Repo(rng)
    repo.commit("Initial commit", {"README.md": f"# {word(rng)}-{word(rng)}\n\n{sentence(rng, 8)}\n",
                                   f"src/{word(rng)}.py": "import sys\n"})
    return repo


def _spec(repo: _Repo, **fields) -> dict:
    return dict(setup=tuple(repo.cmds), env=ENV, **fields)


def _find_commit(rng: random.Random) -> dict:
    repo = _start(rng)
    repo.filler(rng.randint(2, 4))
    target = f"src/{word(rng)}_settings.py"
    line = f"MAX_{word(rng).upper()}_RETRIES = {rng.randint(2, 19)}"
    author = f"{rng.choice(FIRST).capitalize()} {rng.choice(LAST).capitalize()}"
    msg = f"Tune {word(rng)} behaviour"
    repo.commit(f"Add {target.split('/')[-1][:-3]}", {target: "DEBUG = False\n"})
    repo.filler(rng.randint(0, 2))
    repo.commit(msg, {target: repo.tree[target] + line + "\n"}, author=author)
    repo.filler(rng.randint(2, 4))
    instruction = f"""The git repository `/app/repo` has a line `{line}` in `{target}`.

Find the commit that added this line. Write `/app/answer.txt` with exactly two lines: the commit's full 40-character
hash, then its author's name (as git records it). Do not change the repository."""
    tests = r'''
def _lines():
    return (APP / "answer.txt").read_text().splitlines()


def test_answer_exists():
    assert (APP / "answer.txt").is_file()


def test_answer_format():
    lines = _lines()
    assert len(lines) == 2 and re.fullmatch(r"[0-9a-f]{40}", lines[0].strip()), lines


def test_hash_right():
    want = git("log", "--reverse", "--format=%H", "-S", LINE, "--", TARGET).splitlines()[0]
    assert git("log", "-1", "--format=%s", want) == MESSAGE
    assert _lines()[0].strip() == want


def test_author_right():
    assert _lines()[1].strip() == AUTHOR
'''
    cmd = (f"cd /app/repo && h=$(git log --reverse --format=%H -S {shlex.quote(line)} -- {target} | head -1) && "
           f"git log -1 --format='%H%n%an' $h > /app/answer.txt")
    return _spec(repo, template="find_commit", difficulty="medium", instruction=instruction,
                 oracle_commands=(cmd,), tests=tests,
                 constants=dict(LINE=line, TARGET=target, MESSAGE=msg, AUTHOR=author),
                 progress_tests=("test_answer_exists", "test_answer_format"))


def _feature_branch(rng: random.Random) -> dict:
    repo = _start(rng)
    repo.filler(rng.randint(2, 5))
    branch = f"feature/{word(rng)}-{word(rng)}"
    path = f"docs/{word(rng)}.md"
    content = f"# {word(rng).capitalize()}\n\n{sentence(rng, 9)}\n"
    msg = f"Document the {word(rng)} workflow"
    instruction = f"""In the git repository `/app/repo`, create a branch `{branch}` starting at the current tip of
`main`. On that branch, add the file `{path}` with exactly this content:

```
{content}```

and commit it as a single commit with the message `{msg}`. `main` itself must not change (leave it at its
current commit, without this file)."""
    cmd = (f"cd /app/repo && git checkout -q -b {branch} && mkdir -p docs && {write_cmd(path, content)} && "
           f"git add {path} && git commit -q -m {shlex.quote(msg)} && git checkout -q main")
    tests = r'''
def test_branch_exists():
    git("rev-parse", "--verify", "refs/heads/" + BRANCH)


def test_branch_commit():
    assert git("log", "-1", "--format=%s", BRANCH) == MESSAGE
    assert git("rev-parse", BRANCH + "^") == git("rev-parse", "main"), "branch must be one commit on top of main"


def test_file_on_branch():
    assert git("show", f"{BRANCH}:{PATH}") + "\n" == CONTENT


def test_main_unchanged():
    assert int(git("rev-list", "--count", "main")) == N_COMMITS
    assert git("log", "-1", "--format=%s", "main") == LAST_MESSAGE
    assert PATH not in git("ls-tree", "-r", "--name-only", "main").splitlines()
'''
    return _spec(repo, template="feature_branch", difficulty="easy", instruction=instruction,
                 oracle_commands=(cmd,), tests=tests,
                 constants=dict(BRANCH=branch, PATH=path, CONTENT=content, MESSAGE=msg, N_COMMITS=repo.n,
                                LAST_MESSAGE=repo.messages[-1]),
                 progress_tests=("test_branch_exists", "test_file_on_branch"))


def _settings(rng: random.Random) -> dict[str, str]:
    return {k: str(rng.randint(1, 500)) for k in words(rng, rng.randint(4, 6))}


def _ini(values: dict[str, str]) -> str:
    return "[service]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())


def _revert_commit(rng: random.Random) -> dict:
    repo = _start(rng)
    conf = _settings(rng)
    repo.commit("Add service settings", {"config/service.ini": _ini(conf)})
    repo.filler(rng.randint(1, 3))
    good = repo.tree["config/service.ini"]
    key = rng.choice(list(conf))
    broken = dict(conf, **{key: str(int(conf[key]) * 100 + 7)}, debug_mode="on")
    bad_msg = f"Experiment with {key} and {word(rng)}"
    notes = f"notes/{word(rng)}.txt"
    repo.commit(bad_msg, {"config/service.ini": _ini(broken), notes: sentence(rng, 6) + "\n"})
    repo.filler(rng.randint(2, 4))
    later = {p: t for p, t in repo.tree.items() if p.startswith("src/")}
    instruction = f"""A commit in the git repository `/app/repo` with the message `{bad_msg}` broke the service.

Undo it on `main` by adding exactly one new commit on top of the current history that reverses every change it
made (files it added must disappear, lines it changed must return to their previous values). Do not rewrite or
drop existing commits, keep every change made by later commits, and leave a clean working tree."""
    cmd = f"cd /app/repo && git revert --no-edit $(git log --format=%H --grep={shlex.quote('^' + bad_msg + '$')})"
    tests = r'''
def test_one_new_commit():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert int(git("rev-list", "--count", "main")) == len(MESSAGES) + 1
    old = git("log", "--reverse", "--format=%s", "main~1").splitlines()
    assert old == MESSAGES, "existing history was rewritten"


def test_settings_restored():
    assert (APP / "repo" / "config" / "service.ini").read_text() == GOOD
    assert not (APP / "repo" / NOTES).exists()


def test_later_changes_kept():
    for rel, text in LATER.items():
        assert (APP / "repo" / rel).read_text() == text, rel


def test_committed_and_clean():
    assert git("show", "main:config/service.ini") + "\n" == GOOD
    assert git("status", "--porcelain") == ""
'''
    return _spec(repo, template="revert_commit", difficulty="medium", instruction=instruction,
                 oracle_commands=(cmd,), tests=tests,
                 constants=dict(MESSAGES=list(repo.messages), GOOD=good, NOTES=notes, LATER=later),
                 progress_tests=("test_settings_restored",))


def _merge_theirs(rng: random.Random) -> dict:
    repo = _start(rng)
    conf = _settings(rng)
    repo.commit("Add service settings", {"config/service.ini": _ini(conf)})
    repo.filler(rng.randint(1, 2))
    key = rng.choice(list(conf))
    topic = f"{word(rng)}-tuning"
    repo.run(f"git checkout -q -b {topic}")
    topic_conf = dict(conf, **{key: str(int(conf[key]) + rng.randint(1, 50))})
    topic_file = f"docs/{word(rng)}.md"
    topic_text = f"# {sentence(rng, 3)}\n"
    repo.commit(f"Tune {key}", {"config/service.ini": _ini(topic_conf)})
    repo.commit("Document tuning", {topic_file: topic_text})
    repo.run("git checkout -q main")
    main_conf = dict(conf, **{key: str(int(conf[key]) + 1000)})
    main_file = f"src/{word(rng)}_main.py"
    main_text = f"VALUE = {rng.randint(1, 99)}\n"
    repo.commit(f"Raise {key}", {"config/service.ini": _ini(main_conf), main_file: main_text})
    expected = _ini(topic_conf)
    instruction = f"""In the git repository `/app/repo`, merge the branch `{topic}` into `main` with a merge commit
(HEAD on `main`, two parents). The branches conflict in `config/service.ini`: wherever both changed the same
lines, keep the version from `{topic}`. All other changes from both branches must be kept. Commit the merge and
leave a clean working tree with no conflict markers."""
    cmd = f"cd /app/repo && git merge --no-ff -X theirs {topic} -m 'Merge branch {topic}'"
    tests = r'''
def test_merge_commit():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    parents = git("log", "-1", "--format=%P", "main").split()
    assert len(parents) == 2, "HEAD must be a merge commit"
    assert git("rev-parse", TOPIC) in parents


def test_conflict_resolved():
    text = (APP / "repo" / "config" / "service.ini").read_text()
    assert "<<<<<<<" not in text and ">>>>>>>" not in text
    assert text == EXPECTED


def test_both_sides_kept():
    for rel, text in KEEP.items():
        assert (APP / "repo" / rel).read_text() == text, rel


def test_clean_tree():
    assert git("status", "--porcelain") == ""
    assert git("show", "main:config/service.ini") + "\n" == EXPECTED
'''
    return _spec(repo, template="merge_theirs", difficulty="hard", instruction=instruction,
                 oracle_commands=(cmd,), tests=tests,
                 constants=dict(TOPIC=topic, EXPECTED=expected, KEEP={topic_file: topic_text, main_file: main_text}),
                 progress_tests=("test_conflict_resolved", "test_both_sides_kept"))


def _untrack(rng: random.Random) -> dict:
    repo = _start(rng)
    repo.filler(rng.randint(1, 3))
    junk = {f"build/{word(rng)}.o": f"obj {word(rng)}\n", f"build/lib/{word(rng)}.so": "so\n",
            f"{word(rng)}.log": f"{sentence(rng, 5)}\n", f"logs/{word(rng)}.log": "started\n",
            f"src/{word(rng)}_trace.log": "trace\n"}
    repo.commit("Add build output", junk)
    repo.filler(1)
    tracked = sorted(p for p in repo.tree if p not in junk)
    instruction = """The git repository `/app/repo` wrongly tracks build output and log files.

Stop tracking everything under `build/` and every `*.log` file (in any directory), but keep these files on disk.
Add a `.gitignore` at the repository root so that anything under `build/` and any file ending in `.log`, at any
depth, is ignored from now on. Commit all of this as one new commit on `main`, leaving a clean working tree.
Every other file must stay tracked."""
    cmd = ("cd /app/repo && git rm -r -q --cached build && git ls-files -z '*.log' | xargs -0 git rm -q --cached && "
           "printf '%s\\n' 'build/' '*.log' > .gitignore && git add .gitignore && "
           "git commit -q -m 'Stop tracking build output and logs'")
    tests = r'''
def test_not_tracked():
    files = git("ls-files").splitlines()
    bad = [f for f in files if f.startswith("build/") or f.endswith(".log")]
    assert not bad, f"still tracked: {bad}"


def test_kept_on_disk():
    for rel, digest in JUNK.items():
        assert sha(APP / "repo" / rel) == digest, rel


def test_ignore_rules():
    def ignored(p):
        return run(["git", "-c", "safe.directory=*", "check-ignore", "-q", "--no-index", p], cwd="/app/repo").returncode == 0
    assert ignored("build/new.o") and ignored("build/x/y.bin")
    assert ignored("new.log") and ignored("deep/er/new.log")
    assert not ignored("src/new.py") and not ignored("logfile.txt")


def test_committed_clean():
    assert int(git("rev-list", "--count", "main")) == N_COMMITS + 1
    files = git("ls-files").splitlines()
    assert ".gitignore" in files and all(t in files for t in TRACKED)
    assert git("status", "--porcelain") == ""
'''
    return _spec(repo, template="untrack_ignored", difficulty="medium", instruction=instruction,
                 oracle_commands=(cmd,), tests=tests,
                 constants=dict(JUNK={k: sha(v) for k, v in junk.items()}, TRACKED=tracked, N_COMMITS=repo.n),
                 progress_tests=("test_not_tracked", "test_ignore_rules"))


def _tag_release(rng: random.Random) -> dict:
    repo = _start(rng)
    repo.filler(rng.randint(1, 3))
    version = f"{rng.randint(0, 4)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}"
    msg = f"Bump version to {version}"
    repo.commit(msg, {"VERSION": version + "\n"})
    repo.filler(rng.randint(1, 3))
    tag = f"v{version}"
    instruction = f"""In the git repository `/app/repo`, create an annotated tag `{tag}` on the commit whose message
is `{msg}` (not on the latest commit). The tag message must be `Release {version}`. Do not add or change commits."""
    cmd = (f"cd /app/repo && git tag -a {tag} -m 'Release {version}' "
           f"$(git log --format=%H --grep={shlex.quote('^' + msg + '$')})")
    tests = r'''
def test_tag_exists():
    git("rev-parse", "--verify", "refs/tags/" + TAG)


def test_tag_annotated():
    assert git("cat-file", "-t", TAG) == "tag"
    assert git("tag", "-l", "--format=%(contents:subject)", TAG) == "Release " + VERSION


def test_tag_target():
    assert git("log", "-1", "--format=%s", TAG + "^{commit}") == MESSAGE


def test_history_unchanged():
    assert git("log", "--reverse", "--format=%s", "main").splitlines() == MESSAGES
'''
    return _spec(repo, template="tag_release", difficulty="easy", instruction=instruction,
                 oracle_commands=(cmd,), tests=tests,
                 constants=dict(TAG=tag, VERSION=version, MESSAGE=msg, MESSAGES=list(repo.messages)),
                 progress_tests=("test_tag_exists",))


TEMPLATES = (_find_commit, _feature_branch, _revert_commit, _merge_theirs, _untrack, _tag_release)


def make(seed: int) -> TaskSpec:
    """Generate the git task for `seed` (template = seed mod number of templates)."""
    rng = rng_for(FAMILY, seed)
    fields = TEMPLATES[seed % len(TEMPLATES)](rng)
    return TaskSpec(family=FAMILY, seed=seed, files={}, **fields)
