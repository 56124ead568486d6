//! The workload token generator (WORKLOADS.md §1).

use kvtier_types::Token;

/// One splitmix64 step (the state advances by the golden gamma first).
pub fn splitmix64(mut s: u64) -> u64 {
    s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Stream tag: workload, kind, index.
pub fn tag(w: u64, k: u64, i: u64) -> u64 {
    (w << 56) | (k << 48) | i
}

/// `n` tokens in `[1, 32000]` from the xorshift stream seeded by `tag`.
pub fn gen_tokens(tag: u64, n: usize) -> Vec<Token> {
    let mut x = splitmix64(tag);
    if x == 0 {
        x = 1;
    }
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1 + (x % 32000) as Token
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_vectors_match_the_workload_definition() {
        let cases: [((u64, u64, u64), [Token; 6]); 4] = [
            ((2, 1, 0), [13673, 6335, 15376, 8618, 2261, 17134]),
            ((1, 1, 0), [30267, 11237, 4704, 20780, 20086, 23116]),
            ((1, 2, 0), [14641, 19661, 8536, 27042, 18717, 14185]),
            ((3, 1, 0), [9293, 31015, 11167, 6654, 9665, 9032]),
        ];
        for ((w, k, i), expected) in cases {
            assert_eq!(
                gen_tokens(tag(w, k, i), 6),
                expected,
                "stream ({w},{k},{i})"
            );
        }
    }
}
