//! Text to token ids, one rule for training, `predict` and the server's `tokenizer`
//! backend: a `tokenizers` tokenizer with its own padding and truncation switched off,
//! special tokens added (`[CLS] … [SEP]`), sequences longer than `max_len` refused or (when
//! asked) cut to `max_len` keeping their last token, and batches padded with `[PAD]` to
//! their longest sequence (or to a fixed length) with a 0/1 attention mask.

use std::path::Path;

/// A `tokenizer.json` tokenizer under Trident's length and padding rules.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Id of `[PAD]` (0 when the vocabulary has none).
    pub pad_id: u32,
}

/// How long a text may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LengthRule {
    /// Most tokens, special tokens included.
    pub max_len: usize,
    /// Cut longer texts (keeping the last token, `[SEP]`) instead of refusing them.
    pub truncate: bool,
}

/// Why a text could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncodeError {
    /// The tokenizer itself failed.
    Tokenizer(String),
    /// More tokens than the rule allows, and the rule does not cut.
    TooLong {
        /// Tokens of the text, special tokens included.
        tokens: usize,
        /// The rule's limit.
        max_len: usize,
    },
}

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EncodeError::Tokenizer(m) => f.write_str(m),
            EncodeError::TooLong { tokens, max_len } => {
                write!(f, "{tokens} tokens, more than the limit of {max_len}")
            }
        }
    }
}

/// A padded batch: row-major `[rows, len]` ids and mask.
#[derive(Debug, Clone, PartialEq)]
pub struct Padded {
    /// Token ids, `[PAD]` after each sequence.
    pub ids: Vec<u32>,
    /// 1 for tokens, 0 for padding.
    pub mask: Vec<u32>,
    /// Sequences.
    pub rows: usize,
    /// Padded length.
    pub len: usize,
}

impl Tokenizer {
    /// Reads `tokenizer.json`.
    pub fn from_file(file: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
        Self::from_bytes(&bytes).map_err(|e| format!("{}: {e}", file.display()))
    }

    /// Parses the bytes of a `tokenizer.json`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        let mut inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| e.to_string())?;
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| e.to_string())?;
        let pad_id = inner.token_to_id("[PAD]").unwrap_or(0);
        Ok(Tokenizer { inner, pad_id })
    }

    /// Vocabulary size (with added tokens).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Ids of one text with its special tokens.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        let enc = self
            .inner
            .encode(text, true)
            .map_err(|e| format!("tokenizer: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Ids of one text under `rule`; the error says how long the text is.
    pub fn encode_within(&self, text: &str, rule: LengthRule) -> Result<Vec<u32>, EncodeError> {
        let mut ids = self.encode(text).map_err(EncodeError::Tokenizer)?;
        let max_len = rule.max_len.max(1);
        if ids.len() > max_len {
            if !rule.truncate {
                return Err(EncodeError::TooLong {
                    tokens: ids.len(),
                    max_len,
                });
            }
            let last = *ids.last().expect("non-empty");
            ids.truncate(max_len);
            ids[max_len - 1] = last; // keep [SEP]
        }
        Ok(ids)
    }

    /// `seqs` padded to their longest (at least 1), or to `to` when given (each at most
    /// `to` long).
    pub fn pad(&self, seqs: &[Vec<u32>], to: Option<usize>) -> Padded {
        let longest = seqs.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let len = to.unwrap_or(longest).max(1);
        let (ids, mask) = crate::transform::pad_to(seqs, self.pad_id, len);
        Padded {
            ids,
            mask,
            rows: seqs.len(),
            len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Tokenizer {
        let f = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../trident-nn/tests/fixtures/tiny_bert/tokenizer.json");
        Tokenizer::from_file(&f).unwrap()
    }

    #[test]
    fn length_rule_refuses_or_cuts_keeping_the_last_token() {
        let t = tiny();
        let ids = t.encode("a b c d e f").unwrap();
        assert!(ids.len() > 4);
        let err = t
            .encode_within(
                "a b c d e f",
                LengthRule {
                    max_len: 4,
                    truncate: false,
                },
            )
            .unwrap_err();
        assert_eq!(
            err,
            EncodeError::TooLong {
                tokens: ids.len(),
                max_len: 4
            }
        );
        let cut = t
            .encode_within(
                "a b c d e f",
                LengthRule {
                    max_len: 4,
                    truncate: true,
                },
            )
            .unwrap();
        assert_eq!(cut.len(), 4);
        assert_eq!(cut[..3], ids[..3]);
        assert_eq!(cut[3], *ids.last().unwrap());
    }

    #[test]
    fn pads_to_longest_or_fixed() {
        let t = tiny();
        let seqs = vec![vec![5, 6, 7], vec![8]];
        let p = t.pad(&seqs, None);
        assert_eq!((p.rows, p.len), (2, 3));
        assert_eq!(p.ids, vec![5, 6, 7, 8, t.pad_id, t.pad_id]);
        assert_eq!(p.mask, vec![1, 1, 1, 1, 0, 0]);
        let p = t.pad(&seqs, Some(5));
        assert_eq!(p.len, 5);
        assert_eq!(p.ids[..5], [5, 6, 7, t.pad_id, t.pad_id]);
        assert_eq!(p.mask, vec![1, 1, 1, 0, 0, 1, 0, 0, 0, 0]);
    }
}
