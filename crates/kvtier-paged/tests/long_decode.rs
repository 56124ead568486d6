//! A long decode on window models keeps every sliding group's pages flat: each step
//! releases what its first token no longer attends before it acquires, so a table never
//! holds more than the window's pages plus one, and nothing fails or leaks.

use kvtier_paged::{Adjunct, GroupRole, GroupSpec, PagedFamily};

/// Pages a sliding table holds at most in decode: `ceil(x / tpp) − floor((x − W) / tpp)`
/// over token counts `x`, which peaks at `ceil(W / tpp) + 1` when `tpp` does not divide
/// every `x` (`ceil(W / tpp)` when a page is one token).
fn window_peak(window: u32, tpp: u32) -> u32 {
    window.div_ceil(tpp) + u32::from(tpp > 1)
}

fn decode(groups: Vec<GroupSpec>, required: &[&str], prompt: u32, steps: u32) {
    let adjunct = Adjunct::new(groups, required).expect("groups");
    let specs = adjunct.groups().to_vec();
    let mut family: PagedFamily<u32> = PagedFamily::new(adjunct, true);
    let mut r = family.new_tables();
    let mut peak = vec![0u32; specs.len()];
    let mut pos = 0;
    // Prefill in chunks of 256 (a chunk holds its window's pages and its own), then
    // one token a step.
    while pos < prompt + steps {
        let target = if pos < prompt {
            (pos + 256).min(prompt)
        } else {
            pos + 1
        };
        family
            .acquire(&mut r, pos, target, None)
            .expect("the pools hold a window");
        if pos >= prompt {
            for (i, p) in peak.iter_mut().enumerate() {
                *p = (*p).max(r.get(i).len());
            }
        }
        pos = target;
    }
    for (i, g) in specs.iter().enumerate() {
        match g.window() {
            Some(w) => assert_eq!(peak[i], window_peak(w, g.tokens_per_page()), "{}", g.id),
            None => assert_eq!(peak[i], g.pages_for(prompt + steps), "{}", g.id),
        }
        assert_eq!(family.pool(i).failed_alloc(), 0, "{}", g.id);
    }
    family.release(&mut r);
    family.check_invariants([&r]).expect("every page back");
    for (i, g) in specs.iter().enumerate() {
        assert_eq!(family.available()[i], g.total_pages - 1, "{}", g.id);
    }
}

/// gpt-oss: the sliding layers' KV (W 128) in pages of 16 tokens peaks at 9 pages.
#[test]
fn a_window_layer_group_stays_flat_over_a_long_decode() {
    decode(
        vec![
            GroupSpec::full_history("kv", 16, 1, 400),
            GroupSpec::sliding("swa.kv", 16, 1, 40, 128, GroupRole::History),
        ],
        &["kv"],
        1000,
        4096,
    );
}

/// DeepSeek-V4's groups: the state groups stay at 3 (`swa_kv`, `c4a` states) and 17
/// (`c128a` state) pages; only the compressed history grows.
#[test]
fn deepseek_v4_state_groups_stay_flat_over_a_long_decode() {
    decode(
        vec![
            GroupSpec::sliding("v4.swa_kv", 64, 1, 16, 128, GroupRole::State),
            GroupSpec::sliding("v4.c4a.compressor_state", 4, 1, 80, 8, GroupRole::State),
            GroupSpec::full_history("v4.c4a.compressed_kv", 64, 4, 32),
            GroupSpec::sliding("v4.c128a.compressor_state", 8, 1, 64, 128, GroupRole::State),
            GroupSpec::full_history("v4.c128a.compressed_kv", 2, 128, 32),
            GroupSpec::sliding(
                "v4.c4a.indexer_compressor_state",
                4,
                1,
                80,
                8,
                GroupRole::State,
            ),
        ],
        &["v4.c4a.compressed_kv", "v4.c128a.compressed_kv"],
        1000,
        4096,
    );
}
