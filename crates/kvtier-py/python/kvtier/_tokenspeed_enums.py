"""The enums of the `tokenspeed_scheduler` API, as real `enum.Enum` classes (the
reference module's enums are, too: `.name`, `.value`, `Role(2)`; `Role.Fused == 2` is
False). The native module reads `.value` when one is set and builds them when read."""

import enum


class DisaggregationMode(enum.Enum):
    none = 0
    prefill = 1
    decode = 2


class Role(enum.Enum):
    P = 0
    D = 1
    Fused = 2


class PagedCacheRetention(enum.Enum):
    FullHistory = 0
    SlidingWindow = 1


class PagedCacheGroupFamily(enum.Enum):
    History = 0
    State = 1


class CacheKind(enum.Enum):
    KV = 0
    MAMBA = 1
