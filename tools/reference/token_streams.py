"""The benchmark workloads' token streams (design/WORKLOADS.md §1), as kvtier-sim's
`tokens.rs` generates them: a stream per tag, seeded by SplitMix64, then xorshift64."""

M64 = (1 << 64) - 1


def splitmix64(s):
    s = (s + 0x9E3779B97F4A7C15) & M64
    z = s
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def gen(tag, n):
    """`n` tokens (1..32000) of the stream named `tag`."""
    x = splitmix64(tag)
    if x == 0:
        x = 1
    out = []
    for _ in range(n):
        x ^= (x << 13) & M64
        x ^= x >> 7
        x ^= (x << 17) & M64
        out.append(1 + (x % 32000))
    return out


def tag(w, k, i):
    """The tag of stream `i` of kind `k` in workload `w`."""
    return (w << 56) | (k << 48) | i
