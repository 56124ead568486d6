"""kvtier's pure-Python `PagedCacheGroupAllocator` / `PagedCacheGroupTable`
(python/kvtier/_tokenspeed_paged.py) against the reference module's classes.

The module is loaded from its file, so these tests need neither kvtier's native
extension nor an installed kvtier. The reference wheel comes from the `reference`
fixture of conftest.py (KVTIER_REFERENCE_WHEEL, default target/tools/reference-wheel):
without it the tests that need it skip, saying so, and fail under CI=true.

* a few readable tests of the semantics, run on both sides where the wheel is there;
* a randomized differential check: the same random operations on both sides (pages,
  tables made and dropped, bad arguments, configs changed through `config()`), every
  return value, exception type and message, and the full state compared after each.
"""

from __future__ import annotations

import gc
import importlib.util
import pathlib
import random

import pytest

MODULE_PATH = pathlib.Path(__file__).resolve().parents[1] / "python" / "kvtier" / "_tokenspeed_paged.py"


def _load_ours():
    spec = importlib.util.spec_from_file_location("kvtier_tokenspeed_paged", MODULE_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


paged = _load_ours()

FULL_HISTORY, SLIDING_WINDOW = 0, 1


class Retention:
    """Stands in for the PagedCacheRetention enum members (`.value`, `.name`)."""

    def __init__(self, value):
        self.value = value
        self.name = ["FullHistory", "SlidingWindow"][value]


class DuckConfig:
    """A PagedCacheGroupConfig look-alike: what `PagedCacheGroupAllocator` needs of one."""

    def __init__(self, group_id="", rows_per_page=0, entry_stride_tokens=0, total_pages=0,
                 retention=None, sliding_window_tokens=None, family=0):
        self.group_id = group_id
        self.rows_per_page = rows_per_page
        self.entry_stride_tokens = entry_stride_tokens
        self.total_pages = total_pages
        self.retention = retention if retention is not None else Retention(FULL_HISTORY)
        self.sliding_window_tokens = sliding_window_tokens
        self.family = family

    def raw_tokens_per_page(self):
        return self.rows_per_page * self.entry_stride_tokens

    def validate(self):
        def bad(what):
            raise ValueError(f"PagedCacheGroupConfig: {what}")

        if not self.group_id:
            bad("group_id must be non-empty")
        if self.rows_per_page <= 0:
            bad("rows_per_page must be > 0")
        if self.entry_stride_tokens <= 0:
            bad("entry_stride_tokens must be > 0")
        if self.total_pages < 1:
            bad("total_pages must include the dummy page")
        if self.retention.value == SLIDING_WINDOW and (
            self.sliding_window_tokens is None or self.sliding_window_tokens <= 0
        ):
            bad("sliding_window_tokens must be > 0 for sliding groups")


class Side:
    """One implementation: its allocator/table classes and a config maker."""

    def __init__(self, name, allocator_cls, table_cls, make_config, retention):
        self.name = name
        self.Allocator = allocator_cls
        self.Table = table_cls
        self.make_config = make_config
        self.retention = retention  # value -> enum member (for config mutation)


def ours_side(config_module=None):
    if config_module is None:
        return Side("ours", paged.PagedCacheGroupAllocator, paged.PagedCacheGroupTable,
                    lambda *a: DuckConfig(*a[:4], Retention(a[4]), *a[5:]), Retention)
    members = {0: config_module.PagedCacheRetention.FullHistory, 1: config_module.PagedCacheRetention.SlidingWindow}
    return Side("ours", paged.PagedCacheGroupAllocator, paged.PagedCacheGroupTable,
                lambda *a: config_module.PagedCacheGroupConfig(*a[:4], members[a[4]], *a[5:]), members.get)


def reference_side(ts):
    members = {0: ts.PagedCacheRetention.FullHistory, 1: ts.PagedCacheRetention.SlidingWindow}
    return Side("reference", ts.PagedCacheGroupAllocator, ts.PagedCacheGroupTable,
                lambda *a: ts.PagedCacheGroupConfig(*a[:4], members[a[4]], *a[5:]), members.get)


@pytest.fixture(params=["ours", "reference"])
def side(request):
    if request.param == "ours":
        return ours_side()
    return reference_side(request.getfixturevalue("reference"))


def make(side, rows=1, stride=1, total=5, retention=FULL_HISTORY, window=None, group="g"):
    return side.Allocator(side.make_config(group, rows, stride, total, retention, window))


# ---------------------------------------------------------------------------------------
# Readable tests (both sides)
# ---------------------------------------------------------------------------------------


def test_allocate_pops_from_the_back_and_is_all_or_nothing(side):
    alloc = make(side, total=5)
    assert (alloc.total_pages(), alloc.available_pages()) == (5, 4)
    assert alloc.allocate(2) == [4, 3]
    assert alloc.allocate(0) == [] and alloc.allocate(-3) == []
    assert alloc.failed_alloc_count() == 0  # n <= 0 is not a failure
    assert alloc.allocate(3) == []  # only 2 left: nothing taken, one failure
    assert (alloc.failed_alloc_count(), alloc.available_pages()) == (1, 2)
    assert alloc.allocate(2) == [2, 1]
    assert alloc.allocated_pages_total() == 4
    one = make(side, total=1)  # the dummy page only
    assert (one.available_pages(), one.allocate(1), one.failed_alloc_count()) == (0, [], 1)


def test_deallocate_checks_nothing_and_appends_in_order(side):
    alloc = make(side, total=3)
    alloc.deallocate([0, 7, 7, -5])  # dummy page, unknown ids, duplicates: all taken
    assert (alloc.available_pages(), alloc.released_pages_total()) == (6, 4)
    assert alloc.allocate(6) == [-5, 7, 7, 0, 2, 1]


def test_constructor_validates_the_config(side):
    with pytest.raises(ValueError, match="^PagedCacheGroupConfig: group_id must be non-empty$"):
        make(side, group="")
    with pytest.raises(ValueError, match="^PagedCacheGroupConfig: total_pages must include the dummy page$"):
        make(side, total=0)
    with pytest.raises(ValueError, match="sliding_window_tokens must be > 0 for sliding groups$"):
        make(side, retention=SLIDING_WINDOW, window=None)
    # the reference sizes its pool before it validates: a negative size fails there first
    with pytest.raises(ValueError, match="^vector::reserve$"):
        make(side, group="", total=-1)


def test_the_allocator_keeps_a_copy_and_config_returns_it(side):
    cfg = side.make_config("g", 2, 2, 6, FULL_HISTORY, None)
    alloc = side.Allocator(cfg)
    cfg.group_id, cfg.rows_per_page = "changed", 9  # the caller's object: not seen
    assert (alloc.config().group_id, alloc.config().rows_per_page) == ("g", 2)
    table = side.Table(alloc)
    alloc.config().group_id = "renamed"  # through config(): seen, by the table too
    alloc.config().total_pages = 100  # but the pool keeps its size
    assert alloc.total_pages() == 6
    with pytest.raises(RuntimeError, match="^PagedCacheGroupTable::Acquire: failed to allocate pages for group renamed$"):
        table.acquire(100)


def test_acquire_covers_the_target_and_fails_without_side_effects(side):
    alloc = make(side, rows=2, stride=3, total=4)  # 6 raw tokens a page, 3 free pages
    table = side.Table(alloc)
    table.acquire(7)  # ceil(ceil(7 / 3) / 2) = 2 pages
    assert (table.page_ids(), table.raw_token_cursor(), table.raw_tokens_per_page()) == ([3, 2], 7, 6)
    table.acquire(5)  # below the cursor: nothing
    assert (table.page_ids(), table.raw_token_cursor()) == ([3, 2], 7)
    with pytest.raises(RuntimeError, match="^PagedCacheGroupTable::Acquire: failed to allocate pages for group g$"):
        table.acquire(19)  # needs 2 more, 1 free: none taken, the cursor stays
    assert (table.page_ids(), table.raw_token_cursor(), alloc.available_pages()) == ([3, 2], 7, 1)
    assert alloc.failed_alloc_count() == 1
    table.acquire(18)
    assert (table.page_ids(), table.owned_pages_count(), table.borrowed_pages_count()) == ([3, 2, 1], 3, 0)
    with pytest.raises(ValueError, match="^PagedCacheGroupTable::Acquire: target must be >= 0$"):
        table.acquire(-1)


def test_release_skipped_drops_front_pages_of_sliding_tables_only(side):
    full = side.Table(make(side, rows=1, stride=2, total=8))
    full.acquire(8)
    assert full.release_skipped(6) == [] and full.base_logical_page() == 0

    alloc = make(side, rows=1, stride=2, total=8, retention=SLIDING_WINDOW, window=4)
    table = side.Table(alloc)
    assert (table.is_sliding(), table.sliding_window_tokens()) == (True, 4)
    table.acquire(8)  # pages for logical 0..3
    assert table.page_ids() == [7, 6, 5, 4]
    assert table.release_skipped(5) == [7, 6]  # logical pages 0 and 1 lie below token 5
    # page_ids() holds the live pages only; column c is logical page base + c
    assert (table.page_ids(), table.base_logical_page(), table.released_pages_count()) == ([5, 4], 2, 2)
    assert (table.size(), table.raw_token_cursor()) == (2, 8)  # the cursor does not move
    assert alloc.released_pages_total() == 0 and alloc.available_pages() == 5  # back, uncounted
    assert table.release_skipped(5) == []  # idempotent
    # past the end: only the pages there are dropped, the base stops at the table's end
    assert table.release_skipped(100) == [5, 4] and table.base_logical_page() == 4
    # on an empty table the base jumps to the window, and acquire starts there
    assert table.release_skipped(100) == [] and table.base_logical_page() == 50
    table.acquire(104)  # logical pages 50 and 51
    assert table.page_ids() == [4, 5]
    assert table.release_all() == [4, 5]
    assert (table.base_logical_page(), table.raw_token_cursor(), table.size()) == (0, 0, 0)


def test_dropping_a_table_returns_its_pages(side):
    alloc = make(side, total=6)
    table = side.Table(alloc)
    table.acquire(3)
    assert table.page_ids() == [5, 4, 3]
    del table
    gc.collect()
    assert (alloc.available_pages(), alloc.released_pages_total()) == (5, 0)
    assert alloc.allocate(5) == [3, 4, 5, 2, 1]


def test_arguments_are_int32(side):
    alloc = make(side, total=10)
    assert alloc.allocate("2") == [9, 8]  # like int(): strings and __index__ are accepted
    assert alloc.allocate(True) == [7]
    for bad in (1.0, "x", None, 2**31, -(2**31) - 1, [1]):
        with pytest.raises(TypeError, match=r"^allocate\(\): incompatible function arguments"):
            alloc.allocate(bad)
    alloc.deallocate((7,))
    alloc.deallocate(range(2))
    for bad in ("12", b"12", {1: 2}, {1}, iter([1]), [1.5], 5):
        with pytest.raises(TypeError, match=r"^deallocate\(\): incompatible function arguments"):
            alloc.deallocate(bad)
    table = side.Table(alloc)
    with pytest.raises(TypeError):
        table.acquire(2.0)
    with pytest.raises(TypeError):
        table.release_skipped(None)
    with pytest.raises(TypeError):
        side.Table(None)
    with pytest.raises(TypeError):
        side.Allocator(None)


def test_kvtier_config_is_accepted_when_the_extension_is_built():
    try:
        import kvtier.compat as compat  # noqa: F401  (needs kvtier's native extension)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"kvtier's native extension is not importable here ({exc!r}); "
                    "its PagedCacheGroupConfig is not exercised")
    side = ours_side(compat)
    alloc = make(side, rows=2, stride=2, total=5, retention=SLIDING_WINDOW, window=8)
    table = side.Table(alloc)
    table.acquire(9)
    assert (table.page_ids(), table.sliding_window_tokens(), table.release_skipped(4)) == ([4, 3, 2], 8, [4])


