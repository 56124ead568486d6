"""`PagedCacheGroupAllocator` and `PagedCacheGroupTable` of the `tokenspeed_scheduler`
0.1.0 API, in pure Python.

They are standalone utilities of the reference module (nothing in its `Scheduler` takes
or returns them), so kvtier provides them here with the reference's observable
behaviour, checked against the reference wheel by tests/test_paged_utils.py:

* The allocator keeps its own copy of the config it is given (later changes to the
  caller's object do not reach it); `config()` hands out that copy, and changes made
  through it do reach the allocator and its tables, as in the reference. The pool size
  (`total_pages()`) is fixed when the allocator is made.
* The constructor validates the config (`config.validate()`'s `ValueError`), except that
  a negative `total_pages` is `ValueError("vector::reserve")` whatever else is wrong, as
  the reference sizes its pool before validating.
* The free list starts as `[1, .., total_pages - 1]` (page 0 is the dummy page) and
  pages are taken from its end; returned pages are appended to it, in order.
* `allocate(n)` is all or nothing: `[]` for `n <= 0` (not counted as a failure) and
  for `n` above `available_pages()` (counted in `failed_alloc_count()`).
* `deallocate(pages)` checks nothing (ids outside the pool, duplicates and page 0 are
  all taken) and counts `len(pages)` in `released_pages_total()`. Pages that a table
  gives back (`release_skipped`, `release_all`, the table being destroyed) return to the
  pool without being counted there.
* Arguments are C `int32`s, converted as the reference's bindings convert them: `int`
  (and `bool`), or anything `int()` accepts except a `float` (so `"3"` and objects with
  `__int__`/`__index__` are taken); out of range or not convertible is a `TypeError`.
  Sequences are lists, tuples or other sequences (not `str`/`bytes`, not dicts).
* The table's page arithmetic is 32-bit two's-complement with C division, like the
  reference's; it only shows with values near 2**31 or with a config changed to
  something invalid after the allocator was made.
"""

from __future__ import annotations

import types

__all__ = ["PagedCacheGroupAllocator", "PagedCacheGroupTable"]

_MODULE = "tokenspeed_scheduler"
_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1
_SLIDING_WINDOW = 1  # PagedCacheRetention.SlidingWindow

# The fields a PagedCacheGroupConfig (ours, the reference's, or a look-alike) carries.
_CONFIG_FIELDS = (
    "group_id",
    "rows_per_page",
    "entry_stride_tokens",
    "total_pages",
    "retention",
    "sliding_window_tokens",
    "family",
)
_REQUIRED_CONFIG_ATTRS = (
    "group_id",
    "rows_per_page",
    "entry_stride_tokens",
    "total_pages",
    "retention",
    "sliding_window_tokens",
    "validate",
)


# ---------------------------------------------------------------------------------------
# Argument conversion (what the reference's nanobind bindings accept)
# ---------------------------------------------------------------------------------------


class _Incompatible(Exception):
    """An argument the reference's bindings would not convert."""


def _type_name(tp: type) -> str:
    if tp.__module__ == "builtins":
        return tp.__qualname__
    return f"{tp.__module__}.{tp.__qualname__}"


def _incompatible(signature: str, *args: object) -> TypeError:
    name = signature.split("(", 1)[0]
    invoked = ", ".join(_type_name(type(a)) for a in args)
    return TypeError(
        f"{name}(): incompatible function arguments. The following argument types are "
        f"supported:\n    1. {signature}\n\nInvoked with types: {invoked}"
    )


def _int32(value: object) -> int:
    if type(value) is int:
        number = value
    elif isinstance(value, float):
        raise _Incompatible
    else:
        try:
            number = int(value)  # the conversion CPython's PyNumber_Long does
        except Exception:
            raise _Incompatible from None
    if number < _INT32_MIN or number > _INT32_MAX:
        raise _Incompatible
    return number


def _is_sequence(value: object) -> bool:
    """CPython's PySequence_Check, as seen from Python."""
    if isinstance(value, (dict, types.MappingProxyType)):
        return False
    return hasattr(type(value), "__getitem__")


def _int32_list(value: object) -> list[int]:
    kind = type(value)
    if kind is str or kind is bytes:
        raise _Incompatible
    if kind is list or kind is tuple:
        items = value
    elif _is_sequence(value):
        try:
            items = tuple(value)
        except Exception:
            raise _Incompatible from None
    else:
        raise _Incompatible
    return [_int32(item) for item in items]


# ---------------------------------------------------------------------------------------
# 32-bit arithmetic
# ---------------------------------------------------------------------------------------


def _wrap(value: int) -> int:
    """`value` as a C int32 after two's-complement wrap-around."""
    return ((value - _INT32_MIN) & 0xFFFFFFFF) + _INT32_MIN


