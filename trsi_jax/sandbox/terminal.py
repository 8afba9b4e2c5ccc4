"""A tmux terminal inside a sandbox, driven like Terminal-Bench's Terminus harness.

Keystrokes go in with `send_keys` (a string ending in "\\n" presses Enter; a lone tmux key name such
as "C-c" or "Escape" is sent as that key); the call then waits `duration_sec`, returning early once
the shell has answered every Enter pressed with a prompt: the primary prompt after a command ran or
the continuation prompt PS2 inside an unfinished command (a quoted multi-line script, a
here-document); PROMPT_COMMAND adds both to a counter file the host polls. `read_new_output` returns
what appeared since the last read, capped.
"""
from __future__ import annotations

import os
import re
import select
import threading
import time
from typing import IO, Callable

from trsi_jax.sandbox.base import SandboxError, cap_text

SESSION = "main"
WIDTH, HEIGHT = 160, 48
HISTORY_LINES = 20000
POLL_SEC = 0.05
SETTLE_SEC, SETTLE_BUDGET_SEC = 0.01, 1.0  # see Terminal._settled_capture
MAX_DURATION_SEC = 600.0
CAPTURE = ["capture-pane", "-p", "-J", "-t", SESSION]  # the visible screen; with -S - -E -, the whole history
_KEY = re.compile(r"^(?:(?:C|M|S)-)+\S$|^(?:Enter|Escape|Tab|BTab|BSpace|Space|Up|Down|Left|Right|Home|End|"
                  r"PageUp|PageDown|PgUp|PgDn|NPage|PPage|IC|DC|F[1-9]|F1[0-2])$")
TMUX_OPTIONS = (("history-limit", str(HISTORY_LINES)), ("default-shell", "/bin/bash"), ("status", "off"),
                ("update-environment", ""), ("escape-time", "0"))
TMUX_CONF = "".join(f'set -g {k} "{v}"\n' for k, v in TMUX_OPTIONS)
# tmux client args setting TMUX_OPTIONS on a running server (no config file the agent could plant).
TMUX_SET_OPTIONS = [w for k, v in TMUX_OPTIONS for w in ("set", "-g", k, v, ";")][:-1]
# A tmux client loop run *inside* the sandbox (local backend): reads requests `argc\0arg\0...` on stdin,
# answers `exit-code byte-count\n<output>`. Whatever answers on the socket (the agent may replace the
# server) can then only affect this sandboxed client and the text the host gets back; a client that
# hangs is cut off by PipeClient's timeout.
CLIENT_LOOP = r"""exec 2>/dev/null
export LC_ALL=C
while IFS= read -r -d '' n; do
  args=()
  for ((i = 0; i < n; i++)); do IFS= read -r -d '' a; args+=("$a"); done
  out=$(tmux -S "$1" "${args[@]}" </dev/null 2>&1); rc=$?
  printf '%d %d
%s' "$rc" "${#out}" "$out"
done
"""
MAX_REPLY_BYTES = 8 << 20


