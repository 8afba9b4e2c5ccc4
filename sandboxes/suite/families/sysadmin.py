"""Family "sysadmin": system administration inside the sandbox (process and socket snapshots, permissions,
crontab, users and groups). Snapshots are files, so answers are exact and the sandbox needs no privileges."""
from __future__ import annotations

import random

from sandboxes.suite.families.common import FIRST, py_cmd, rng_for, sha, word, words, write_cmd
from sandboxes.suite.spec import TaskSpec

FAMILY = "sysadmin"
_DAEMONS = ["/usr/sbin/sshd -D", "/usr/sbin/cron -f", "nginx: worker process", "/usr/bin/python3 /opt/app/server.py",
            "postgres: checkpointer", "/usr/lib/postgresql/15/bin/postgres -D /var/lib/pg", "redis-server *:6379",
            "/usr/bin/node /srv/api/index.js --port 8080", "bash", "-bash", "/usr/bin/java -Xmx2g -jar worker.jar",
            "/usr/sbin/rsyslogd -n", "sleep 3600", "vim notes.txt", "/usr/bin/dockerd -H fd://"]


def _ps(rng: random.Random) -> dict:
    users = ["root", *(rng.sample(FIRST, 3)), "www-data", "postgres"]
    target = rng.choice(users[1:4])
    limit = rng.choice([1.0, 2.5, 5.0])
    rows, pids = [], rng.sample(range(2, 30000), rng.randint(18, 30))
    cpus = rng.sample(range(0, 999), len(pids))
    for pid, cpu in zip(pids, cpus):
        mem = rng.choice([0.0, 0.1, 0.4, 0.9, 1.2, 2.5, 3.3, 4.8, 5.0, 7.5, 12.1])
        user = target if rng.random() < 0.35 else rng.choice(users)
        cmd = rng.choice(_DAEMONS)
        rows.append((user, pid, cpu / 10, mem, cmd))
    top = max(rows, key=lambda r: r[2])
    header = "USER         PID %CPU %MEM    VSZ   RSS TTY      STAT START   TIME COMMAND"
    lines = [header] + [f"{u:<10} {p:>5} {c:>4.1f} {m:>4.1f} {rng.randint(5000, 900000):>6} {rng.randint(900, 90000):>5} "
                        f"{rng.choice(['?', 'pts/0', 'pts/1']):<8} {rng.choice(['S', 'Ss', 'R', 'Sl']):<4} "
                        f"{rng.choice(['Mar11', '09:14', '10:02'])} {rng.randint(0, 59)}:{rng.randint(0, 59):02d} {cmd}"
                        for u, p, c, m, cmd in rows]
    expected = sorted(p for u, p, c, m, _ in rows if u == target and m > limit)
    instruction = f"""`/app/ps.txt` is a snapshot of `ps aux` output from a server.

1. Write the PIDs of all processes owned by user `{target}` whose `%MEM` is strictly greater than {limit} to
   `/app/answer.txt`, one per line, in ascending numeric order (the file is empty if there are none).
2. Write the full command line (the COMMAND column, with its arguments, exactly as shown) of the process with the
   highest `%CPU` to `/app/top_cpu.txt`, as a single line."""
    cmds = (f"awk -v u={target} -v m={limit} 'NR > 1 && $1 == u && $4 > m {{print $2}}' /app/ps.txt | sort -n > /app/answer.txt",
            "awk 'NR > 1 && $3 > best {best = $3; c = $11; for (i = 12; i <= NF; i++) c = c \" \" $i} END {print c}' "
            "/app/ps.txt > /app/top_cpu.txt")
    tests = r'''
def test_answer_exists():
    assert (APP / "answer.txt").is_file()


def test_answer_exact():
    lines = [l.strip() for l in (APP / "answer.txt").read_text().splitlines() if l.strip()]
    assert lines == [str(p) for p in EXPECTED]


def test_top_cpu_exists():
    assert (APP / "top_cpu.txt").is_file()


def test_top_cpu_exact():
    assert (APP / "top_cpu.txt").read_text().strip() == TOP
'''
    return dict(template="ps_snapshot", difficulty="easy", instruction=instruction,
                files={"ps.txt": "\n".join(lines) + "\n"}, setup=(), oracle_commands=cmds, tests=tests,
                constants=dict(EXPECTED=expected, TOP=top[4]), progress_tests=("test_answer_exists", "test_top_cpu_exists"))


