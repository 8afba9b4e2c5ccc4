"""Deterministic leak scan: does a text reveal the verifier or the ready solution?

Three checks, each finding naming what leaked and from where:
- n-gram overlap: any run of `n` consecutive words shared with a file under tests/ or
  solution/ (word = maximal run of letters, digits, `_`), unless that run is public, i.e. also
  occurs in the instruction or in the task's environment files;
- verifier paths: `/tests`, `/logs/verifier`, `reward.txt`, `reward.json`, `test_outputs.py`,
  `solve.sh`, `/solution`;
- expected outputs: string literals of the test files (at least `min_literal` characters) that
  the instruction and the environment do not already contain.
It always runs before any model critic, and `sft_data` runs it again on every training example.
"""
from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

VERIFIER_PATTERNS = (
    r"(?<![\w.])/tests\b", r"/logs/verifier", r"\breward\.txt\b", r"\breward\.json\b", r"\btest_outputs\.py\b",
    r"\bsolve\.sh\b", r"(?<![\w.])/solution\b",
)
_WORD = re.compile(r"\w+")
_MAX_FILE_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class Finding:
    kind: str  # "ngram" | "verifier_path" | "expected_output"
    source: str  # file the leaked text comes from ("verifier" for paths)
    span: str  # the leaked text as it appears in the scanned text (for revision)

    @property
    def reason(self) -> str:
        what = {"ngram": "quotes", "verifier_path": "names the verifier path",
                "expected_output": "states an expected output from"}[self.kind]
        if self.kind == "verifier_path":
            return f"{what} {self.span!r}"
        return f"{what} {self.source}: {self.span[:120]!r}"


def _read_tree(root: Path | None, exclude: tuple[Path, ...] = ()) -> dict[str, str]:
    """relative path -> text for every regular file under `root` except those under `exclude`
    (binary files decoded leniently)."""
    out: dict[str, str] = {}
    if root is None or not root.exists():
        return out
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    for p in files:
        if any(p.resolve() == e or e in p.resolve().parents for e in exclude):
            continue
        with open(p, "rb") as f:
            data = f.read(_MAX_FILE_BYTES)
        rel = p.name if root.is_file() else str(p.relative_to(root))
        out[rel] = data.decode("utf-8", errors="replace")
    return out


def _string_literals(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append(node.value)
        elif isinstance(node, ast.Dict):  # keys of EXPECTED-style tables are outputs too
            found.extend(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return found


class LeakScanner:
    """Built once per task from its folder; `scan(text)` returns the findings (empty = clean)."""

    def __init__(self, task, n: int = 8, min_literal: int = 8):
        self.n, self.min_literal = n, min_literal
        sol_root = Path(task.solution_path).resolve().parent if task.solution_path else None
        if sol_root is not None and sol_root == Path(task.path).resolve():  # TB1: solution.sh beside task.yaml
            sol_root = Path(task.solution_path).resolve()
        private_paths = tuple(p.resolve() for p in (Path(task.tests_dir), Path(task.test_script), sol_root) if p)
        public = [task.instruction]
        env = task.environment
        if env.context_dir:  # TB1 builds from the task root, which also holds tests and solution
            public += _read_tree(Path(env.context_dir), exclude=private_paths).values()
        self.public_text = "\n".join(public)
        public_ngrams = self._ngrams(self.public_text)
        tests = {f"tests/{k}": v for k, v in _read_tree(Path(task.tests_dir)).items()}
        solution = {f"solution/{k}": v for k, v in _read_tree(sol_root).items()}
        self.private: dict[tuple[str, ...], str] = {}  # n-gram -> file it comes from
        for name, text in {**tests, **solution}.items():
            for g in self._ngrams(text) - public_ngrams:
                self.private.setdefault(g, name)
        self.literals: dict[str, str] = {}
        for name, text in tests.items():
            if not name.endswith(".py"):
                continue
            for lit in _string_literals(text):
                lit = lit.strip()
                if len(lit) >= min_literal and _WORD.search(lit) and lit not in self.public_text:
                    self.literals.setdefault(lit, name)

    def _ngrams(self, text: str) -> set[tuple[str, ...]]:
        words = [w.lower() for w in _WORD.findall(text)]
        return {tuple(words[i:i + self.n]) for i in range(len(words) - self.n + 1)}

    def scan(self, text: str) -> list[Finding]:
        findings: list[Finding] = []
        for pattern in VERIFIER_PATTERNS:
            for m in re.finditer(pattern, text):
                findings.append(Finding("verifier_path", "verifier", m.group(0)))
        matches = list(_WORD.finditer(text))
        words = [m.group(0).lower() for m in matches]
        i = 0
        while i <= len(words) - self.n:
            source = self.private.get(tuple(words[i:i + self.n]))
            if source is None:
                i += 1
                continue
            j = i + self.n  # extend the match over following private n-grams
            while j < len(words) and tuple(words[j - self.n + 1:j + 1]) in self.private:
                j += 1
            findings.append(Finding("ngram", source, text[matches[i].start():matches[j - 1].end()]))
            i = j
        for lit, source in self.literals.items():
            if lit in text:
                findings.append(Finding("expected_output", source, lit))
        return _dedupe(findings)


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen, out = set(), []
    for f in findings:
        if (f.kind, f.span) not in seen:
            seen.add((f.kind, f.span))
            out.append(f)
    return out