# ---------------------------------------------------------------------------------------
# Randomized differential check
# ---------------------------------------------------------------------------------------

TABLE_QUERIES = (
    "page_ids", "size", "active_pages_count", "owned_pages_count", "borrowed_pages_count",
    "released_pages_count", "base_logical_page", "raw_token_cursor", "rows_per_page",
    "entry_stride_tokens", "raw_tokens_per_page", "is_sliding", "sliding_window_tokens",
)
ALLOCATOR_QUERIES = (
    "total_pages", "available_pages", "allocated_pages_total", "released_pages_total",
    "failed_alloc_count",
)
BIG = 2**31 - 1


def outcome(call):
    """What a call did, comparable across the sides: ("ok", value) or (exception, message);
    for a TypeError only its first line (the rest names each side's own types)."""
    try:
        return ("ok", call())
    except Exception as exc:  # noqa: BLE001
        message = str(exc)
        if isinstance(exc, TypeError):
            message = message.split("\n", 1)[0]
        return (type(exc).__name__, message)


def state(world):
    alloc, tables = world
    snapshot = {name: outcome(getattr(alloc, name)) for name in ALLOCATOR_QUERIES}
    cfg = alloc.config()
    snapshot["config"] = (cfg.group_id, cfg.rows_per_page, cfg.entry_stride_tokens, cfg.total_pages,
                          cfg.retention.value, cfg.sliding_window_tokens)
    snapshot["config_is_stable"] = alloc.config() is cfg
    snapshot["tables"] = [{name: outcome(getattr(t, name)) for name in TABLE_QUERIES} for t in tables]
    return snapshot