def _ports(rng: random.Random) -> dict:
    procs = rng.sample(["nginx", "sshd", "postgres", "redis-server", "node", "java", "python3", "dnsmasq", "cupsd"], 6)
    ports = rng.sample([22, 53, 80, 443, 631, 3000, 5432, 6379, 8000, 8080, 8443, 9090, 9200], 9)
    rows, public, owner_of = [], set(), {}
    for i, port in enumerate(ports):
        proc, pid = procs[i % len(procs)], 100 + 37 * (i % len(procs))
        kind = rng.choice(["public", "public", "local", "udp"])
        if kind == "udp":
            rows.append(("udp", "UNCONN", "0.0.0.0", port, proc, pid))
            continue
        addrs = [rng.choice(["0.0.0.0", "*"])] if kind == "public" else ["127.0.0.1"]
        if kind == "public" and rng.random() < 0.5:
            addrs.append("[::]")
        for a in addrs:
            rows.append(("tcp", "LISTEN", a, port, proc, pid))
        owner_of[port] = proc
        if kind == "public":
            public.add(port)
    if not public:
        rows.append(("tcp", "LISTEN", "0.0.0.0", 2222, "sshd", 99))
        public.add(2222)
        owner_of[2222] = "sshd"
    rows.append(("tcp", "ESTAB", "10.0.0.5", 22, "sshd", 4242))
    rng.shuffle(rows)
    lines = ["Netid State  Recv-Q Send-Q Local Address:Port  Peer Address:Port Process"]
    lines += [f"{n:<5} {s:<6} 0      {rng.choice([128, 511, 4096]):<6} {f'{a}:{p}':>20} {'0.0.0.0:*' if s != 'ESTAB' else '10.0.0.9:51234':>18} "
              f'users:(("{proc}",pid={pid},fd={rng.randint(3, 20)}))' for n, s, a, p, proc, pid in rows]
    port = rng.choice(sorted(owner_of))
    instruction = f"""`/app/ss.txt` is a snapshot of `ss -tulpn` output from a server.

1. Write `/app/public_ports.txt`: the distinct TCP ports in state `LISTEN` that are bound on all interfaces
   (local address `0.0.0.0`, `[::]` or `*`), one per line, ascending numerically.
2. Write `/app/owner.txt`: the name of the process (as shown inside `users:((...))`) that listens on TCP port
   {port}, as a single line."""
    script = f"""
import re
pub, owner = set(), None
for l in open("/app/ss.txt").read().splitlines()[1:]:
    f = l.split()
    addr, port = f[4].rsplit(":", 1)
    if f[0] == "tcp" and f[1] == "LISTEN":
        if addr in ("0.0.0.0", "[::]", "*"):
            pub.add(int(port))
        if port == "{port}":
            owner = re.search(r'"([^"]+)"', l).group(1)
open("/app/public_ports.txt", "w").write("".join(f"{{p}}\\n" for p in sorted(pub)))
open("/app/owner.txt", "w").write(owner + "\\n")
"""
    tests = r'''
def test_public_ports_exists():
    assert (APP / "public_ports.txt").is_file()


def test_public_ports_exact():
    assert (APP / "public_ports.txt").read_text().split() == [str(p) for p in PUBLIC]


def test_owner_exact():
    assert (APP / "owner.txt").read_text().strip() == OWNER
'''
    return dict(template="listening_ports", difficulty="medium", instruction=instruction,
                files={"ss.txt": "\n".join(lines) + "\n"}, setup=(), oracle_commands=(py_cmd(script),),
                tests=tests, constants=dict(PUBLIC=sorted(public), OWNER=owner_of[port]),
                progress_tests=("test_public_ports_exists",))


