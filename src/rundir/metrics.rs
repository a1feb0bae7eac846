//! `metrics.jsonl`: one JSON object per generation that stays valid JSON whatever the values.
//!
//! JSON has no NaN or infinity, and `serde_json` writes them as `null`, which a reader cannot
//! tell from a missing value. A [`Metric`] writes non-finite values as the strings `"NaN"`,
//! `"inf"` and `"-inf"` and reads them back (and `null`, from files of earlier versions, as
//! NaN). The writer appends one whole line per record and flushes it; the reader keeps the
//! records before a generation, as a resume needs, and reports every line it cannot read,
//! telling a last line cut short by a kill from damage elsewhere.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::RunDirError;
use super::layout::write_atomic;

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// The generation that produced this fitness (0-based).
    pub generation: u32,
    /// Mean fitness (loss) over the population.
    #[serde(with = "scalar")]
    pub fitness_mean: f64,
    /// Lowest fitness in the population.
    #[serde(with = "scalar")]
    pub fitness_min: f64,
    /// Highest fitness in the population.
    #[serde(with = "scalar")]
    pub fitness_max: f64,
    /// Wall time of the generation (dispatch to fitness on the host), milliseconds.
    #[serde(with = "scalar")]
    pub ms: f64,
    /// Further named scalars (e.g. a mean reward), written as an `extra` object only when
    /// there are any; non-finite values as for the fields above.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        with = "scalar_map"
    )]
    pub extra: BTreeMap<String, f64>,
}

impl Metric {
    /// The record as one line of JSON, without the newline.
    pub fn to_line(&self) -> String {
        // Only strings and numbers of known fields: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether every value is finite.
    pub fn is_finite(&self) -> bool {
        [
            self.fitness_mean,
            self.fitness_min,
            self.fitness_max,
            self.ms,
        ]
        .iter()
        .chain(self.extra.values())
        .all(|v| v.is_finite())
    }
}

/// A scalar as JSON: a number, or `"NaN"`, `"inf"`, `"-inf"`.
struct Scalar(f64);

impl Serialize for Scalar {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let v = self.0;
        if v.is_nan() {
            s.serialize_str("NaN")
        } else if v == f64::INFINITY {
            s.serialize_str("inf")
        } else if v == f64::NEG_INFINITY {
            s.serialize_str("-inf")
        } else {
            s.serialize_f64(v)
        }
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Scalar, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(f64),
            Text(String),
            Null(()),
        }
        match Raw::deserialize(d)? {
            Raw::Num(v) => Ok(Scalar(v)),
            Raw::Null(()) => Ok(Scalar(f64::NAN)),
            Raw::Text(t) => match t.as_str() {
                "NaN" | "nan" => Ok(Scalar(f64::NAN)),
                "inf" | "+inf" | "Infinity" => Ok(Scalar(f64::INFINITY)),
                "-inf" | "-Infinity" => Ok(Scalar(f64::NEG_INFINITY)),
                other => Err(serde::de::Error::custom(format!(
                    "expected a number, \"NaN\", \"inf\" or \"-inf\", found the string {other:?}"
                ))),
            },
        }
    }
}

mod scalar {
    use super::*;

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        Scalar(*v).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Scalar::deserialize(d).map(|s| s.0)
    }
}

mod scalar_map {
    use super::*;

    pub fn serialize<S: Serializer>(m: &BTreeMap<String, f64>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(m.iter().map(|(k, v)| (k, Scalar(*v))))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, f64>, D::Error> {
        let m = BTreeMap::<String, Scalar>::deserialize(d)?;
        Ok(m.into_iter().map(|(k, v)| (k, v.0)).collect())
    }
}

/// A line of `metrics.jsonl` that is not a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    /// 1-based line number.
    pub line: usize,
    /// The line, cut to 200 characters.
    pub text: String,
    /// Why it is not a record.
    pub error: String,
}

/// What [`read_metrics`] found.
#[derive(Debug, Clone, Default)]
pub struct MetricsLog {
    /// Every record, in file order, with its line as written (kept verbatim on truncation,
    /// so fields of later versions survive).
    pub records: Vec<(Metric, String)>,
    /// Lines that are not records, other than a torn last line.
    pub bad: Vec<BadLine>,
    /// The last line, when it has no newline and is not a record: a write cut short by a
    /// kill. Expected after a crash; not damage.
    pub torn: Option<BadLine>,
}

fn cut(text: &str) -> String {
    const MAX: usize = 200;
    match text.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

/// Reads `path` (a missing file reads as empty). Blank lines are skipped.
pub fn read_metrics(path: &Path) -> Result<MetricsLog, RunDirError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(MetricsLog::default()),
        Err(e) => return Err(RunDirError::io(path, "read", e)),
    };
    let mut log = MetricsLog::default();
    let ends_in_newline = bytes.last().is_none_or(|&b| b == b'\n');
    let mut lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    if ends_in_newline {
        // split leaves an empty piece after the final newline.
        lines.pop();
    }
    let last = lines.len();
    for (i, raw) in lines.into_iter().enumerate() {
        let text = String::from_utf8_lossy(raw);
        let trimmed = text.trim();
        if trimmed.is_empty() {
            continue;
        }
        match serde_json::from_str::<Metric>(trimmed) {
            Ok(m) => log.records.push((m, trimmed.to_string())),
            Err(e) => {
                let bad = BadLine {
                    line: i + 1,
                    text: cut(trimmed),
                    error: e.to_string(),
                };
                if i + 1 == last && !ends_in_newline {
                    log.torn = Some(bad);
                } else {
                    log.bad.push(bad);
                }
            }
        }
    }
    Ok(log)
}