def _cdiv(numer: int, denom: int) -> int:
    """C integer division (rounds toward zero), result wrapped to int32."""
    quotient = abs(numer) // abs(denom)
    if (numer < 0) != (denom < 0):
        quotient = -quotient
    return _wrap(quotient)


def _ceil_div_nonneg(numer: int, denom: int) -> int:
    """Ceiling division for positive numerators; 0 for the others."""
    if numer <= 0:
        return 0
    return _cdiv(_wrap(numer + denom - 1), denom)


# ---------------------------------------------------------------------------------------
# Config helpers
# ---------------------------------------------------------------------------------------


def _retention_value(retention: object) -> int:
    return int(getattr(retention, "value", retention))


def _is_config(value: object) -> bool:
    return all(hasattr(value, attr) for attr in _REQUIRED_CONFIG_ATTRS)


def _private_copy(config):
    """A copy of `config` of the same class, which later changes to `config` leave alone."""
    try:
        duplicate = type(config)()
        for field in _CONFIG_FIELDS:
            if hasattr(config, field):
                setattr(duplicate, field, getattr(config, field))
        return duplicate
    except Exception:
        pass
    try:
        import copy

        return copy.copy(config)
    except Exception:
        return config


# ---------------------------------------------------------------------------------------
# The allocator
# ---------------------------------------------------------------------------------------


class PagedCacheGroupAllocator:
    """The page pool of one paged-cache group, with counters."""

    __slots__ = ("_config", "_total", "_free", "_allocated_total", "_released_total", "_failed")

    def __init__(self, config) -> None:
        if not _is_config(config):
            raise _incompatible(
                f"__init__(self, config: {_MODULE}.PagedCacheGroupConfig) -> None", self, config
            )
        own = _private_copy(config)
        total = own.total_pages
        if total < 0:
            # The reference sizes its free list before it validates the config: a
            # negative size fails there, ahead of validate()'s own messages.
            raise ValueError("vector::reserve")
        self._config = own
        self._total = total
        self._free = list(range(1, total))  # page 0 is the dummy page
        self._allocated_total = 0
        self._released_total = 0
        self._failed = 0
        own.validate()

    # Pool operations shared with the table -----------------------------------------

    def _take(self, count: int) -> list[int] | None:
        """`count` (> 0) pages from the end of the free list, or None (and one more
        failure) when fewer are free."""
        free = self._free
        if count > len(free):
            self._failed += 1
            return None
        taken = free[len(free) - count :]
        taken.reverse()
        del free[len(free) - count :]
        self._allocated_total += count
        return taken

    def _give_back(self, pages: list[int]) -> None:
        """Pages a table lets go of: back to the pool, not counted as released."""
        self._free.extend(pages)

    # Public API ----------------------------------------------------------------------

    def allocate(self, num_pages) -> list[int]:
        try:
            count = _int32(num_pages)
        except _Incompatible:
            raise _incompatible("allocate(self, num_pages: int) -> list[int]", self, num_pages) from None
        if count <= 0:
            return []
        taken = self._take(count)
        return [] if taken is None else taken

    def deallocate(self, pages) -> None:
        try:
            ids = _int32_list(pages)
        except _Incompatible:
            raise _incompatible(
                "deallocate(self, pages: collections.abc.Sequence[int]) -> None", self, pages
            ) from None
        self._free.extend(ids)
        self._released_total += len(ids)

    def config(self):
        return self._config

    def total_pages(self) -> int:
        return self._total

    def available_pages(self) -> int:
        return len(self._free)

    def allocated_pages_total(self) -> int:
        return self._allocated_total

    def released_pages_total(self) -> int:
        return self._released_total

    def failed_alloc_count(self) -> int:
        return self._failed

    def __reduce_ex__(self, protocol):
        raise TypeError(f"cannot pickle {type(self).__name__!r} object")


# ---------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------