def _permissions(rng: random.Random) -> dict:
    site = f"site-{word(rng)}"
    scripts = [f"{w}.sh" for w in words(rng, rng.randint(2, 3))]
    keys = [f"{w}.key" for w in words(rng, 2)]
    pages = [f"{w}.html" for w in words(rng, rng.randint(2, 3))]
    modes = {"script": rng.choice([0o755, 0o750]), "key": rng.choice([0o600, 0o400]),
             "page": rng.choice([0o644, 0o444]), "secrets": 0o700, "uploads": rng.choice([0o1777, 0o1770])}
    files = {f"{site}/bin/{s}": f"#!/bin/bash\necho {word(rng)}\n" for s in scripts}
    files.update({f"{site}/secrets/{k}": f"{word(rng)}-{rng.randint(10 ** 8, 10 ** 9)}\n" for k in keys})
    files.update({f"{site}/public/{p}": f"<h1>{word(rng)}</h1>\n" for p in pages})
    setup = (f"mkdir -p {site}/uploads", f"chmod 644 {site}/bin/*.sh", f"chmod 666 {site}/secrets/*",
             f"chmod 755 {site}/secrets", f"chmod 600 {site}/public/*", f"chmod 700 {site}/uploads")
    o = "{:o}".format
    instruction = f"""Fix the file permissions under `/app/{site}` (set exactly these modes):

- every script in `/app/{site}/bin/` (`*.sh`): mode `{o(modes['script'])}`;
- the directory `/app/{site}/secrets`: mode `700`, and every file in it: mode `{o(modes['key'])}`;
- every file in `/app/{site}/public/`: mode `{o(modes['page'])}`;
- the directory `/app/{site}/uploads`: mode `{o(modes['uploads'])}` (note the sticky bit).

Do not change file contents."""
    cmds = (f"chmod {o(modes['script'])} /app/{site}/bin/*.sh", f"chmod {o(modes['key'])} /app/{site}/secrets/*",
            f"chmod 700 /app/{site}/secrets", f"chmod {o(modes['page'])} /app/{site}/public/*",
            f"chmod {o(modes['uploads'])} /app/{site}/uploads")
    tests = r'''
def _mode(rel):
    return stat.S_IMODE(os.stat(APP / rel).st_mode)


def test_scripts_mode():
    for s in SCRIPTS:
        assert _mode(s) == MODES["script"], (s, oct(_mode(s)))


def test_secrets_modes():
    assert _mode(SITE + "/secrets") == 0o700
    for k in KEYS:
        assert _mode(k) == MODES["key"], (k, oct(_mode(k)))


def test_public_mode():
    for p in PAGES:
        assert _mode(p) == MODES["page"], (p, oct(_mode(p)))


def test_uploads_mode():
    assert _mode(SITE + "/uploads") == MODES["uploads"]


def test_contents_unchanged():
    for rel, digest in DIGESTS.items():
        assert sha(APP / rel) == digest, rel
'''
    def rel(d, names):
        return [f"{site}/{d}/{n}" for n in names]

    return dict(template="permissions", difficulty="easy", instruction=instruction, files=files, setup=setup,
                oracle_commands=cmds, tests=tests,
                constants=dict(SITE=site, MODES=modes, SCRIPTS=rel("bin", scripts), KEYS=rel("secrets", keys),
                               PAGES=rel("public", pages), DIGESTS={k: sha(v) for k, v in files.items()}),
                progress_tests=("test_scripts_mode", "test_secrets_modes", "test_public_mode", "test_uploads_mode"))


