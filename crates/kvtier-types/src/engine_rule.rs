//! The toy engine rule: how the simulated and oracle engines, the tests and the
//! examples answer a plan's forward rows.
//!
//! * A row yields one generated token when it completes its prompt — a prefill row
//!   whose chunk is the last (`extend_prefix_len + input_length == prefill_length`) —
//!   and on every decode and recovery row ([`yields_token`]). A real engine samples
//!   on the same rows.
//! * A request finishes with its `max_new`-th generated token: `Finish` follows that
//!   token's `ExtendResult` ([`push_token`]). This is the toy part: a real engine
//!   stops on its own criteria.
//!
//! Each engine keeps its own count of generated tokens and picks its own tokens.
//!
//! ```
//! use kvtier_types::{EngineEvent, ForwardRow, RowKind, engine_rule};
//! # fn row(kind: RowKind, extend_prefix_len: u32, input_length: u32) -> ForwardRow {
//! #     ForwardRow {
//! #         request_id: "r1".into(), kind, slot: 1, input_length, prefill_length: 10,
//! #         pages_start: 0, pages_len: 0, begin: 0, size: 0, extend_prefix_len,
//! #         input_ids_start: 0, decode_input_id: -1, hist_token_len: -1, mamba: Default::default(),
//! #     }
//! # }
//! // A 10-token prompt computed in chunks of 6 and 4, then two decode steps; the
//! // request finishes after 2 generated tokens.
//! let rows = [
//!     row(RowKind::Prefill, 0, 6),
//!     row(RowKind::Prefill, 6, 4),
//!     row(RowKind::Decode, 0, 1),
//! ];
//! let (mut events, mut generated) = (Vec::new(), 0);
//! for row in rows.iter().filter(|row| engine_rule::yields_token(row)) {
//!     generated += 1;
//!     let token = 100 + generated as i32;
//!     engine_rule::push_token(&mut events, &row.request_id, token, generated, 2);
//! }
//! let extend = |token| EngineEvent::ExtendResult { request_id: "r1".into(), tokens: vec![token] };
//! let finish = EngineEvent::Finish { request_id: "r1".into() };
//! assert_eq!(events, [extend(101), extend(102), finish]);
//! ```

use crate::{EngineEvent, ForwardRow, RequestId, RowKind, Token};

/// Whether `row` yields a generated token: a prefill row only when its chunk completes
/// the prompt, decode and recovery rows always.
pub fn yields_token(row: &ForwardRow) -> bool {
    match row.kind {
        RowKind::Prefill => row.extend_prefix_len + row.input_length == row.prefill_length,
        RowKind::Decode | RowKind::Recovery => true,
    }
}

/// Appends the events of one generated `token` of `request_id`: its `ExtendResult`,
/// then `Finish` when `generated` (the request's count, this token included) has reached
/// `max_new`. Returns whether the request finished.
pub fn push_token(
    events: &mut Vec<EngineEvent>,
    request_id: &RequestId,
    token: Token,
    generated: usize,
    max_new: usize,
) -> bool {
    events.push(EngineEvent::ExtendResult {
        request_id: request_id.clone(),
        tokens: vec![token],
    });
    let finished = generated >= max_new;
    if finished {
        events.push(EngineEvent::Finish {
            request_id: request_id.clone(),
        });
    }
    finished
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(kind: RowKind, extend_prefix_len: u32, input_length: u32, prefill: u32) -> ForwardRow {
        ForwardRow {
            request_id: "r".into(),
            kind,
            slot: 1,
            input_length,
            prefill_length: prefill,
            pages_start: 0,
            pages_len: 0,
            begin: 0,
            size: 0,
            extend_prefix_len,
            input_ids_start: 0,
            decode_input_id: -1,
            hist_token_len: -1,
            mamba: Default::default(),
        }
    }

    #[test]
    fn only_the_chunk_that_completes_the_prompt_yields() {
        assert!(!yields_token(&row(RowKind::Prefill, 0, 8, 20)));
        assert!(!yields_token(&row(RowKind::Prefill, 8, 8, 20)));
        assert!(yields_token(&row(RowKind::Prefill, 16, 4, 20)));
        // A prefix-cache hit covers the start: the one chunk left is the last.
        assert!(yields_token(&row(RowKind::Prefill, 12, 8, 20)));
        assert!(yields_token(&row(RowKind::Prefill, 0, 20, 20)));
    }

    #[test]
    fn decode_and_recovery_rows_always_yield() {
        assert!(yields_token(&row(RowKind::Decode, 0, 1, 20)));
        // Recovery rows report a prefill length of 0.
        assert!(yields_token(&row(RowKind::Recovery, 0, 1, 0)));
    }

    #[test]
    fn the_max_new_th_token_finishes() {
        let id = RequestId::new("r");
        let mut events = Vec::new();
        assert!(!push_token(&mut events, &id, 7, 1, 2));
        assert_eq!(
            events,
            [EngineEvent::ExtendResult {
                request_id: id.clone(),
                tokens: vec![7],
            }]
        );
        events.clear();
        assert!(push_token(&mut events, &id, 8, 2, 2));
        assert_eq!(
            events,
            [
                EngineEvent::ExtendResult {
                    request_id: id.clone(),
                    tokens: vec![8],
                },
                EngineEvent::Finish { request_id: id },
            ]
        );
    }
}
