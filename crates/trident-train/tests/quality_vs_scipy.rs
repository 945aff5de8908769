//! Sample-quality measures against scipy/numpy on the same feature sets
//! (`tests/fixtures/make_quality_reference.py`): the Fréchet distance as pytorch-fid
//! computes it, KID's unbiased squared MMD and the 1-NN two-sample accuracy.

use serde_json::Value;
use trident_train::quality::{frechet_distance, kernel_mmd2, one_nn_accuracy, Features};

#[test]
fn every_measure_matches_the_reference() {
    let reference: Value = serde_json::from_str(include_str!("fixtures/quality_reference.json")).unwrap();
    for (i, case) in reference["cases"].as_array().unwrap().iter().enumerate() {
        let dim = case["dim"].as_u64().unwrap() as usize;
        let set = |k: &str| Features::new(serde_json::from_value(case[k].clone()).unwrap(), dim).unwrap();
        let (a, b) = (set("a"), set("b"));
        let want = |k: &str| case[k].as_f64().unwrap();
        let fd = frechet_distance(&a, &b).unwrap();
        assert!(
            (fd - want("frechet")).abs() < 1e-8 * (1.0 + want("frechet")),
            "case {i}: FD {fd} vs {}",
            want("frechet")
        );
        let mmd = kernel_mmd2(&a, &b).unwrap();
        assert!(
            (mmd - want("mmd2")).abs() < 1e-9 * (1.0 + want("mmd2").abs()),
            "case {i}: MMD² {mmd} vs {}",
            want("mmd2")
        );
        assert_eq!(one_nn_accuracy(&a, &b).unwrap(), want("one_nn"), "case {i}: 1-NN");
    }
}