_CRON_TESTS = r'''
RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
NAMES = {3: "jan feb mar apr may jun jul aug sep oct nov dec".split(), 4: "sun mon tue wed thu fri sat".split()}


def _value(tok, i):
    tok = tok.lower()
    if i in NAMES and tok in NAMES[i]:
        return NAMES[i].index(tok) + (1 if i == 3 else 0)
    return int(tok)


def _expand(field, i):
    lo, hi = RANGES[i]
    out = set()
    for part in field.split(","):
        step = 1
        if "/" in part:
            part, s = part.split("/")
            step = int(s)
        if part == "*":
            a, b = lo, hi
        elif "-" in part:
            a, b = (_value(x, i) for x in part.split("-"))
        else:
            a = _value(part, i)
            b = hi if step > 1 else a
        assert lo <= a <= b <= hi, f"bad cron field {field!r}"
        out |= set(range(a, b + 1, step))
    return {d % 7 for d in out} if i == 4 else out


def _entries():
    out = {}
    for line in (APP / "crontab").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            f = line.split()
            assert len(f) >= 6, f"not a crontab entry: {line!r}"
            out.setdefault(" ".join(f[5:]), []).append([_expand(x, i) for i, x in enumerate(f[:5])])
    return out


def _check(job):
    cmd, want = job
    got = _entries().get(cmd)
    assert got and len(got) == 1, f"need exactly one entry running {cmd}"
    assert got[0] == [set(w) for w in want], f"{cmd} runs at the wrong times"


def test_crontab_valid():
    assert _entries(), "no entries"
    assert sorted(_entries()) == sorted(c for c, _ in JOBS)
'''


def _crontab(rng: random.Random) -> dict:
    every = list(range(0, 60))
    jobs, lines, texts = [], [], []
    h, m = rng.randint(0, 23), rng.randint(0, 59)
    name = word(rng)
    jobs.append((f"/app/bin/{name}-backup.sh", [[m], [h], range(1, 32), range(1, 13), range(0, 7)]))
    texts.append(f"`/app/bin/{name}-backup.sh` every day at {h:02d}:{m:02d}")
    lines.append(f"{m} {h} * * * /app/bin/{name}-backup.sh")
    n = rng.choice([5, 10, 15, 20, 30])
    jobs.append((f"/app/bin/{word(rng)}-cleanup.sh", [every[::n], range(24), range(1, 32), range(1, 13), range(0, 7)]))
    texts.append(f"`{jobs[-1][0]}` every {n} minutes (at minutes divisible by {n})")
    lines.append(f"*/{n} * * * * {jobs[-1][0]}")
    rh = rng.randint(6, 11)
    jobs.append((f"/app/bin/{word(rng)}-report.sh", [[0], [rh], range(1, 32), range(1, 13), range(1, 6)]))
    texts.append(f"`{jobs[-1][0]}` at {rh:02d}:00 Monday to Friday only")
    lines.append(f"0 {rh} * * 1-5 {jobs[-1][0]}")
    if rng.random() < 0.5:
        d, mm = rng.randint(1, 28), rng.randint(0, 59)
        jobs.append((f"/app/bin/{word(rng)}-rotate.sh", [[mm], [0], [d], range(1, 13), range(0, 7)]))
        texts.append(f"`{jobs[-1][0]}` at 00:{mm:02d} on day {d} of every month")
        lines.append(f"{mm} 0 {d} * * {jobs[-1][0]}")
    jobs = [(c, [sorted(w) for w in want]) for c, want in jobs]
    instruction = "Write a crontab file `/app/crontab` (standard 5-field cron syntax followed by the command, one job per\n" \
                  "line, comments allowed) that schedules exactly these jobs, each command written as the plain path:\n\n" + \
                  "\n".join(f"- {t};" for t in texts) + "\n\nDo not add other jobs."
    tests = _CRON_TESTS + "".join(f"\n\ndef test_job_{i}():\n    _check(JOBS[{i}])\n" for i in range(len(jobs)))
    return dict(template="crontab", difficulty="medium", instruction=instruction, files={}, setup=(),
                oracle_commands=(write_cmd("/app/crontab", "\n".join(lines) + "\n"),), tests=tests,
                constants=dict(JOBS=jobs), progress_tests=("test_crontab_valid",))


