"""Family "data": CSV and JSON wrangling (aggregate, JSON to CSV, clean, join, JSON-lines stats)."""
from __future__ import annotations

import collections
import csv
import io
import json
import random

from sandboxes.suite.families.common import CITIES, COUNTRIES, FIRST, LAST, py_cmd, rng_for, word, words
from sandboxes.suite.spec import TaskSpec

FAMILY = "data"


def _csv(header: list[str], rows: list[list]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


def _aggregate(rng: random.Random) -> dict:
    regions, products = words(rng, rng.randint(3, 5)), words(rng, rng.randint(3, 6))
    group = rng.choice(["region", "product"])
    rows, orders, cents = [], collections.Counter(), collections.Counter()
    for _ in range(rng.randint(20, 45)):
        r, p = rng.choice(regions), rng.choice(products)
        q, pc = rng.randint(1, 20), rng.randint(50, 9999)
        rows.append([f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}", r, p, q, f"{pc / 100:.2f}"])
        key = r if group == "region" else p
        orders[key] += 1
        cents[key] += q * pc
    expected = {k: {"orders": orders[k], "revenue": cents[k] / 100} for k in sorted(orders)}
    instruction = f"""Summarise `/app/sales.csv` (columns: date, region, product, quantity, unit_price) by {group}.

Write `/app/summary.json`: a JSON object whose keys are the distinct {group} values, each mapped to an object
`{{"orders": <number of rows>, "revenue": <sum of quantity * unit_price over those rows, rounded to 2 decimals>}}`.
`orders` must be an integer and `revenue` a number."""
    script = f"""
import csv, json, collections
o, r = collections.Counter(), collections.Counter()
for row in csv.DictReader(open("/app/sales.csv")):
    o[row["{group}"]] += 1
    r[row["{group}"]] += int(row["quantity"]) * round(float(row["unit_price"]) * 100)
json.dump({{k: {{"orders": o[k], "revenue": r[k] / 100}} for k in sorted(o)}}, open("/app/summary.json", "w"), indent=2)
"""
    tests = r'''
def _load():
    return json.loads((APP / "summary.json").read_text())


def test_summary_is_json_object():
    assert isinstance(_load(), dict)


def test_keys_right():
    assert sorted(_load()) == sorted(EXPECTED)


def test_orders_right():
    got = _load()
    for k, v in EXPECTED.items():
        assert isinstance(got[k]["orders"], int) and got[k]["orders"] == v["orders"], k


def test_revenue_right():
    got = _load()
    for k, v in EXPECTED.items():
        assert abs(float(got[k]["revenue"]) - v["revenue"]) < 0.006, (k, got[k]["revenue"], v["revenue"])
'''
    return dict(template="csv_aggregate", difficulty="easy", instruction=instruction,
                files={"sales.csv": _csv(["date", "region", "product", "quantity", "unit_price"], rows)},
                oracle_commands=(py_cmd(script),), tests=tests, constants=dict(EXPECTED=expected),
                progress_tests=("test_summary_is_json_object", "test_keys_right"))


def _people(rng: random.Random, n: int) -> list[dict]:
    ids = rng.sample(range(100, 999), n)
    out = []
    for i in ids:
        f, l = rng.choice(FIRST), rng.choice(LAST)
        name = f"{f.capitalize()} {l.capitalize()}" + (", Jr." if rng.random() < 0.15 else "")
        out.append({"id": i, "name": name, "email": f"{f}.{l}{i}@{word(rng)}.com", "active": rng.random() < 0.6,
                    "address": {"city": rng.choice(CITIES), "country": rng.choice(COUNTRIES)}})
    return out


def _json_to_csv(rng: random.Random) -> dict:
    people = _people(rng, rng.randint(8, 16))
    people[0]["active"], people[1]["active"] = True, False
    rows = [[str(p["id"]), p["name"], p["email"], p["address"]["city"]] for p in sorted(people, key=lambda p: p["id"])
            if p["active"]]
    instruction = """Convert `/app/users.json` (a JSON array of user objects) to CSV.

Write `/app/active_users.csv` with the header `id,name,email,city` followed by one row per user whose `active`
field is `true`, ordered by `id` ascending. `city` comes from the nested `address.city`. Use standard CSV quoting
(fields that contain commas are quoted), comma separators and `\\n` line endings."""
    script = """
import csv, json
users = sorted((u for u in json.load(open("/app/users.json")) if u["active"]), key=lambda u: u["id"])
with open("/app/active_users.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\\n")
    w.writerow(["id", "name", "email", "city"])
    w.writerows([u["id"], u["name"], u["email"], u["address"]["city"]] for u in users)
"""
    tests = r'''
def _rows():
    return list(csv.reader(io.StringIO((APP / "active_users.csv").read_text())))


def test_csv_exists_with_header():
    assert _rows()[0] == ["id", "name", "email", "city"]


def test_only_active_users():
    assert sorted(r[0] for r in _rows()[1:]) == sorted(r[0] for r in EXPECTED)


def test_rows_exact_and_ordered():
    assert _rows()[1:] == EXPECTED
'''
    return dict(template="json_to_csv", difficulty="easy", instruction=instruction,
                files={"users.json": json.dumps(people, indent=2) + "\n"}, oracle_commands=(py_cmd(script),),
                tests=tests, constants=dict(EXPECTED=rows), progress_tests=("test_csv_exists_with_header",))


def _clean(rng: random.Random) -> dict:
    people = _people(rng, rng.randint(10, 16))
    raw = []
    for p in people:
        m, d, y = rng.randint(1, 12), rng.randint(1, 28), rng.randint(2015, 2024)
        email = "" if rng.random() < 0.15 else p["email"]
        row = [p["name"].replace(", Jr.", ""), email, f"{m:02d}/{d:02d}/{y}", p["address"]["country"]]
        for _ in range(2 if rng.random() < 0.25 else 1):
            pad = [rng.choice(["", " ", "  "]) + v + rng.choice(["", " "]) for v in row]
            pad[1] = pad[1].upper() if rng.random() < 0.3 else pad[1]
            raw.append(pad)
    rng.shuffle(raw)
    expected = []
    for r in raw:
        name, email, signup, country = (v.strip() for v in r)
        m, d, y = signup.split("/")
        row = [name, email.lower(), f"{y}-{m}-{d}", country]
        if email and row not in expected:
            expected.append(row)
    instruction = """Clean the customer file `/app/raw.csv` (header `name,email,signup,country`) into `/app/clean.csv`:

1. Strip leading and trailing spaces from every field.
2. Lower-case the `email` field, and drop rows whose `email` is empty.
3. Rewrite `signup` dates from `MM/DD/YYYY` to `YYYY-MM-DD`.
4. After these steps, drop rows that duplicate an earlier row exactly (keep the first occurrence).

Keep the original row order and the same header; write comma-separated values with `\\n` line endings."""
    script = """
import csv
rows = list(csv.reader(open("/app/raw.csv")))
out, seen = [rows[0]], set()
for r in rows[1:]:
    r = [v.strip() for v in r]
    r[1] = r[1].lower()
    if not r[1]:
        continue
    m, d, y = r[2].split("/")
    r[2] = f"{y}-{m}-{d}"
    if tuple(r) not in seen:
        seen.add(tuple(r)); out.append(r)
csv.writer(open("/app/clean.csv", "w", newline=""), lineterminator="\\n").writerows(out)
"""
    tests = r'''
def _rows():
    return list(csv.reader(io.StringIO((APP / "clean.csv").read_text())))


def test_header():
    assert _rows()[0] == ["name", "email", "signup", "country"]


def test_fields_normalised():
    for r in _rows()[1:]:
        assert all(v == v.strip() for v in r), r
        assert r[1] and r[1] == r[1].lower(), r
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", r[2]), r


def test_rows_exact():
    assert _rows()[1:] == EXPECTED
'''
    return dict(template="csv_clean", difficulty="medium", instruction=instruction,
                files={"raw.csv": _csv(["name", "email", "signup", "country"], raw)},
                oracle_commands=(py_cmd(script),), tests=tests, constants=dict(EXPECTED=expected),
                progress_tests=("test_header", "test_fields_normalised"))


def _join(rng: random.Random) -> dict:
    people = _people(rng, rng.randint(6, 10))
    customers = [[p["id"], p["name"].replace(", Jr.", ""), p["address"]["country"]] for p in people]
    orders, tot, cnt = [], collections.Counter(), collections.Counter()
    for oid in range(1, rng.randint(15, 35)):
        c = rng.choice(customers[:-1])  # the last customer never orders
        cents = rng.randint(100, 50000)
        orders.append([1000 + oid, c[0], f"{cents / 100:.2f}"])
        tot[c[0]] += cents
        cnt[c[0]] += 1
    rows = [[c[1], c[2], str(cnt[c[0]]), f"{tot[c[0]] / 100:.2f}"] for c in customers if cnt[c[0]]]
    rows.sort(key=lambda r: (-float(r[3]), r[0]))
    instruction = """Join `/app/customers.csv` (columns `id,name,country`) with `/app/orders.csv` (columns
`order_id,customer_id,amount`).

Write `/app/report.csv` with the header `name,country,orders,total` and one row per customer that has at least one
order: `orders` is their number of orders and `total` the sum of their amounts with exactly two decimals (e.g.
`1234.50`). Sort rows by `total` descending, ties by `name` ascending. Use `\\n` line endings."""
    script = """
import csv, collections
cust = {r["id"]: r for r in csv.DictReader(open("/app/customers.csv"))}
n, t = collections.Counter(), collections.Counter()
for o in csv.DictReader(open("/app/orders.csv")):
    n[o["customer_id"]] += 1; t[o["customer_id"]] += round(float(o["amount"]) * 100)
keyed = sorted((-t[c], cust[c]["name"], [cust[c]["name"], cust[c]["country"], n[c], f"{t[c] / 100:.2f}"]) for c in n)
w = csv.writer(open("/app/report.csv", "w", newline=""), lineterminator="\\n")
w.writerow(["name", "country", "orders", "total"]); w.writerows(r for _, _, r in keyed)
"""
    tests = r'''
def _rows():
    return list(csv.reader(io.StringIO((APP / "report.csv").read_text())))


def test_header():
    assert _rows()[0] == ["name", "country", "orders", "total"]


def test_customers_with_orders():
    assert sorted(r[0] for r in _rows()[1:]) == sorted(r[0] for r in EXPECTED)


def test_counts_and_totals():
    assert sorted(_rows()[1:]) == sorted(EXPECTED)


def test_sorted():
    assert _rows()[1:] == EXPECTED
'''
    return dict(template="join_report", difficulty="medium", instruction=instruction,
                files={"customers.csv": _csv(["id", "name", "country"], customers),
                       "orders.csv": _csv(["order_id", "customer_id", "amount"], orders)},
                oracle_commands=(py_cmd(script),), tests=tests, constants=dict(EXPECTED=rows),
                progress_tests=("test_header", "test_customers_with_orders"))


def _jsonl_stats(rng: random.Random) -> dict:
    types = words(rng, rng.randint(3, 5))
    users = [f"{rng.choice(FIRST)}{rng.randint(1, 9)}" for _ in range(6)]
    focus = types[0]
    lines, by_type, focus_users, durations, invalid = [], collections.Counter(), set(), [], 0
    for i in range(rng.randint(25, 50)):
        if rng.random() < 0.1:
            lines.append(rng.choice(['{"ts": 1, "type": ', "not json", '{"user": "x"', "{broken"]))
            invalid += 1
            continue
        ev = {"ts": 1700000000 + i * 37, "user": rng.choice(users), "type": rng.choice(types),
              "duration_ms": rng.randint(1, 5000)}
        lines.append(json.dumps(ev))
        by_type[ev["type"]] += 1
        durations.append(ev["duration_ms"])
        if ev["type"] == focus:
            focus_users.add(ev["user"])
    if not focus_users:
        lines.append(json.dumps({"ts": 1, "user": users[0], "type": focus, "duration_ms": 10}))
        by_type[focus] += 1
        durations.append(10)
        focus_users.add(users[0])
    expected = {"total_events": sum(by_type.values()), "invalid_lines": invalid, "by_type": dict(sorted(by_type.items())),
                f"{focus}_users": sorted(focus_users), "mean_duration_ms": round(sum(durations) / len(durations), 1)}
    instruction = f"""Compute statistics over the JSON-lines event log `/app/events.jsonl`. Each valid line is a JSON
object with `ts`, `user`, `type` and `duration_ms`; some lines are not valid JSON and must be skipped.

Write `/app/stats.json`, a JSON object with exactly these keys:
- `total_events`: number of valid events;
- `invalid_lines`: number of lines that are not valid JSON;
- `by_type`: object mapping each event type to its number of events;
- `{focus}_users`: sorted list of the distinct users with at least one event of type `{focus}`;
- `mean_duration_ms`: mean `duration_ms` over valid events, rounded to 1 decimal."""
    script = f"""
import json, collections
evs, bad = [], 0
for line in open("/app/events.jsonl").read().splitlines():
    try:
        evs.append(json.loads(line))
    except ValueError:
        bad += 1
out = {{"total_events": len(evs), "invalid_lines": bad,
       "by_type": dict(collections.Counter(e["type"] for e in evs)),
       "{focus}_users": sorted({{e["user"] for e in evs if e["type"] == "{focus}"}}),
       "mean_duration_ms": round(sum(e["duration_ms"] for e in evs) / len(evs), 1)}}
json.dump(out, open("/app/stats.json", "w"), indent=2)
"""
    tests = r'''
def _load():
    return json.loads((APP / "stats.json").read_text())


def test_stats_keys():
    assert sorted(_load()) == sorted(EXPECTED)


def test_counts():
    got = _load()
    assert got["total_events"] == EXPECTED["total_events"]
    assert got["invalid_lines"] == EXPECTED["invalid_lines"]


def test_by_type():
    assert _load()["by_type"] == EXPECTED["by_type"]


def test_users_and_mean():
    got = _load()
    assert got[FOCUS_KEY] == EXPECTED[FOCUS_KEY]
    assert abs(got["mean_duration_ms"] - EXPECTED["mean_duration_ms"]) < 0.051
'''
    return dict(template="jsonl_stats", difficulty="medium", instruction=instruction,
                files={"events.jsonl": "\n".join(lines) + "\n"}, oracle_commands=(py_cmd(script),), tests=tests,
                constants=dict(EXPECTED=expected, FOCUS_KEY=f"{focus}_users"), progress_tests=("test_stats_keys",))


TEMPLATES = (_aggregate, _json_to_csv, _clean, _join, _jsonl_stats)


def make(seed: int) -> TaskSpec:
    """Generate the data task for `seed` (template = seed mod number of templates)."""
    rng = rng_for(FAMILY, seed)
    fields = TEMPLATES[seed % len(TEMPLATES)](rng)
    return TaskSpec(family=FAMILY, seed=seed, setup=(), **fields)
