"""Family "sql": SQLite databases (report to CSV, view + index, data fixes, a reusable query file). The database
is built at environment set-up with the sqlite3 CLI from a seed script that is then removed."""
from __future__ import annotations

import collections
import random

from sandboxes.suite.families.common import CITIES, FIRST, LAST, rng_for, word, write_cmd
from sandboxes.suite.spec import TaskSpec

FAMILY = "sql"
STATUSES = ("paid", "pending", "refunded")

_DB = r'''
import sqlite3


def _db(path="/app/shop.db"):
    assert Path(path).is_file(), f"{path} is missing"
    return sqlite3.connect(path)


def _rows(sql, path="/app/shop.db"):
    with _db(path) as con:
        return [list(r) for r in con.execute(sql).fetchall()]
'''


def _data(rng: random.Random) -> tuple[list, list]:
    names = sorted({f"{rng.choice(FIRST).capitalize()} {rng.choice(LAST).capitalize()}" for _ in range(rng.randint(8, 14))})
    customers = [[i + 1, n, rng.choice(CITIES[:6])] for i, n in enumerate(names)]
    orders = []
    for oid in range(1, rng.randint(25, 60)):
        orders.append([oid, rng.choice(customers)[0], rng.randint(199, 99999), rng.choice(STATUSES),
                       f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"])
    return customers, orders


def _init_sql(customers, orders) -> str:
    def q(v):
        return str(v) if isinstance(v, int) else "'" + v.replace("'", "''") + "'"

    lines = ["CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL);",
             "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id), "
             "amount_cents INTEGER NOT NULL, status TEXT NOT NULL, created TEXT NOT NULL);"]
    lines += [f"INSERT INTO customers VALUES ({', '.join(q(v) for v in c)});" for c in customers]
    lines += [f"INSERT INTO orders VALUES ({', '.join(q(v) for v in o)});" for o in orders]
    return "\n".join(lines) + "\n"


def _env(customers, orders) -> dict:
    return dict(files={"seed/init.sql": _init_sql(customers, orders)},
                setup=("sqlite3 shop.db < seed/init.sql && rm -r seed",))


_SCHEMA = ("`/app/shop.db` is a SQLite database with tables `customers(id, name, city)` and `orders(id, customer_id, "
           "amount_cents, status, created)` (`status` is one of `paid`, `pending`, `refunded`; `created` is "
           "`YYYY-MM-DD`).")


def _report(rng: random.Random) -> dict:
    customers, orders = _data(rng)
    k = rng.randint(3, 5)
    status = rng.choice(["paid", "pending"])
    tot = collections.Counter()
    for o in orders:
        if o[3] == status:
            tot[o[1]] += o[2]
    name = {c[0]: c[1] for c in customers}
    ranked = sorted(((name[c], t) for c, t in tot.items()), key=lambda r: (-r[1], r[0]))[:k]
    expected = [[n, f"{t // 100}.{t % 100:02d}"] for n, t in ranked]
    instruction = f"""{_SCHEMA}

Write `/app/top_customers.csv` with the header `name,total` and the {k} customers with the largest sum of
`amount_cents` over their `{status}` orders, largest first (ties by name ascending). `total` is that sum in
dollars with exactly two decimals (12345 cents -> `123.45`). Comma-separated, `\\n` line endings, no quoting
needed."""
    cmd = ("sqlite3 -header -csv /app/shop.db \"SELECT c.name AS name, printf('%d.%02d', SUM(o.amount_cents) / 100, "
           f"SUM(o.amount_cents) % 100) AS total FROM orders o JOIN customers c ON c.id = o.customer_id WHERE "
           f"o.status = '{status}' GROUP BY c.id ORDER BY SUM(o.amount_cents) DESC, c.name LIMIT {k};\" "
           "| tr -d '\\r' > /app/top_customers.csv")
    tests = _DB + r'''

def _csv():
    return list(csv.reader(io.StringIO((APP / "top_customers.csv").read_text())))


def test_header():
    assert _csv()[0] == ["name", "total"]


def test_names_right():
    assert [r[0] for r in _csv()[1:]] == [r[0] for r in EXPECTED]


def test_totals_right():
    assert _csv()[1:] == EXPECTED


def test_database_unchanged():
    assert _rows("SELECT COUNT(*) FROM orders") == [[N_ORDERS]]
'''
    return dict(template="report_csv", difficulty="medium", instruction=instruction, oracle_commands=(cmd,),
                tests=tests, constants=dict(EXPECTED=expected, N_ORDERS=len(orders)),
                progress_tests=("test_header",), **_env(customers, orders))


def _view_index(rng: random.Random) -> dict:
    customers, orders = _data(rng)
    view, index = f"{word(rng)}_totals", f"idx_orders_{word(rng)}"
    status = rng.choice(STATUSES)
    tot, cnt = collections.Counter(), collections.Counter()
    for o in orders:
        if o[3] == status:
            tot[o[1]] += o[2]
            cnt[o[1]] += 1
    expected = sorted([c, cnt[c], tot[c]] for c in tot)
    instruction = f"""{_SCHEMA}

1. Create a view `{view}` with columns `customer_id`, `n_orders`, `total_cents`: one row per customer that has at
   least one `{status}` order, with the number of such orders and the sum of their `amount_cents`.
2. Create an index named `{index}` on `orders(customer_id)`.

Do not change the tables' data."""
    sql = (f"CREATE VIEW {view} AS SELECT customer_id, COUNT(*) AS n_orders, SUM(amount_cents) AS total_cents "
           f"FROM orders WHERE status = '{status}' GROUP BY customer_id; CREATE INDEX {index} ON orders(customer_id);")
    tests = _DB + r'''

def test_view_exists():
    assert _rows(f"SELECT name FROM sqlite_master WHERE type = 'view' AND name = '{VIEW}'") == [[VIEW]]


def test_view_columns():
    with _db() as con:
        cur = con.execute(f"SELECT * FROM {VIEW} LIMIT 0")
        assert [d[0] for d in cur.description] == ["customer_id", "n_orders", "total_cents"]


def test_view_content():
    assert sorted(_rows(f"SELECT customer_id, n_orders, total_cents FROM {VIEW}")) == EXPECTED


def test_index():
    assert _rows(f"SELECT tbl_name FROM sqlite_master WHERE type = 'index' AND name = '{INDEX}'") == [["orders"]]
    assert [r[2] for r in _rows(f"PRAGMA index_info('{INDEX}')")] == ["customer_id"]


def test_data_unchanged():
    assert _rows("SELECT COUNT(*), SUM(amount_cents) FROM orders") == [[N_ORDERS, SUM_CENTS]]
'''
    return dict(template="view_index", difficulty="medium", instruction=instruction,
                oracle_commands=(f'sqlite3 /app/shop.db "{sql}"',), tests=tests,
                constants=dict(VIEW=view, INDEX=index, EXPECTED=expected, N_ORDERS=len(orders),
                               SUM_CENTS=sum(o[2] for o in orders)),
                progress_tests=("test_view_exists", "test_index"), **_env(customers, orders))


def _fix_data(rng: random.Random) -> dict:
    customers, orders = _data(rng)
    cutoff = f"2024-{rng.randint(4, 9):02d}-01"
    gone = rng.choice(customers)
    city_from, city_to = rng.choice(sorted({c[2] for c in customers})), rng.choice(CITIES[6:])
    final_orders = [[o[0], o[1], o[2], "expired" if o[3] == "pending" and o[4] < cutoff else o[3], o[4]]
                    for o in orders if o[1] != gone[0]]
    final_customers = [[c[0], c[1], city_to if c[2] == city_from else c[2]] for c in customers if c[0] != gone[0]]
    instruction = f"""{_SCHEMA}

Apply these changes to the database in place:
1. Every `pending` order created before {cutoff} (strictly earlier date) gets the status `expired`.
2. The customer named `{gone[1]}` is deleted together with all of their orders.
3. Every customer whose city is `{city_from}` moves to `{city_to}`.

Nothing else may change."""
    sql = (f"UPDATE orders SET status = 'expired' WHERE status = 'pending' AND created < '{cutoff}'; "
           f"DELETE FROM orders WHERE customer_id = (SELECT id FROM customers WHERE name = '{gone[1]}'); "
           f"DELETE FROM customers WHERE name = '{gone[1]}'; "
           f"UPDATE customers SET city = '{city_to}' WHERE city = '{city_from}';")
    tests = _DB + r'''

def test_expired():
    got = _rows("SELECT id FROM orders WHERE status = 'expired' ORDER BY id")
    assert got == [[o[0]] for o in ORDERS if o[3] == "expired"]


def test_customer_deleted():
    assert _rows(f"SELECT COUNT(*) FROM customers WHERE id = {GONE}") == [[0]]
    assert _rows(f"SELECT COUNT(*) FROM orders WHERE customer_id = {GONE}") == [[0]]


def test_city_moved():
    assert _rows("SELECT id, city FROM customers ORDER BY id") == [[c[0], c[2]] for c in CUSTOMERS]


def test_everything_else_unchanged():
    assert _rows("SELECT * FROM orders ORDER BY id") == ORDERS
    assert _rows("SELECT * FROM customers ORDER BY id") == CUSTOMERS
'''
    return dict(template="fix_data", difficulty="medium", instruction=instruction,
                oracle_commands=(f'sqlite3 /app/shop.db "{sql}"',), tests=tests,
                constants=dict(ORDERS=final_orders, CUSTOMERS=final_customers, GONE=gone[0]),
                progress_tests=("test_expired", "test_customer_deleted", "test_city_moved"),
                **_env(customers, orders))


def _query_file(rng: random.Random) -> dict:
    customers, orders = _data(rng)
    other_c, other_o = _data(rng)
    month = rng.randint(1, 12)
    for o in (orders[0], other_o[0], other_o[1]):  # every database has some matching rows
        o[3], o[4] = "paid", f"2024-{month:02d}-15"
    instruction = f"""{_SCHEMA}

Write a reusable SQL file `/app/city_report.sql` such that `sqlite3 DB < /app/city_report.sql` prints, for any
database `DB` with this schema, one line per city that has at least one `paid` order created in month {month:02d}
of 2024: `<city>|<number of such orders>|<sum of their amount_cents>` (sqlite3's default output format), ordered
by the sum descending, ties by city ascending. It will be run on other databases than `/app/shop.db`."""
    query = (f"SELECT c.city, COUNT(*), SUM(o.amount_cents) FROM orders o JOIN customers c ON c.id = o.customer_id\n"
             f"WHERE o.status = 'paid' AND o.created LIKE '2024-{month:02d}-%'\n"
             f"GROUP BY c.city ORDER BY SUM(o.amount_cents) DESC, c.city;\n")
    tests = _DB + r'''

def _expected(customers, orders):
    city = {c[0]: c[2] for c in customers}
    agg = {}
    for o in orders:
        if o[3] == "paid" and o[4].startswith(f"2024-{MONTH:02d}-"):
            n, s = agg.get(city[o[1]], (0, 0))
            agg[city[o[1]]] = (n + 1, s + o[2])
    return [f"{c}|{n}|{s}" for c, (n, s) in sorted(agg.items(), key=lambda kv: (-kv[1][1], kv[0]))]


def _run_on(tmp_path, customers, orders):
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as con:
        con.executescript(INIT)
        con.executemany("INSERT INTO customers VALUES (?, ?, ?)", customers)
        con.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", orders)
    r = run(["sqlite3", str(db)], input=(APP / "city_report.sql").read_text())
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_query_file_exists():
    assert (APP / "city_report.sql").is_file()


def test_on_shop_db():
    r = run(["sqlite3", "/app/shop.db"], input=(APP / "city_report.sql").read_text())
    assert r.stdout.splitlines() == _expected(*_rows_of_shop())


def _rows_of_shop():
    return _rows("SELECT * FROM customers ORDER BY id"), _rows("SELECT * FROM orders ORDER BY id")


def test_on_other_db(tmp_path):
    assert _run_on(tmp_path, OTHER_CUSTOMERS, OTHER_ORDERS) == _expected(OTHER_CUSTOMERS, OTHER_ORDERS)


def test_on_empty_month(tmp_path):
    orders = [o[:4] + ["2023-01-01"] for o in OTHER_ORDERS]
    assert _run_on(tmp_path, OTHER_CUSTOMERS, orders) == []
'''
    init = _init_sql([], []).strip()
    return dict(template="query_file", difficulty="hard", instruction=instruction,
                oracle_commands=(write_cmd("/app/city_report.sql", query),), tests=tests,
                constants=dict(MONTH=month, OTHER_CUSTOMERS=other_c, OTHER_ORDERS=other_o, INIT=init),
                progress_tests=("test_query_file_exists",), **_env(customers, orders))


TEMPLATES = (_report, _view_index, _fix_data, _query_file)


def make(seed: int) -> TaskSpec:
    """Generate the sql task for `seed` (template = seed mod number of templates)."""
    rng = rng_for(FAMILY, seed)
    fields = TEMPLATES[seed % len(TEMPLATES)](rng)
    return TaskSpec(family=FAMILY, seed=seed, **fields)
