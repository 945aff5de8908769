//! PyTorch checkpoints in both of torch.save's formats read as the tensors PyTorch saved
//! (`tests/fixtures/make_pth_reference.py`): the legacy stream and the zip archive.

use std::path::Path;

#[test]
fn legacy_and_zip_checkpoints_hold_the_saved_tensors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let want =
        candle_core::safetensors::load(dir.join("pth_reference.safetensors"), &candle_core::Device::Cpu)
            .unwrap();
    for file in ["legacy.pth", "zip.pth"] {
        let got = trident_nn::pth::read(&dir.join(file)).unwrap();
        assert_eq!(got.len(), want.len(), "{file}");
        for (name, t) in got {
            let w = &want[&name];
            assert_eq!(t.dims(), w.dims(), "{file}: {name}");
            assert_eq!(t.dtype(), w.dtype(), "{file}: {name}");
            let (a, b) = (
                t.flatten_all()
                    .unwrap()
                    .to_dtype(candle_core::DType::F64)
                    .unwrap()
                    .to_vec1::<f64>()
                    .unwrap(),
                w.flatten_all()
                    .unwrap()
                    .to_dtype(candle_core::DType::F64)
                    .unwrap()
                    .to_vec1::<f64>()
                    .unwrap(),
            );
            assert_eq!(a, b, "{file}: {name}");
        }
    }
    // Neither format: refused by name.
    let junk = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(junk.path(), b"not a checkpoint").unwrap();
    let e = trident_nn::pth::read(junk.path()).unwrap_err().to_string();
    assert!(e.contains("not a PyTorch checkpoint"), "{e}");
}
