"""Type stubs of kvtier's Python API (the classes live in the native module)."""

from types import TracebackType
from typing import Any, Literal, Sequence

__version__: str

Runtime = Literal["actix", "deterministic", "direct"]

class RejectedError(ValueError):
    """Some items of a submit or advance were refused; the others were applied."""

    rejected: list[tuple[int, str]]
    """`(index, message)` of each refused item."""

class Mamba:
    """The recurrent-state side of a hybrid (Mamba) model."""

    def __init__(self, *, device_slots: int = 64, host_slots: int = 0, chunk: int = 64) -> None: ...

class Group:
    """One paged-cache group (full history, sliding window, or compressed state)."""

    def __init__(
        self,
        id: str,
        *,
        rows_per_page: int,
        total_pages: int,
        entry_stride_tokens: int = 1,
        window: int | None = None,
        state: bool = False,
    ) -> None: ...

class Config:
    """The scheduler's configuration; validated when built (`ValueError`)."""

    def __init__(
        self,
        *,
        device_pages: int,
        page_size: int = 64,
        host_pages: int = 0,
        max_scheduled_tokens: int = 8192,
        max_batch_size: int = 160,
        decode_input_tokens: int = 1,
        disable_l2_cache: bool | None = None,
        enable_l3_storage: bool = False,
        prefetch_threshold: int = 4,
        enable_kv_cache_events: bool = False,
        enable_mixed_prefill_decode: bool = False,
        disable_prefix_cache: bool = False,
        publish_prefix_mid_flight: bool = True,
        track_lost_hits: bool = False,
        policy: Literal["kvtier", "reference", "reference-wheel"] = "kvtier",
        mamba: Mamba | None = None,
        groups: Sequence[Group] | None = None,
        required_groups: Sequence[str] | None = None,
    ) -> None: ...
    @property
    def page_size(self) -> int: ...
    @property
    def device_pages(self) -> int: ...
    @property
    def host_pages(self) -> int: ...
    @property
    def max_scheduled_tokens(self) -> int: ...
    @property
    def max_batch_size(self) -> int: ...

class Request:
    """A request: its id (unique among live requests) and its prompt."""

    id: str
    tokens: list[int]
    def __init__(self, id: str, tokens: Sequence[int]) -> None: ...

class ExtendResult:
    """Tokens whose KV is now history: the first sample after the prompt, then each
    decode step's accepted tokens."""

    request_id: str
    tokens: list[int]
    def __init__(self, request_id: str, tokens: Sequence[int]) -> None: ...

class Finish:
    """The request is done: its pages are published and written back."""

    request_id: str
    def __init__(self, request_id: str) -> None: ...

class Abort:
    """The client gave up on the request."""

    request_id: str
    def __init__(self, request_id: str) -> None: ...

class UpdateReserve:
    """Token slots the request's next decode reserves (speculative decoding)."""

    request_id: str
    tokens: int
    def __init__(self, request_id: str, tokens: int) -> None: ...

class WriteBackDone:
    """A write-back's copies ended; a failed one leaves the device copy authoritative."""

    op_id: int
    success: bool
    def __init__(self, op_id: int, success: bool = True) -> None: ...

class LoadBackFailed:
    """A load-back's copy failed: rows reading its pages are void and their requests
    run again as cache misses. Report it in the `advance` after its plan."""

    op_id: int
    def __init__(self, op_id: int) -> None: ...

class PrefetchDone:
    """An L3 prefetch ended with its leading `completed_pages` written."""

    op_id: int
    request_id: str
    success: bool
    completed_pages: int
    def __init__(self, op_id: int, request_id: str, success: bool, completed_pages: int) -> None: ...

class BackupDone:
    """An L3 backup ended."""

    op_id: int
    success: bool
    def __init__(self, op_id: int, success: bool = True) -> None: ...

Event = (
    ExtendResult | Finish | Abort | UpdateReserve | WriteBackDone | LoadBackFailed | PrefetchDone | BackupDone
)

class Row:
    """One forward row."""

    @property
    def request_id(self) -> str: ...
    @property
    def kind(self) -> Literal["prefill", "decode", "recovery"]: ...
    @property
    def slot(self) -> int: ...
    @property
    def input_length(self) -> int: ...
    @property
    def prefill_length(self) -> int: ...
    @property
    def extend_prefix_len(self) -> int: ...
    @property
    def pages(self) -> list[int]:
        """The request's device pages: token `p` is on `pages[p // page_size]`."""
    @property
    def new_pages(self) -> list[int]: ...
    @property
    def begin(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def input_ids(self) -> list[int]: ...
    @property
    def shifted_input_ids(self) -> list[int]: ...
    @property
    def decode_input_id(self) -> int | None: ...
    @property
    def hist_token_len(self) -> int | None: ...
    @property
    def mamba(self) -> dict[str, int | None]: ...
    @property
    def group_tables(self) -> dict[str, tuple[int, list[int], int | None]]: ...

class Copy:
    """A copy op: `(kind, src, dst)` pairs, `kind` being "kv" or "mamba"."""

    op_id: int
    pairs: list[tuple[str, int, int]]
    is_retract: bool | None
    @property
    def src_pages(self) -> list[int]: ...
    @property
    def dst_pages(self) -> list[int]: ...

class Prefetch:
    op_id: int
    request_id: str
    dst_pages: list[int]
    page_hashes: list[str]

class Backup:
    op_id: int
    src_pages: list[int]
    page_hashes: list[str]

class Plan:
    """What the engine runs this step."""

    @property
    def rows(self) -> list[Row]: ...
    @property
    def write_backs(self) -> list[Copy]: ...
    @property
    def load_backs(self) -> list[Copy]: ...
    @property
    def prefetches(self) -> list[Prefetch]: ...
    @property
    def backups(self) -> list[Backup]: ...
    @property
    def aborted(self) -> list[tuple[str, str]]: ...
    def is_empty(self) -> bool: ...
    def __len__(self) -> int: ...

class KvEvent:
    """A KV-cache event on one tier (vLLM's content; medium "GPU", "CPU" or "DISK")."""

    kind: Literal["BlockStored", "BlockRemoved"]
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int | None
    medium: Literal["GPU", "CPU", "DISK"]

class System:
    """kvtier's actors behind a blocking handle; calls release the GIL."""

    def __init__(self, config: Config, *, runtime: Runtime = "actix") -> None: ...
    def submit(self, requests: Sequence[Request | tuple[str, Sequence[int]]]) -> None: ...
    def next_plan(self) -> Plan: ...
    def advance(self, events: Sequence[Event]) -> None: ...
    def abort(self, request_id: str) -> None: ...
    def kv_events(self) -> list[KvEvent]: ...
    def stats(self) -> dict[str, int]: ...
    def metrics_text(self) -> str: ...
    def shutdown(self) -> dict[str, Any]: ...
    def __enter__(self) -> System: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...

class TraceRequest:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: list[int]

def read_trace(path: str | None = None, *, limit: int | None = None) -> list[TraceRequest]:
    """A trace's requests (the embedded Mooncake conversation trace when no path)."""

def replay(
    trace: str | None = None,
    *,
    limit: int | None = 2000,
    device_pages: int | None = None,
    host_pages: int | None = None,
    l3: Literal["off", "local"] = "local",
    runtime: Runtime = "direct",
) -> dict[str, Any]:
    """`kvtier replay --trace`: the trace through kvtier and the oracle engine."""

def run_workload(
    name: Literal["w1", "w2", "w3"], *, requests: int | None = None, runtime: Runtime = "direct"
) -> dict[str, Any]:
    """A benchmark workload of design/WORKLOADS.md; its report and counters."""