def random_int_arg(rng, typical):
    """Mostly `typical`; sometimes an edge value or something that is not an int32."""
    roll = rng.random()
    if roll < 0.88:
        return typical
    return rng.choice([0, -1, BIG, -(2**31), 2**31, -(2**31) - 1, 1.0, 2.5, "3", "x", None, True,
                       [1], b"2"])


def random_config_args(rng):
    rows, stride = rng.randint(1, 4), rng.randint(1, 4)
    total = rng.randint(1, 14)
    retention = rng.choice([FULL_HISTORY, SLIDING_WINDOW])
    window = rng.choice([None, rng.randint(1, 24)]) if retention == FULL_HISTORY else rng.randint(1, 24)
    group = "grp%d" % rng.randint(0, 9)
    if rng.random() < 0.06:  # an invalid config: the constructor's ValueError
        which = rng.randrange(5)
        if which == 0:
            group = ""
        elif which == 1:
            rows = rng.choice([0, -2])
        elif which == 2:
            stride = rng.choice([0, -1])
        elif which == 3:
            total = rng.choice([0, -3])
        else:
            retention, window = SLIDING_WINDOW, rng.choice([None, 0, -4])
    if rng.random() < 0.04:  # page arithmetic near the int32 limits
        rows, stride = rng.choice([(65536, 65536), (46341, 46341), (2, 2**30), (1, BIG), (BIG, 1)])
    return (group, rows, stride, total, retention, window)


