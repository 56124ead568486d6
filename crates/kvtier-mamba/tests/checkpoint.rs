//! Where checkpoints land (the worker rule of `hybrid_linear_attn.py` and the
//! publish rule `ShouldPublishMambaCheckpoint`, hybrid-l3.md §1.2).

use kvtier_mamba::{align_down, checkpoint_depth, decode_checkpoint_depth};

/// The reference's worker metadata cases (P = 64, kernel chunk 64).
#[test]
fn the_final_state_wins_then_an_aligned_intermediate_then_none() {
    // 192 + 128 = 320, on a page boundary: the final state.
    assert_eq!(checkpoint_depth(192, 128, 64, 64), Some(320));
    // 192 → 319: the boundary 256 is 64 tokens in: the intermediate state.
    assert_eq!(checkpoint_depth(192, 127, 64, 64), Some(256));
    // 41 → 66: the boundary 64 is 23 tokens in, not a kernel chunk: none.
    assert_eq!(checkpoint_depth(41, 25, 64, 64), None);
}

#[test]
fn a_chunk_that_crosses_no_page_boundary_checkpoints_nothing() {
    assert_eq!(checkpoint_depth(64, 10, 64, 64), None);
    assert_eq!(checkpoint_depth(0, 63, 64, 64), None);
    assert_eq!(checkpoint_depth(0, 64, 64, 64), Some(64));
    assert_eq!(checkpoint_depth(0, 0, 64, 64), None);
}

#[test]
fn small_pages_checkpoint_where_the_kernel_chunk_allows() {
    // P = 2, kernel chunk 4: end 7 → boundary 6 is 6 tokens in (not a multiple of 4).
    assert_eq!(checkpoint_depth(0, 7, 2, 4), None);
    // begin 2, end 7: boundary 6 is 4 tokens in.
    assert_eq!(checkpoint_depth(2, 5, 2, 4), Some(6));
    assert_eq!(checkpoint_depth(2, 6, 2, 4), Some(8));
}

#[test]
fn decode_checkpoints_on_page_boundaries() {
    assert_eq!(decode_checkpoint_depth(128, 64), Some(128));
    assert_eq!(decode_checkpoint_depth(129, 64), None);
    assert_eq!(align_down(13, 4), 12);
    assert_eq!(align_down(13, 0), 0);
}
