//! TensorBoard event files: per-generation scalars that TensorBoard (and anything reading
//! its format) shows as curves.
//!
//! A file `events.out.tfevents.<unix seconds>.<host>` holds TFRecords: a little-endian u64
//! length, the masked CRC32C of those 8 bytes, the serialized `Event`, the masked CRC32C of
//! the event. The first event carries `file_version = "brain.Event:2"`; every later one a
//! `Summary` of `simple_value` scalars. The messages are the few fields of TensorFlow's
//! `event.proto`/`summary.proto` that scalars need, hand-written for prost (field numbers
//! as upstream, so TensorBoard reads them and skips nothing it needs).
//!
//! ```no_run
//! # fn main() -> Result<(), shardes::tensorboard::TensorboardError> {
//! let mut tb = shardes::tensorboard::EventWriter::create("runs/demo/tb")?;
//! tb.add_scalar("fitness/mean", 0, 1.25)?;
//! tb.flush()?;
//! # Ok(())
//! # }
//! ```

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;

/// What the first record of every event file says; TensorBoard checks it.
pub const FILE_VERSION: &str = "brain.Event:2";

/// Errors of writing or reading event files.
#[derive(Debug, thiserror::Error)]
pub enum TensorboardError {
    /// A file or directory could not be created, written or read.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done (`creating`, `writing`, `reading`).
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A record of an event file is cut short, fails its checksum or does not decode.
    #[error("{} at byte {offset}: {what}; the file is damaged or not an event file", path.display())]
    Corrupt {
        /// The event file.
        path: PathBuf,
        /// Where the bad record starts.
        offset: u64,
        /// What is wrong with it.
        what: String,
    },
}

/// The messages of TensorFlow's `event.proto` and `summary.proto` that scalars use.
pub mod proto {
    /// `tensorflow.Event`: one record of an event file.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Event {
        /// Seconds since the Unix epoch when the event was written.
        #[prost(double, tag = "1")]
        pub wall_time: f64,
        /// The global step (here: the generation).
        #[prost(int64, tag = "2")]
        pub step: i64,
        /// What the event holds.
        #[prost(oneof = "event::What", tags = "3, 5")]
        pub what: Option<event::What>,
    }

    /// Nested types of [`Event`].
    pub mod event {
        /// `Event.what`: the file header or a summary (other upstream cases are not written).
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum What {
            /// The first event of a file: [`super::super::FILE_VERSION`].
            #[prost(string, tag = "3")]
            FileVersion(String),
            /// Scalars (or other values) at this step.
            #[prost(message, tag = "5")]
            Summary(super::Summary),
        }
    }

    /// `tensorflow.Summary`: the values of one step.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Summary {
        /// One entry per tag.
        #[prost(message, repeated, tag = "1")]
        pub value: Vec<summary::Value>,
    }

    /// Nested types of [`Summary`].
    pub mod summary {
        /// `Summary.Value`: one tagged value.
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct Value {
            /// The curve's name, e.g. `fitness/mean`.
            #[prost(string, tag = "1")]
            pub tag: String,
            /// The value. A oneof, as upstream: a plain proto3 float would drop 0.0 from the
            /// wire and TensorBoard would then not see a scalar at all.
            #[prost(oneof = "value::Kind", tags = "2")]
            pub value: Option<value::Kind>,
        }

        /// Nested types of [`Value`].
        pub mod value {
            /// `Summary.Value.value` (only the scalar case is written).
            #[derive(Clone, PartialEq, prost::Oneof)]
            pub enum Kind {
                /// A scalar.
                #[prost(float, tag = "2")]
                SimpleValue(f32),
            }
        }
    }
}

use proto::summary::value::Kind;
use proto::{event::What, summary, Event, Summary};

/// CRC32C (Castagnoli, reflected polynomial 0x82F63B78) table, built at compile time.
const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// The CRC32C of `data` (as iSCSI and TFRecord use it).
pub fn crc32c(data: &[u8]) -> u32 {
    !data.iter().fold(!0u32, |c, &b| {
        CRC_TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8)
    })
}

/// TFRecord's masked CRC32C: rotated and offset so that a CRC of data holding CRCs stays
/// well distributed.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let c = crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Frames `data` as one TFRecord.
fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// This machine's name, made safe for a file name (TensorBoard shows it per file).
fn host() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let name: String = raw
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        "localhost".into()
    } else {
        name
    }
}

/// Appends scalars to a new event file under a directory.
///
/// Records are buffered; [`flush`](Self::flush) after each generation so that a running
/// TensorBoard sees it (a record it finds half-written is read again later). Dropping the
/// writer flushes what is left, ignoring errors.
#[derive(Debug)]
pub struct EventWriter {
    path: PathBuf,
    file: BufWriter<File>,
}