def random_op(rng, n_tables, cursors, raw_per_page):
    """One operation as plain data, the same for both sides."""
    roll = rng.random()
    if roll < 0.10:
        return ("allocate", random_int_arg(rng, rng.randint(-2, 6)))
    if roll < 0.17:
        return ("deallocate", None)  # filled in from the pages held (see run_ops)
    if roll < 0.22 or n_tables == 0:
        return ("new_table",)
    t = rng.randrange(n_tables)
    if roll < 0.26:
        return ("drop_table", t)
    if roll < 0.55:
        cursor = cursors[t]
        target = max(0, cursor + rng.randint(-3, 3 * max(1, raw_per_page)))
        if rng.random() < 0.04:
            target = rng.choice([-1, -5, BIG, BIG - 1])
        return ("acquire", t, random_int_arg(rng, target))
    if roll < 0.78:
        cursor = cursors[t]
        bound = rng.randint(-2, cursor + 2 * max(1, raw_per_page))
        if rng.random() < 0.05:
            bound = rng.choice([BIG, 10**6])
        return ("release_skipped", t, random_int_arg(rng, bound))
    if roll < 0.86:
        return ("release_all", t)
    if roll < 0.92:
        field = rng.choice(["group_id", "rows_per_page", "entry_stride_tokens", "total_pages",
                            "retention", "sliding_window_tokens"])
        if field == "group_id":
            value = "renamed%d" % rng.randint(0, 3)
        elif field in ("rows_per_page", "entry_stride_tokens"):
            value = rng.randint(1, 5)  # 0 would make the reference divide by zero
        elif field == "total_pages":
            value = rng.randint(0, 40)
        elif field == "retention":
            value = rng.choice([FULL_HISTORY, SLIDING_WINDOW])
        else:
            value = rng.choice([None, 0, rng.randint(1, 20)])
        return ("set_config", field, value)
    return ("queries",)