class PagedCacheGroupTable:
    """One request's pages in one paged-cache group.

    `page_ids()[c]` is the page of absolute logical page `base_logical_page() + c`.
    The ids are the borrowed ones (pages a prefix-cache snapshot owns; the 0.1.0 Python
    API has no way to add any, so this is always empty from Python) followed by the
    owned ones (taken from the allocator by `acquire`)."""

    __slots__ = ("_allocator", "_borrowed", "_owned", "_cursor", "_base", "_committed")

    def __init__(self, allocator) -> None:
        if not isinstance(allocator, PagedCacheGroupAllocator):
            raise _incompatible(
                f"__init__(self, allocator: {_MODULE}.PagedCacheGroupAllocator) -> None", self, allocator
            )
        self._allocator = allocator
        self._borrowed: list[int] = []
        self._owned: list[int] = []
        self._cursor = 0  # raw tokens reserved, exclusive
        self._base = 0  # logical pages dropped from the front
        self._committed = 0  # raw tokens published to a snapshot (never from Python)

    def __del__(self) -> None:
        # A dropped table gives its owned pages back to the pool.
        owned = getattr(self, "_owned", None)
        allocator = getattr(self, "_allocator", None)
        if owned and allocator is not None:
            try:
                allocator._give_back(owned)
            except Exception:
                pass
            self._owned = []

    def __reduce_ex__(self, protocol):
        raise TypeError(f"cannot pickle {type(self).__name__!r} object")

    def _config(self):
        return self._allocator._config

    # Mutations -----------------------------------------------------------------------

    def acquire(self, target_raw_tokens_exclusive) -> None:
        """Grows the owned pages so that they cover raw tokens [base page, target)."""
        try:
            target = _int32(target_raw_tokens_exclusive)
        except _Incompatible:
            raise _incompatible(
                "acquire(self, target_raw_tokens_exclusive: int) -> None", self, target_raw_tokens_exclusive
            ) from None
        if target < 0:
            raise ValueError("PagedCacheGroupTable::Acquire: target must be >= 0")
        if target <= self._cursor:
            return
        config = self._config()
        rows = config.rows_per_page
        entries = _ceil_div_nonneg(target, config.entry_stride_tokens)
        pages_needed = _cdiv(_wrap(entries + rows - 1), rows)
        pages_have = _wrap(self._base + len(self._borrowed) + len(self._owned))
        missing = _wrap(pages_needed - pages_have)
        if missing > 0:
            fresh = self._allocator._take(missing)
            if fresh is None:
                raise RuntimeError(
                    f"PagedCacheGroupTable::Acquire: failed to allocate pages for group {config.group_id}"
                )
            self._owned.extend(fresh)
        self._cursor = target

    def release_skipped(self, window_lower_bound) -> list[int]:
        """Sliding groups only: drops the front pages that lie wholly below
        `window_lower_bound` and returns their ids (borrowed ones first). On an empty
        table it moves the base page there instead, so that the next `acquire` starts
        at the window. The token cursor does not move."""
        try:
            bound = _int32(window_lower_bound)
        except _Incompatible:
            raise _incompatible(
                "release_skipped(self, window_lower_bound: int) -> list[int]", self, window_lower_bound
            ) from None
        if bound <= 0:
            return []
        config = self._config()
        if _retention_value(config.retention) != _SLIDING_WINDOW:
            return []
        raw_per_page = _wrap(config.rows_per_page * config.entry_stride_tokens)
        if raw_per_page <= 0:
            return []
        first_live = bound // raw_per_page
        if first_live <= self._base:
            return []
        size = len(self._borrowed) + len(self._owned)
        if size == 0:
            self._base = first_live
            return []
        drop = min(first_live - self._base, size)
        from_borrowed = min(drop, len(self._borrowed))
        released = self._borrowed[:from_borrowed]
        del self._borrowed[:from_borrowed]
        from_owned = drop - from_borrowed
        if from_owned > 0:
            dropped = self._owned[:from_owned]
            del self._owned[:from_owned]
            released.extend(dropped)
            self._allocator._give_back(dropped)
        self._base += drop
        return released

    def release_all(self) -> list[int]:
        """Lets go of every page (owned ones back to the pool) and resets the table;
        returns the ids, borrowed ones first."""
        released = self._borrowed + self._owned
        owned = self._owned
        self._borrowed = []
        self._owned = []
        if owned:
            self._allocator._give_back(owned)
        self._cursor = 0
        self._base = 0
        self._committed = 0
        return released

    # Queries ---------------------------------------------------------------------------

    def page_ids(self) -> list[int]:
        return self._borrowed + self._owned

    def size(self) -> int:
        return len(self._borrowed) + len(self._owned)

    def active_pages_count(self) -> int:
        return len(self._borrowed) + len(self._owned)

    def owned_pages_count(self) -> int:
        return len(self._owned)

    def borrowed_pages_count(self) -> int:
        return len(self._borrowed)

    def released_pages_count(self) -> int:
        return self._base

    def base_logical_page(self) -> int:
        return self._base

    def raw_token_cursor(self) -> int:
        return self._cursor

    def rows_per_page(self) -> int:
        return self._config().rows_per_page

    def entry_stride_tokens(self) -> int:
        return self._config().entry_stride_tokens

    def raw_tokens_per_page(self) -> int:
        config = self._config()
        return _wrap(config.rows_per_page * config.entry_stride_tokens)

    def is_sliding(self) -> bool:
        return _retention_value(self._config().retention) == _SLIDING_WINDOW

    def sliding_window_tokens(self) -> int:
        config = self._config()
        if _retention_value(config.retention) != _SLIDING_WINDOW:
            return 0
        window = config.sliding_window_tokens
        return 0 if window is None else window


PagedCacheGroupAllocator.__module__ = _MODULE
PagedCacheGroupTable.__module__ = _MODULE
