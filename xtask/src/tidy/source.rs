//! Rust source as the source rules read it: code only, with comments and the contents
//! of string and character literals blanked to spaces (byte offsets and lines kept).

/// `text` with every comment and every literal's contents replaced by spaces, so that a
/// path or brace inside a string, a doc comment or an intra-doc link is not code.
pub fn code_only(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        let ident_before = i > 0 && is_ident(bytes[i - 1]);
        if rest.starts_with(b"//") {
            let end = find(bytes, i, b"\n");
            blank(&mut out, i, end);
            i = end;
        } else if rest.starts_with(b"/*") {
            let end = block_comment_end(bytes, i);
            blank(&mut out, i, end);
            i = end;
        } else if let (false, Some(hashes)) = (ident_before, raw_string_hashes(rest)) {
            // r"..", r#".."#, br"..": from the opening quote to the matching close.
            let open = i + rest.iter().position(|&b| b == b'"').unwrap_or(0) + 1;
            let mut close = b"\"".to_vec();
            close.extend(std::iter::repeat_n(b'#', hashes));
            let end = find(bytes, open, &close);
            blank(&mut out, open, end);
            i = (end + close.len()).min(bytes.len());
        } else if rest[0] == b'"' {
            let end = quoted_end(bytes, i + 1, b'"');
            blank(&mut out, i + 1, end);
            i = (end + 1).min(bytes.len());
        } else if rest[0] == b'\'' && is_char_literal(rest) {
            let end = quoted_end(bytes, i + 1, b'\'');
            blank(&mut out, i + 1, end);
            i = (end + 1).min(bytes.len());
        } else {
            i += 1;
        }
    }
    // Only ASCII spaces replaced whole characters' bytes, so this is still UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

pub fn is_ident(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

fn blank(out: &mut [u8], from: usize, to: usize) {
    let to = to.min(out.len());
    for byte in &mut out[from..to] {
        if *byte != b'\n' {
            *byte = b' ';
        }
    }
}

/// The offset of `needle` at or after `from`, or the end of `bytes`.
fn find(bytes: &[u8], from: usize, needle: &[u8]) -> usize {
    (from..bytes.len())
        .find(|&at| bytes[at..].starts_with(needle))
        .unwrap_or(bytes.len())
}

/// The end of the (nested) block comment opening at `from`.
fn block_comment_end(bytes: &[u8], from: usize) -> usize {
    let mut depth = 0usize;
    let mut i = from;
    while i < bytes.len() {
        if bytes[i..].starts_with(b"/*") {
            depth += 1;
            i += 2;
        } else if bytes[i..].starts_with(b"*/") {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    bytes.len()
}

/// The offset of the unescaped `quote` closing a literal whose contents start at `from`.
fn quoted_end(bytes: &[u8], from: usize, quote: u8) -> usize {
    let mut i = from;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            byte if byte == quote => return i,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// How many `#` a raw string starting here uses (`r"`, `r#"`, `br##"`...), if it is one.
fn raw_string_hashes(rest: &[u8]) -> Option<usize> {
    let after_r = match rest {
        [b'r', tail @ ..] => tail,
        [b'b', b'r', tail @ ..] => tail,
        _ => return None,
    };
    let hashes = after_r.iter().take_while(|&&b| b == b'#').count();
    (after_r.get(hashes) == Some(&b'"')).then_some(hashes)
}

/// Whether the `'` at the start of `rest` opens a character literal (not a lifetime).
fn is_char_literal(rest: &[u8]) -> bool {
    match rest.get(1) {
        Some(b'\\') => true,
        Some(&lead) => {
            // The width of the UTF-8 character that starts with `lead`.
            let width = match lead {
                0xF0.. => 4,
                0xE0.. => 3,
                0xC0.. => 2,
                _ => 1,
            };
            rest.get(1 + width) == Some(&b'\'')
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_literals_are_blanked_with_offsets_kept() {
        let text = "use crate::a; // crate::b\n/* crate::c /* nested */ */ let s = \"crate::d {\";\n\
                    let r = r#\"crate::e \"q\" \"#; let c = '{'; let l: &'a str = x; '\\''; let e = 'é'; crate::f";
        let code = code_only(text);
        assert_eq!(code.len(), text.len());
        assert_eq!(code.lines().count(), text.lines().count());
        assert!(code.contains("use crate::a;"));
        for hidden in ["crate::b", "crate::c", "crate::d", "crate::e", "'{'", "é"] {
            assert!(!code.contains(hidden), "{hidden} in {code}");
        }
        assert!(code.contains("&'a str"), "{code}");
        assert!(code.ends_with("crate::f"), "{code}");
    }
}
