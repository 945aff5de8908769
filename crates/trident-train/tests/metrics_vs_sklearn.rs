//! trident-train's metrics against scikit-learn's on the same labels and probabilities
//! (`tests/fixtures/make_metrics_reference.py`).

use serde_json::Value;
use trident_train::metrics::{roc_auc, ClassificationReport};

fn close(name: &str, got: f64, want: &Value) {
    let want = want.as_f64().unwrap();
    assert!(
        (got - want).abs() < 1e-9,
        "{name}: got {got}, scikit-learn {want}"
    );
}

#[test]
fn every_metric_matches_scikit_learn() {
    let reference: Value = serde_json::from_str(include_str!("fixtures/metrics_reference.json")).unwrap();
    for (i, case) in reference["cases"].as_array().unwrap().iter().enumerate() {
        let classes = case["classes"].as_u64().unwrap() as usize;
        let labels: Vec<usize> = serde_json::from_value(case["labels"].clone()).unwrap();
        let probs: Vec<f32> = case["probs"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|row| row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32))
            .collect();
        let r = ClassificationReport::new(&probs, &labels, classes);
        close(&format!("case {i} accuracy"), r.accuracy, &case["accuracy"]);
        for c in 0..classes {
            close(
                &format!("case {i} precision[{c}]"),
                r.precision[c],
                &case["precision"][c],
            );
            close(&format!("case {i} recall[{c}]"), r.recall[c], &case["recall"][c]);
            close(&format!("case {i} f1[{c}]"), r.f1[c], &case["f1"][c]);
            assert_eq!(r.support[c], case["support"][c].as_u64().unwrap());
            for p in 0..classes {
                assert_eq!(
                    r.confusion.count(c, p),
                    case["confusion"][c][p].as_u64().unwrap(),
                    "case {i}"
                );
            }
        }
        close(
            &format!("case {i} macro precision"),
            r.macro_precision,
            &case["macro_precision"],
        );
        close(
            &format!("case {i} macro recall"),
            r.macro_recall,
            &case["macro_recall"],
        );
        close(&format!("case {i} macro f1"), r.macro_f1, &case["macro_f1"]);
        let auc = r.roc_auc_ovr_macro.unwrap();
        let want = case["roc_auc_ovr_macro"].as_f64().unwrap();
        // Binary cases: scikit-learn scores class 1 only; the one-vs-rest mean equals it
        // up to f32 rounding of 1 - p.
        assert!(
            (auc - want).abs() < 1e-6,
            "case {i} roc_auc: got {auc}, scikit-learn {want}"
        );
    }
}

#[test]
fn roc_auc_edge_cases() {
    assert_eq!(roc_auc(&[0.1, 0.9], &[false, true]), Some(1.0));
    assert_eq!(roc_auc(&[0.9, 0.1], &[false, true]), Some(0.0));
    assert_eq!(
        roc_auc(&[0.5, 0.5], &[false, true]),
        Some(0.5),
        "a tie counts one half"
    );
    assert_eq!(
        roc_auc(&[0.5, 0.7], &[true, true]),
        None,
        "no negatives: undefined"
    );
}
