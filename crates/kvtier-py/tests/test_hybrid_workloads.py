"""The hybrid workloads H1, H2 and H3 (design/HYBRID-WORKLOADS.md) through the reference
wheel and through kvtier's drop-in, with the same driver
(tools/reference/hybrid_workloads.py): every counter and the decision and KV-page
digests must be equal. The drop-in's reference policy is the wheel's build
(`Policy::ReferenceWheel`), which is not the build HYBRID-WORKLOADS.md measured (its
counters are pinned in kvtier-sim's hybrid_counters.rs)."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools" / "reference"))
import hybrid_workloads  # noqa: E402


def run(module, variant):
    hybrid_workloads.ts = module
    return hybrid_workloads.run(variant)


@pytest.mark.parametrize("variant", ["h1-main", "h2-main", "h3-main"])
def test_the_drop_in_runs_the_workload_as_the_wheel_does(reference, ours, variant):
    theirs, mine = run(reference, variant), run(ours, variant)
    if variant == "h2-main":
        # Some paged-cache group page ids differ from the wheel's (same counts, other
        # ids): two requests stop in one step and are forgotten in another order, the
        # known difference forget-order (docs/python.md). The KV page digest is equal.
        theirs.pop("digest_all"), mine.pop("digest_all")
    assert mine == theirs