def _accounts(rng: random.Random) -> dict:
    passwd = ["root:x:0:0:root:/root:/bin/bash", "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin",
              "www-data:x:33:33:www-data:/var/www:/usr/sbin/nologin", "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin"]
    groups = {g: (1500 + i, []) for i, g in enumerate(["devs", "ops", "audit"])}
    group = rng.choice(list(groups))
    users, logins, members = rng.sample(FIRST, rng.randint(7, 10)), [], set()
    for u, uid in zip(users, rng.sample(range(1001, 1400), len(users))):
        shell = rng.choice(["/bin/bash", "/bin/bash", "/bin/zsh", "/usr/sbin/nologin", "/bin/false"])
        gid = rng.choice([uid, groups[group][0], groups[rng.choice(list(groups))][0]])
        passwd.append(f"{u}:x:{uid}:{gid}:{u.capitalize()}:/home/{u}:{shell}")
        if not shell.endswith(("nologin", "false")):
            logins.append((uid, f"{u}:{uid}:/home/{u}"))
        if gid == groups[group][0]:
            members.add(u)
        for g in groups:
            if rng.random() < 0.3:
                groups[g][1].append(u)
    members |= set(groups[group][1])
    if not members:
        groups[group][1].append(users[0])
        members.add(users[0])
    rng.shuffle(passwd)
    group_lines = ["root:x:0:", "www-data:x:33:"] + [f"{g}:x:{gid}:{','.join(m)}" for g, (gid, m) in groups.items()]
    instruction = f"""`/app/etc/passwd` and `/app/etc/group` are copies of a server's account files.

1. Write `/app/logins.txt`: one line `<name>:<uid>:<home>` for every user with UID >= 1000 and below 65534 whose
   login shell does not end in `nologin` or `false`, ordered by UID ascending.
2. Write `/app/members.txt`: the names of all members of group `{group}` (users whose primary group it is, plus
   users listed in the group's member field), one per line, sorted alphabetically, without duplicates."""
    script = f"""
pw = [l.split(":") for l in open("/app/etc/passwd").read().splitlines() if l]
gr = {{g[0]: g for g in (l.split(":") for l in open("/app/etc/group").read().splitlines() if l)}}
log = sorted((int(p[2]), f"{{p[0]}}:{{p[2]}}:{{p[5]}}") for p in pw
             if 1000 <= int(p[2]) < 65534 and not p[6].endswith(("nologin", "false")))
open("/app/logins.txt", "w").write("".join(l + "\\n" for _, l in log))
g = gr["{group}"]
mem = {{p[0] for p in pw if p[3] == g[2]}} | {{m for m in g[3].split(",") if m}}
open("/app/members.txt", "w").write("".join(m + "\\n" for m in sorted(mem)))
"""
    tests = r'''
def test_logins_exists():
    assert (APP / "logins.txt").is_file()


def test_logins_exact():
    assert (APP / "logins.txt").read_text().splitlines() == LOGINS


def test_members_exact():
    assert (APP / "members.txt").read_text().splitlines() == MEMBERS
'''
    return dict(template="accounts", difficulty="medium", instruction=instruction,
                files={"etc/passwd": "\n".join(passwd) + "\n", "etc/group": "\n".join(group_lines) + "\n"}, setup=(),
                oracle_commands=(py_cmd(script),), tests=tests,
                constants=dict(LOGINS=[l for _, l in sorted(logins)], MEMBERS=sorted(members)),
                progress_tests=("test_logins_exists",))


TEMPLATES = (_ps, _ports, _permissions, _crontab, _accounts)


def make(seed: int) -> TaskSpec:
    """Generate the sysadmin task for `seed` (template = seed mod number of templates)."""
    rng = rng_for(FAMILY, seed)
    fields = TEMPLATES[seed % len(TEMPLATES)](rng)
    return TaskSpec(family=FAMILY, seed=seed, **fields)
