"""The reference scheduler's API (`tokenspeed_scheduler` 0.1.0) over kvtier.

`import tokenspeed_scheduler` gives the same module; this name exists so that a
program can hold kvtier's module and the reference's side by side (the differential
tests do).
"""

from kvtier._native import tokenspeed as _ext
from kvtier._tokenspeed_paged import PagedCacheGroupAllocator, PagedCacheGroupTable

PD = _ext.PD
Cache = _ext.Cache
DisaggregationMode = _ext.DisaggregationMode
ExecutionEvent = _ext.ExecutionEvent
ExecutionPlan = _ext.ExecutionPlan
Forward = _ext.Forward
ForwardEvent = _ext.ForwardEvent
KVEvent = _ext.KVEvent
PagedCacheGroupConfig = _ext.PagedCacheGroupConfig
PagedCacheGroupFamily = _ext.PagedCacheGroupFamily
PagedCacheRetention = _ext.PagedCacheRetention
PrefixCacheAdjunctSpec = _ext.PrefixCacheAdjunctSpec
RequestSpec = _ext.RequestSpec
Scheduler = _ext.Scheduler
SchedulerConfig = _ext.SchedulerConfig
SchedulerStats = _ext.SchedulerStats

__all__ = [
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStats",
    "DisaggregationMode",
    "RequestSpec",
    "PagedCacheRetention",
    "PagedCacheGroupConfig",
    "PagedCacheGroupAllocator",
    "PagedCacheGroupFamily",
    "PagedCacheGroupTable",
    "PrefixCacheAdjunctSpec",
    "ExecutionPlan",
    "Forward",
    "PD",
    "Cache",
    "KVEvent",
    "ExecutionEvent",
    "ForwardEvent",
]

del _ext
