//! protobuf's C++ text-format parser (which Triton uses) accepts a list of messages
//! without the colon, `input [ { ... } ]`; prost-reflect's parser requires
//! `input: [ ... ]`. Every Triton example config uses the colon-less form, so before
//! parsing we insert the optional colon between a field name and `[`. The scan skips
//! strings and comments, and error offsets are mapped back to the original text.

/// The text with colons inserted, and the positions (in the new text) of each inserted
/// colon, ascending.
pub(super) fn insert_list_colons(text: &str) -> (String, Vec<usize>) {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 16);
    let mut inserted = Vec::new();
    let mut i = 0;
    let mut last_ident_end: Option<usize> = None;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'#' => {
                let end = text[i..].find('\n').map_or(bytes.len(), |n| i + n);
                out.push_str(&text[i..end]);
                i = end;
                continue;
            }
            b'"' | b'\'' => {
                let end = string_end(bytes, i);
                out.push_str(&text[i..end]);
                i = end;
                last_ident_end = None;
                continue;
            }
            b'[' if last_ident_end.is_some() => {
                inserted.push(out.len());
                out.push(':');
            }
            _ => {}
        }
        if c.is_ascii_alphanumeric() || c == b'_' {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b'.')
            {
                i += 1;
            }
            out.push_str(&text[start..i]);
            // Only a field name (not a value such as `TYPE_FP32` or `true`) can precede
            // `[`; values are followed by `]`, `,`, `}` or another field, never `[`.
            last_ident_end = Some(i);
            continue;
        }
        if !c.is_ascii_whitespace() {
            last_ident_end = None;
        }
        let ch = text[i..].chars().next().expect("in bounds");
        out.push(ch);
        i += ch.len_utf8();
    }
    (out, inserted)
}

fn string_end(bytes: &[u8], start: usize) -> usize {
    let quote = bytes[start];
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'\n' => return i,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// Maps an offset in the rewritten text back to the original.
pub(super) fn original_offset(offset: usize, inserted: &[usize]) -> usize {
    offset - inserted.iter().take_while(|&&p| p < offset).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_colons_only_where_needed() {
        let original = "input [ { dims: [ 1 ] } ]\nname: \"a [b\" # c [d\nout[{}]";
        let (t, ins) = insert_list_colons(original);
        assert_eq!(t, "input :[ { dims: [ 1 ] } ]\nname: \"a [b\" # c [d\nout:[{}]");
        assert_eq!(ins.len(), 2);
        assert_eq!(
            original_offset(t.find("out").unwrap(), &ins),
            original.find("out").unwrap()
        );
    }
}