def apply(side, world, op, held):
    """Runs `op` on one side; returns what it returned (or raised)."""
    alloc, tables = world
    kind = op[0]
    if kind == "allocate":
        result = outcome(lambda: alloc.allocate(op[1]))
        if result[0] == "ok":
            held.extend(result[1])
        return result
    if kind == "deallocate":
        return outcome(lambda: alloc.deallocate(op[1]))
    if kind == "new_table":
        tables.append(side.Table(alloc))
        return ("ok", None)
    if kind == "drop_table":
        del tables[op[1]]  # its owned pages go back to the pool right away
        return ("ok", None)
    if kind == "acquire":
        return outcome(lambda: tables[op[1]].acquire(op[2]))
    if kind == "release_skipped":
        return outcome(lambda: tables[op[1]].release_skipped(op[2]))
    if kind == "release_all":
        return outcome(lambda: tables[op[1]].release_all())
    if kind == "set_config":
        field, value = op[1], op[2]
        if field == "retention":
            value = side.retention(value)
        setattr(alloc.config(), field, value)
        return ("ok", None)
    if kind == "queries":
        return state(world)
    raise AssertionError(op)


def run_sequence(seed, ours, theirs, n_ops):
    rng = random.Random(seed)
    args = random_config_args(rng)
    built = {}
    for side in (ours, theirs):
        built[side.name] = outcome(lambda s=side: s.Allocator(s.make_config(*args)))
    assert built["ours"][0] == built["reference"][0], (seed, args, built)
    if built["ours"][0] != "ok":
        assert built["ours"] == built["reference"], (seed, args, built)
        return "invalid"
    worlds = {"ours": (built["ours"][1], []), "reference": (built["reference"][1], [])}
    held = {"ours": [], "reference": []}
    log = [("config", args)]
    for step in range(n_ops):
        alloc = worlds["reference"][0]
        cfg = alloc.config()
        raw_per_page = cfg.rows_per_page * cfg.entry_stride_tokens
        cursors = [t.raw_token_cursor() for t in worlds["reference"][1]]
        op = random_op(rng, len(cursors), cursors, raw_per_page)
        if op[0] == "deallocate":
            pages = held["reference"]
            roll = rng.random()
            if roll < 0.7 and pages:
                chosen = rng.sample(pages, rng.randint(1, len(pages)))
                for page in chosen:
                    pages.remove(page)
                    held["ours"].remove(page)
                op = ("deallocate", chosen)
            elif roll < 0.8:
                op = ("deallocate", [0, rng.randint(-3, 40)])  # not from this pool: taken anyway
            elif roll < 0.9:
                op = ("deallocate", rng.choice([(), range(0), ("4",), [1.5], "12", None, [2**31]]))
            else:
                op = ("deallocate", [])
        log.append(op)
        results = {name: apply(side, worlds[name], op, held[name])
                   for name, side in (("ours", ours), ("reference", theirs))}
        where = f"seed {seed}, step {step}, ops so far:\n" + "\n".join(map(repr, log))
        assert results["ours"] == results["reference"], where
        assert state(worlds["ours"]) == state(worlds["reference"]), where
    # dropping everything returns the same pages in the same order
    for name in ("ours", "reference"):
        worlds[name][1].clear()
    gc.collect()
    final = {name: (state(worlds[name]), worlds[name][0].allocate(worlds[name][0].available_pages()))
             for name in ("ours", "reference")}
    assert final["ours"] == final["reference"], f"seed {seed}, after dropping the tables"
    return "ok"


@pytest.mark.parametrize("config_kind", ["reference_config", "duck_config"])
def test_randomized_differential_against_the_reference(reference, config_kind):
    theirs = reference_side(reference)
    # ours, fed either the reference's own config objects or a pure-Python look-alike
    ours = ours_side(reference) if config_kind == "reference_config" else ours_side()
    counts = {"ok": 0, "invalid": 0}
    for seed in range(400):
        counts[run_sequence(seed, ours, theirs, n_ops=random.Random(~seed).randint(5, 80))] += 1
    assert counts["ok"] > 300 and counts["invalid"] > 5, counts
