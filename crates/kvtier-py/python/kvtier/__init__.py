"""kvtier: a KV-cache scheduler for LLM inference engines.

Each step the scheduler picks the requests to run (chunked prefill, decode,
retraction), hands the engine a plan with page tables, and moves KV between device
and host memory. A typical engine loop::

    import kvtier

    config = kvtier.Config(page_size=16, device_pages=1024, host_pages=4096)
    with kvtier.System(config) as system:
        system.submit([kvtier.Request("r1", prompt)])
        plan = system.next_plan()
        ...  # run the copies and the forward rows
        system.advance([kvtier.ExtendResult("r1", [token])])

`kvtier.compat` (also installed as the top-level package `tokenspeed_scheduler`) is
the reference scheduler's API over the same scheduler, for engines written against
TokenSpeed's `tokenspeed_scheduler` module.
"""

from kvtier._native import (
    Abort,
    Backup,
    BackupDone,
    Config,
    Copy,
    ExtendResult,
    Finish,
    Group,
    KvEvent,
    LoadBackFailed,
    Mamba,
    Plan,
    Prefetch,
    PrefetchDone,
    RejectedError,
    Request,
    Row,
    System,
    TraceRequest,
    UpdateReserve,
    WriteBackDone,
    __version__,
    read_trace,
    replay,
    run_workload,
)

__all__ = [
    "Abort",
    "Backup",
    "BackupDone",
    "Config",
    "Copy",
    "ExtendResult",
    "Finish",
    "Group",
    "KvEvent",
    "LoadBackFailed",
    "Mamba",
    "Plan",
    "Prefetch",
    "PrefetchDone",
    "RejectedError",
    "Request",
    "Row",
    "System",
    "TraceRequest",
    "UpdateReserve",
    "WriteBackDone",
    "__version__",
    "read_trace",
    "replay",
    "run_workload",
]