class PipeClient:
    """Host end of CLIENT_LOOP: one request at a time over the loop's stdin/stdout pipes, each answer
    bounded in size and time (it is untrusted text)."""

    def __init__(self, stdin: IO[bytes], stdout: IO[bytes], timeout_sec: float = 30.0):
        self._in, self._out = stdin.fileno(), stdout.fileno()
        self._timeout = timeout_sec
        self._buf = b""
        self._lock = threading.Lock()

    def _read_until(self, n_or_sep, deadline: float) -> bytes:
        while True:
            if isinstance(n_or_sep, int) and len(self._buf) >= n_or_sep:
                out, self._buf = self._buf[:n_or_sep], self._buf[n_or_sep:]
                return out
            if isinstance(n_or_sep, bytes) and n_or_sep in self._buf:
                out, _, self._buf = self._buf.partition(n_or_sep)
                return out
            if len(self._buf) > MAX_REPLY_BYTES + 64:
                raise SandboxError("the sandbox's terminal client sent an oversized reply")
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out], [], [], left)[0]:
                raise SandboxError("the sandbox's terminal client did not answer in time")
            chunk = os.read(self._out, 1 << 16)
            if not chunk:
                raise SandboxError("the sandbox's terminal client exited")
            self._buf += chunk

    def __call__(self, args: list[str]) -> tuple[int, str]:
        """(exit code, combined output) of `tmux <args>` run in the sandbox."""
        req = f"{len(args)}\0".encode() + b"".join(a.replace("\0", "").encode() + b"\0" for a in args)
        with self._lock:
            deadline = time.monotonic() + self._timeout
            try:
                os.write(self._in, req)  # small (<16 KiB): fits the pipe buffer
            except OSError as e:
                raise SandboxError(f"the sandbox's terminal client is gone ({e})") from None
            head = self._read_until(b"\n", deadline).split()
            if len(head) != 2 or not all(x.lstrip(b"-").isdigit() for x in head) or int(head[1]) > MAX_REPLY_BYTES:
                raise SandboxError(f"the sandbox's terminal client sent a malformed reply: {head!r:.100}")
            return int(head[0]), self._read_until(int(head[1]), deadline).decode("utf-8", "replace")


PS2_COUNT = "__trsi_ps2"  # shell variable: continuation prompts shown since the last primary prompt


def prompt_hook(counter_path: str) -> str:
    """bash PROMPT_COMMAND that counts prompts as the size of `counter_path` (one byte per prompt,
    so the count survives the agent exiting its shell): the primary prompt plus the continuation
    prompts counted since the last one (`CONTINUATION_PROMPT`), so every Enter of a multi-line
    command that ran counts once."""
    return f'printf "%$((1 + ${{{PS2_COUNT}:-0}}))s" >> {counter_path}; {PS2_COUNT}=0'


# bash PS2: bash's default "> ", counting itself in PS2_COUNT on display. An Enter inside an
# unfinished command (a quoted multi-line script, a here-document) gets PS2, not PROMPT_COMMAND;
# uncounted, a multi-line command would wait out its whole duration. The count is a subscript's
# side effect (the array is never set, so the expansion is empty; `:-` keeps it so under `set -u`):
# no fork, so no moment in which the terminal echoes typed-ahead text before the prompt.
CONTINUATION_PROMPT = f"${{__trsi_unset[{PS2_COUNT}++]:-}}> "


