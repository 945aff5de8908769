//! The real TensorBoard (PyPI `tensorboard`, installed by .ci/run) reads our event files.

use trident_train::tensorboard::EventWriter;

#[test]
fn tensorboard_reads_scalars_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = EventWriter::create(dir.path()).unwrap();
    for step in 0..5 {
        w.scalar("train/loss", step, 1.0 / (step as f32 + 1.0)).unwrap();
        w.scalar("eval/accuracy", step, 0.5 + step as f32 * 0.1).unwrap();
    }
    drop(w);
    let script = r#"
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1]); acc.Reload()
for tag in sorted(acc.Tags()["scalars"]):
    for e in acc.Scalars(tag):
        print(tag, e.step, repr(e.value))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, dir.path().to_str().unwrap()])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "tensorboard could not read the events (pip install tensorboard):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), 10, "{lines:?}");
    assert_eq!(lines[0], format!("eval/accuracy 0 {:?}", 0.5f32 as f64));
    assert_eq!(lines[5], "train/loss 0 1.0");
    assert_eq!(lines[9], format!("train/loss 4 {:?}", 0.2f32 as f64));
}