impl EventWriter {
    /// Creates `dir` (and its parents) and a new `events.out.tfevents.<time>.<host>` in it,
    /// starting with the file-version record. A second writer in the same second gets a
    /// `.1`, `.2`, … suffix rather than overwriting the first one's file.
    pub fn create(dir: impl AsRef<Path>) -> Result<EventWriter, TensorboardError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|source| TensorboardError::Io {
            what: "creating",
            path: dir.to_path_buf(),
            source,
        })?;
        let wall_time = now();
        let base = format!("events.out.tfevents.{:010}.{}", wall_time as u64, host());
        let mut n = 0u32;
        let (path, file) = loop {
            let path = if n == 0 {
                dir.join(&base)
            } else {
                dir.join(format!("{base}.{n}"))
            };
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => break (path, f),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(source) => {
                    return Err(TensorboardError::Io {
                        what: "creating",
                        path,
                        source,
                    })
                }
            }
        };
        let mut w = EventWriter {
            path,
            file: BufWriter::new(file),
        };
        w.write_event(&Event {
            wall_time,
            step: 0,
            what: Some(What::FileVersion(FILE_VERSION.into())),
        })?;
        w.flush()?;
        Ok(w)
    }

    /// The event file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one scalar `value` of curve `tag` at `step`. Non-finite values are written
    /// as they are (TensorBoard shows NaN and infinities as such).
    pub fn add_scalar(&mut self, tag: &str, step: i64, value: f32) -> Result<(), TensorboardError> {
        self.add_scalars(step, &[(tag, value)])
    }

    /// Appends several scalars of one step as one event (one record per generation).
    pub fn add_scalars(
        &mut self,
        step: i64,
        values: &[(&str, f32)],
    ) -> Result<(), TensorboardError> {
        let summary = Summary {
            value: values
                .iter()
                .map(|&(tag, v)| summary::Value {
                    tag: tag.to_string(),
                    value: Some(Kind::SimpleValue(v)),
                })
                .collect(),
        };
        self.write_event(&Event {
            wall_time: now(),
            step,
            what: Some(What::Summary(summary)),
        })
    }

    /// Writes buffered records to the file.
    pub fn flush(&mut self) -> Result<(), TensorboardError> {
        self.file.flush().map_err(|source| self.io_err(source))
    }

    fn write_event(&mut self, event: &Event) -> Result<(), TensorboardError> {
        let bytes = record(&event.encode_to_vec());
        self.file
            .write_all(&bytes)
            .map_err(|source| self.io_err(source))
    }

    fn io_err(&self, source: std::io::Error) -> TensorboardError {
        TensorboardError::Io {
            what: "writing",
            path: self.path.clone(),
            source,
        }
    }
}

/// Reads every event of an event file, checking both CRCs of every record.
pub fn read_events(path: impl AsRef<Path>) -> Result<Vec<Event>, TensorboardError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| TensorboardError::Io {
        what: "reading",
        path: path.to_path_buf(),
        source,
    })?;
    let corrupt = |offset: usize, what: String| TensorboardError::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        what,
    };
    let u32_at = |i: usize| -> u32 {
        u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]])
    };
    let mut events = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        if bytes.len() - at < 12 {
            return Err(corrupt(at, "a record header is cut short".into()));
        }
        let len_bytes = &bytes[at..at + 8];
        if masked_crc32c(len_bytes) != u32_at(at + 8) {
            return Err(corrupt(at, "the length's CRC does not match".into()));
        }
        let mut len8 = [0u8; 8];
        len8.copy_from_slice(len_bytes);
        let len = u64::from_le_bytes(len8);
        let data_at = at + 12;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| data_at.checked_add(l))
            .and_then(|e| e.checked_add(4))
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| corrupt(at, format!("a record of {len} bytes is cut short")))?;
        let data = &bytes[data_at..end - 4];
        if masked_crc32c(data) != u32_at(end - 4) {
            return Err(corrupt(at, "the data's CRC does not match".into()));
        }
        let event = Event::decode(data)
            .map_err(|e| corrupt(at, format!("the event does not decode: {e}")))?;
        events.push(event);
        at = end;
    }
    Ok(events)
}

/// The scalars of `events` as `(tag, step, value)`, in file order.
pub fn scalars(events: &[Event]) -> Vec<(String, i64, f32)> {
    events
        .iter()
        .filter_map(|e| match &e.what {
            Some(What::Summary(s)) => Some((e.step, s)),
            _ => None,
        })
        .flat_map(|(step, s)| {
            s.value.iter().filter_map(move |v| {
                let Some(Kind::SimpleValue(x)) = v.value else {
                    return None;
                };
                Some((v.tag.clone(), step, x))
            })
        })
        .collect()
}