class Terminal:
    """One tmux session. Backends supply `run_tmux(args)`, running a tmux client command against the
    sandbox's server (raising SandboxError if it fails), and `read_counter()`, the number of prompts
    the shell has printed so far (the size of the file at `counter_path` inside the sandbox).
    `wait_counter(target, budget)` may replace host-side polling of read_counter (one call instead of
    many where each call is expensive, as with docker exec)."""

    def __init__(self, run_tmux: Callable[[list[str]], str], read_counter: Callable[[], int], workdir: str,
                 counter_path: str, wait_counter: Callable[[int, float], bool] | None = None):
        self._tmux = run_tmux
        self._counter = read_counter
        self._wait_counter = wait_counter
        self._workdir = workdir
        self._counter_path = counter_path
        self._last = ""
        self._prompted = False  # the last keystrokes' commands all finished (a prompt is due on screen)
        self.closed = False
        self._new_session()
        self._prompted = self._wait_prompts(0, 1, 5.0)  # the first prompt of a fresh sandbox
        self._last = self._settled_capture()

    # ---- session ------------------------------------------------------------------------------
    def _new_session(self) -> None:
        self._tmux(["new-session", "-d", "-s", SESSION, "-x", str(WIDTH), "-y", str(HEIGHT), "-c", self._workdir,
                    "-e", f"PROMPT_COMMAND={prompt_hook(self._counter_path)}",
                    "-e", f"PS2={CONTINUATION_PROMPT}"])

    def _alive(self) -> bool:
        try:
            self._tmux(["has-session", "-t", SESSION])
            return True
        except SandboxError:
            return False

    def _ensure(self) -> None:
        if self.closed:
            raise SandboxError("terminal is closed (the sandbox was stopped or closed)")
        if not self._alive():  # the agent exited its shell: give it a fresh one, as a new login would
            self._new_session()
            self._last, self._prompted = "", False

    def _wait_prompts(self, start: int, needed: int, budget: float) -> bool:
        if self._wait_counter is not None:
            return self._wait_counter(start + needed, budget)
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline:
            if self._counter() >= start + needed:
                return True
            time.sleep(POLL_SEC)
        return False

    # ---- I/O ----------------------------------------------------------------------------------
    def send_keys(self, keystrokes: str, duration_sec: float = 1.0) -> bool:
        """Type `keystrokes`; wait up to `duration_sec` (returns True if every command it entered
        finished earlier, i.e. the shell printed a prompt, primary or continuation, per Enter)."""
        self._ensure()
        duration_sec = min(max(float(duration_sec), 0.0), MAX_DURATION_SEC)
        start = self._counter()
        body = keystrokes[:-1] if keystrokes.endswith("\n") else keystrokes
        if _KEY.match(body):
            self._tmux(["send-keys", "-t", SESSION, body] + (["Enter"] if keystrokes.endswith("\n") else []))
            enters = int(keystrokes.endswith("\n") or body == "Enter")
        else:
            pieces = keystrokes.split("\n")
            enters = len(pieces) - 1
            for i, piece in enumerate(pieces):
                for j in range(0, len(piece), 2048):
                    self._tmux(["send-keys", "-t", SESSION, "-l", "--", piece[j:j + 2048]])
                if i < len(pieces) - 1:
                    self._tmux(["send-keys", "-t", SESSION, "Enter"])
        if enters == 0:
            time.sleep(duration_sec)
            self._prompted = False
            return False
        self._prompted = self._wait_prompts(start, enters, duration_sec)
        return self._prompted

    def _screen(self) -> str:
        return self._tmux(CAPTURE).rstrip()

    def _settled_capture(self) -> str:
        """The whole history once nothing changes and, after commands that finished, the shell's
        prompt is on screen. The prompt counter moves before bash prints the prompt, and tmux
        renders it a moment later, so one capture right after a command finished may or may not
        end with the prompt, and the same episode would observe different text from run to run.
        Settled: two captures in a row agree and, when a prompt is due, the cursor is off column 0
        (the prompt follows the output's last newline); output that never settles (a running
        program, an empty PS1) is taken as it is after SETTLE_BUDGET_SEC."""
        args = CAPTURE + ["-S", "-", "-E", "-", ";", "display-message", "-p", "-t", SESSION, "#{cursor_x}"]
        deadline, before = time.monotonic() + SETTLE_BUDGET_SEC, None
        while True:
            text, _, cursor = self._tmux(args).rstrip().rpartition("\n")
            now = text.rstrip()
            prompt_shown = not self._prompted or cursor.strip() not in ("", "0")
            if (now == before and prompt_shown) or time.monotonic() > deadline:
                return now
            before = now
            time.sleep(SETTLE_SEC)

    def read_new_output(self, max_bytes: int = 16384) -> str:
        """Text that appeared since the last read (the visible screen if history scrolled past it)."""
        self._ensure()
        now = self._settled_capture()
        if now.startswith(self._last):
            new = now[len(self._last):]
        else:
            anchor = self._last[-2000:]
            i = now.rfind(anchor) if anchor else -1
            new = now[i + len(anchor):] if i >= 0 else (
                "[... earlier output scrolled out of the terminal's history ...]\n" + self._screen())
        self._last = now
        return cap_text(new.lstrip("\n").encode(), max_bytes)[0]

    def screen(self) -> str:
        """The visible screen now."""
        self._ensure()
        return self._screen()

    def close(self) -> None:
        """Stop using this terminal (the sandbox's stop_processes/close end its processes)."""
        self.closed = True
