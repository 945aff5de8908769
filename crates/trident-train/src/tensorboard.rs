//! TensorBoard scalar logs: `events.out.tfevents.*` files that TensorBoard reads.
//!
//! The format is TFRecord framing (u64 length, masked CRC-32C of the length, the bytes,
//! masked CRC-32C of the bytes) around `tensorflow.Event` protobuf messages; the first
//! event carries `file_version: "brain.Event:2"`. Only the fields written here are
//! declared (field numbers from tensorflow/core/util/event.proto and summary.proto).
//! Each event is flushed as it is written, so a crash loses at most the event in flight
//! and TensorBoard can follow a live run.

use prost::Message;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Clone, PartialEq, Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(string, optional, tag = "3")]
    file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
}

#[derive(Clone, PartialEq, Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

#[derive(Clone, PartialEq, Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
}

/// Writes scalar summaries to one event file in a log directory.
pub struct EventWriter {
    file: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// Creates `dir` if needed and a new event file in it.
    pub fn create(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_else(|_| "localhost".into());
        let name = format!(
            "events.out.tfevents.{}.{}.{}",
            now.as_secs(),
            host.trim(),
            std::process::id()
        );
        let path = dir.join(name);
        let mut writer = EventWriter {
            file: BufWriter::new(File::create(&path)?),
            path,
        };
        writer.write_event(&Event {
            wall_time: now.as_secs_f64(),
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        })?;
        Ok(writer)
    }

    /// The event file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Logs `value` under `tag` at `step`.
    pub fn scalar(&mut self, tag: &str, step: i64, value: f32) -> io::Result<()> {
        let wall_time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let summary = Summary {
            value: vec![SummaryValue {
                tag: tag.into(),
                simple_value: Some(value),
            }],
        };
        self.write_event(&Event {
            wall_time,
            step,
            file_version: None,
            summary: Some(summary),
        })
    }

    fn write_event(&mut self, event: &Event) -> io::Result<()> {
        let data = event.encode_to_vec();
        let len = (data.len() as u64).to_le_bytes();
        self.file.write_all(&len)?;
        self.file.write_all(&masked_crc(&len).to_le_bytes())?;
        self.file.write_all(&data)?;
        self.file.write_all(&masked_crc(&data).to_le_bytes())?;
        self.file.flush()
    }
}

/// TFRecord's masked CRC-32C.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_framed_with_masked_crcs() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.scalar("loss", 3, 0.25).unwrap();
        let bytes = std::fs::read(w.path()).unwrap();
        let mut rest = &bytes[..];
        let mut events = Vec::new();
        while !rest.is_empty() {
            let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
            assert_eq!(
                u32::from_le_bytes(rest[8..12].try_into().unwrap()),
                masked_crc(&rest[..8])
            );
            let data = &rest[12..12 + len];
            assert_eq!(
                u32::from_le_bytes(rest[12 + len..16 + len].try_into().unwrap()),
                masked_crc(data)
            );
            events.push(Event::decode(data).unwrap());
            rest = &rest[16 + len..];
        }
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        assert_eq!(events[1].step, 3);
        assert_eq!(
            events[1].summary.as_ref().unwrap().value[0].simple_value,
            Some(0.25)
        );
    }
}
