//! Event files read back by TensorBoard itself: `tools/tb_read.py` reads every record with
//! TensorBoard's record reader (CRCs checked) and the scalars with its EventAccumulator.
//! Skipped, saying so, when the `tensorboard` Python package is missing
//! (`python3 -m pip install tensorboard==2.21.0`). Exact: f32 values survive JSON as doubles.

use std::path::Path;
use std::process::Command;

use shardes::tensorboard::EventWriter;

fn tensorboard_available() -> Result<(), String> {
    match Command::new("python3")
        .args(["-c", "import tensorboard"])
        .output()
    {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
        Err(e) => Err(format!("python3: {e}")),
    }
}

#[test]
fn tensorboard_reads_our_scalars() {
    if let Err(why) = tensorboard_available() {
        eprintln!(
            "SKIPPED tensorboard_reads_our_scalars: the tensorboard Python package is not \
             importable ({why}); install it with `python3 -m pip install tensorboard==2.21.0`"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tb = dir.path().join("tb");
    let mut w = EventWriter::create(&tb).unwrap();
    let n = 12i64;
    for g in 0..n {
        let mean = 2.0 / (1.0 + g as f32);
        w.add_scalars(
            g,
            &[
                ("fitness/mean", mean),
                ("fitness/min", mean - 0.25),
                ("fitness/max", 0.0),
            ],
        )
        .unwrap();
        w.add_scalar("ms_per_generation", g, 10.0 + g as f32)
            .unwrap();
        w.flush().unwrap();
    }
    w.add_scalar("eval/mean_reward", 11, f32::NAN).unwrap();
    w.add_scalar("eval/accuracy", 11, f32::INFINITY).unwrap();
    drop(w);

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/tb_read.py");
    let o = Command::new("python3")
        .arg(&script)
        .arg(&tb)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["file_version"], 2.0, "{v}");
    let records = v["records"].as_object().unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records.values().next().unwrap(), 1 + 2 * n + 2);

    let series = |tag: &str| -> Vec<(i64, serde_json::Value)> {
        v["scalars"][tag]
            .as_array()
            .unwrap_or_else(|| panic!("no {tag} in {v}"))
            .iter()
            .map(|p| (p[0].as_i64().unwrap(), p[1].clone()))
            .collect()
    };
    let mean = series("fitness/mean");
    assert_eq!(mean.len(), n as usize);
    for (g, (step, value)) in mean.iter().enumerate() {
        assert_eq!(*step, g as i64);
        let want = f64::from(2.0 / (1.0 + g as f32));
        assert_eq!(value.as_f64().unwrap(), want, "generation {g}");
    }
    let min = series("fitness/min");
    assert_eq!(min[3].1.as_f64().unwrap(), f64::from(2.0 / 4.0f32 - 0.25));
    // 0.0 reaches TensorBoard as a scalar, not as a missing value.
    let max = series("fitness/max");
    assert_eq!(max.len(), n as usize);
    assert!(max.iter().all(|(_, x)| x.as_f64() == Some(0.0)));
    let ms = series("ms_per_generation");
    assert_eq!(ms[n as usize - 1], (n - 1, serde_json::json!(21.0)));
    assert_eq!(
        series("eval/mean_reward"),
        vec![(11, serde_json::json!("NaN"))]
    );
    assert_eq!(
        series("eval/accuracy"),
        vec![(11, serde_json::json!("inf"))]
    );
}

#[test]
fn our_reader_reads_tensorboards_own_writer() {
    if let Err(why) = tensorboard_available() {
        eprintln!(
            "SKIPPED our_reader_reads_tensorboards_own_writer: the tensorboard Python package \
             is not importable ({why})"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import sys
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.compat.proto import event_pb2, summary_pb2
w = EventFileWriter(sys.argv[1])
for step in range(3):
    v = summary_pb2.Summary.Value(tag="loss", simple_value=0.5 * step)
    w.add_event(event_pb2.Event(step=step, summary=summary_pb2.Summary(value=[v])))
w.close()
"#;
    let o = Command::new("python3")
        .args(["-c", script])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1);
    let events = shardes::tensorboard::read_events(&files[0]).unwrap();
    assert_eq!(
        events[0].what,
        Some(shardes::tensorboard::proto::event::What::FileVersion(
            shardes::tensorboard::FILE_VERSION.into()
        ))
    );
    assert_eq!(
        shardes::tensorboard::scalars(&events),
        vec![
            ("loss".to_string(), 0, 0.0),
            ("loss".to_string(), 1, 0.5),
            ("loss".to_string(), 2, 1.0)
        ]
    );
}