/// What [`truncate_metrics`] did.
#[derive(Debug, Clone, Default)]
pub struct MetricsTruncation {
    /// Records kept (generation before the checkpoint's).
    pub kept: usize,
    /// Records dropped because their generation is at or past the checkpoint's.
    pub dropped: usize,
    /// Lines that were not records and were dropped; the CLI should warn about these.
    pub bad: Vec<BadLine>,
    /// A torn last line that was dropped (expected after a kill).
    pub torn: Option<BadLine>,
}

/// Keeps the records of generations before `generation` (a checkpoint's, which resumes
/// there) and drops the rest, rewriting `path` atomically; a missing file stays missing.
pub fn truncate_metrics(path: &Path, generation: u32) -> Result<MetricsTruncation, RunDirError> {
    if !path.exists() {
        return Ok(MetricsTruncation::default());
    }
    let log = read_metrics(path)?;
    let mut out = MetricsTruncation {
        bad: log.bad,
        torn: log.torn,
        ..MetricsTruncation::default()
    };
    let mut text = String::new();
    for (m, line) in &log.records {
        if m.generation < generation {
            text.push_str(line);
            text.push('\n');
            out.kept += 1;
        } else {
            out.dropped += 1;
        }
    }
    write_atomic(path, text.as_bytes(), None, None)
        .map_err(|(step, e)| RunDirError::io(path, step, e))?;
    Ok(out)
}

/// Appends records to `metrics.jsonl`, one whole line per write, flushed at once.
#[derive(Debug)]
pub struct MetricsWriter {
    path: PathBuf,
    file: File,
}

impl MetricsWriter {
    /// Opens `path` for appending (creating it). When the file does not end in a newline (a
    /// line torn by a kill), a newline is written first, so the torn fragment stays a line
    /// of its own that readers report, instead of spoiling the next record.
    pub fn open(path: &Path) -> Result<MetricsWriter, RunDirError> {
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(|e| RunDirError::io(path, "open", e))?;
        let len = file
            .metadata()
            .map_err(|e| RunDirError::io(path, "read", e))?
            .len();
        if len > 0 {
            let mut last = [0u8];
            file.seek(SeekFrom::End(-1))
                .and_then(|_| file.read_exact(&mut last))
                .map_err(|e| RunDirError::io(path, "read", e))?;
            if last[0] != b'\n' {
                file.write_all(b"\n")
                    .map_err(|e| RunDirError::io(path, "write", e))?;
            }
        }
        Ok(MetricsWriter {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Appends `m` as one line and flushes it.
    pub fn append(&mut self, m: &Metric) -> Result<(), RunDirError> {
        let mut line = m.to_line();
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(|e| RunDirError::io(&self.path, "write", e))
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(generation: u32, v: f64) -> Metric {
        Metric {
            generation,
            fitness_mean: v,
            fitness_min: v,
            fitness_max: v,
            ms: 1.5,
            extra: BTreeMap::new(),
        }
    }

    #[test]
    fn non_finite_values_are_strings_and_read_back() {
        let mut r = m(3, f64::NAN);
        r.fitness_min = f64::NEG_INFINITY;
        r.fitness_max = f64::INFINITY;
        r.extra.insert("reward".into(), f64::NAN);
        r.extra.insert("steps".into(), 12.0);
        let line = r.to_line();
        assert_eq!(
            line,
            r#"{"generation":3,"fitness_mean":"NaN","fitness_min":"-inf","fitness_max":"inf","ms":1.5,"extra":{"reward":"NaN","steps":12.0}}"#
        );
        assert!(!line.contains("null"));
        let back: Metric = serde_json::from_str(&line).unwrap();
        assert!(back.fitness_mean.is_nan());
        assert_eq!(back.fitness_min, f64::NEG_INFINITY);
        assert_eq!(back.fitness_max, f64::INFINITY);
        assert!(back.extra["reward"].is_nan());
        assert_eq!(back.extra["steps"], 12.0);
        assert!(!back.is_finite());
        // No `extra` key when there are none: the line is the earlier format exactly.
        assert_eq!(
            m(0, 2.0).to_line(),
            r#"{"generation":0,"fitness_mean":2.0,"fitness_min":2.0,"fitness_max":2.0,"ms":1.5}"#
        );
    }

    #[test]
    fn finite_values_round_trip_bit_exactly() {
        for v in [
            0.0,
            -0.0,
            1.0 / 3.0,
            f64::from(0.1f32),
            f64::MIN_POSITIVE,
            5e-324,
            f64::MAX,
            -1.2345678901234567e-300,
            123_456_789.123_456_78,
        ] {
            let back: Metric = serde_json::from_str(&m(1, v).to_line()).unwrap();
            assert_eq!(back.fitness_mean.to_bits(), v.to_bits(), "{v:e}");
        }
        // Random bit patterns (every exponent, 17-digit mantissas).
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = f64::from_bits(x);
            if !v.is_finite() {
                continue;
            }
            let back: Metric = serde_json::from_str(&m(1, v).to_line()).unwrap();
            assert_eq!(back.fitness_mean.to_bits(), v.to_bits(), "{v:e}");
        }
    }

    #[test]
    fn null_from_earlier_versions_reads_as_nan() {
        let line =
            r#"{"generation":1,"fitness_mean":null,"fitness_min":null,"fitness_max":null,"ms":2}"#;
        let back: Metric = serde_json::from_str(line).unwrap();
        assert!(back.fitness_mean.is_nan() && back.fitness_max.is_nan());
        assert!(serde_json::from_str::<Metric>(&line.replace("null", "\"huge\"")).is_err());
    }
}
