//! Image classification from a folder tree: `root/<class>/<image>.{png,jpg,jpeg}`, classes
//! in sorted order of their folder names (as torchvision's `ImageFolder`).

use crate::idx::Image;
use crate::{DataError, Dataset};
use std::path::{Path, PathBuf};

/// The images under a root folder, decoded on access.
#[derive(Debug, Clone)]
pub struct ImageFolder {
    files: Vec<(PathBuf, usize)>,
    classes: Vec<String>,
    channels: usize,
    size: (usize, usize),
}

fn io(file: &Path) -> impl FnOnce(std::io::Error) -> DataError + '_ {
    move |source| DataError::Io {
        file: file.into(),
        source,
    }
}

impl ImageFolder {
    /// Lists `root`. Images are converted to `channels` (1: grey, 3: RGB) and resized to
    /// `size` (height, width) when they differ. With `classes`, the folder names must be
    /// exactly those (in that index order); otherwise the sorted folder names are used.
    pub fn open(
        root: &Path,
        channels: usize,
        size: (usize, usize),
        classes: Option<&[String]>,
    ) -> Result<Self, DataError> {
        if channels != 1 && channels != 3 {
            return Err(DataError::Format {
                file: root.into(),
                line: 0,
                message: format!("channels must be 1 or 3, not {channels}"),
            });
        }
        let mut found: Vec<String> = std::fs::read_dir(root)
            .map_err(io(root))?
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        found.sort();
        let classes: Vec<String> = match classes {
            Some(c) => {
                if let Some(extra) = found.iter().find(|f| !c.contains(f)) {
                    return Err(DataError::Format {
                        file: root.join(extra),
                        line: 0,
                        message: format!("folder '{extra}' is not one of the classes {c:?}"),
                    });
                }
                c.to_vec()
            }
            None => found,
        };
        if classes.is_empty() {
            return Err(DataError::Format {
                file: root.into(),
                line: 0,
                message: "no class folders".into(),
            });
        }
        let mut files = Vec::new();
        for (label, class) in classes.iter().enumerate() {
            let dir = root.join(class);
            if !dir.is_dir() {
                continue; // a class without examples in this split
            }
            let mut images: Vec<PathBuf> = std::fs::read_dir(&dir)
                .map_err(io(&dir))?
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.extension()
                        .and_then(|e| e.to_str())
                        .is_some_and(|e| matches!(e.to_ascii_lowercase().as_str(), "png" | "jpg" | "jpeg"))
                })
                .collect();
            images.sort();
            files.extend(images.into_iter().map(|p| (p, label)));
        }
        if files.is_empty() {
            return Err(DataError::Format {
                file: root.into(),
                line: 0,
                message: "no .png/.jpg/.jpeg images under the class folders".into(),
            });
        }
        Ok(ImageFolder {
            files,
            classes,
            channels,
            size,
        })
    }

    /// Class names in index order.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// `(channels, height, width)` of every decoded image.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.channels, self.size.0, self.size.1)
    }

    /// The class of image `index`, without decoding it.
    pub fn label(&self, index: usize) -> usize {
        self.files[index].1
    }
}

impl Dataset for ImageFolder {
    type Item = Image;

    fn len(&self) -> usize {
        self.files.len()
    }

    /// Channel-major pixels in `[0, 1]`.
    fn get(&self, index: usize) -> Result<Image, DataError> {
        let (file, label) = &self.files[index];
        Ok(Image {
            pixels: decode_image(file, self.channels, self.size)?,
            label: *label,
        })
    }
}

/// Decodes a PNG/JPEG file to channel-major pixels in `[0, 1]`, converted to `channels`
/// (1: grey, 3: RGB) and resized to `size` (height, width) when it differs: what
/// [`ImageFolder`] yields, for classifying single files with the same preprocessing.
pub fn decode_image(file: &Path, channels: usize, size: (usize, usize)) -> Result<Vec<f32>, DataError> {
    let img = image::open(file).map_err(|e| DataError::Format {
        file: file.into(),
        line: 0,
        message: e.to_string(),
    })?;
    Ok(to_pixels(img, channels, size))
}

/// [`decode_image`] for an encoded PNG or JPEG in memory (the format read from its
/// first bytes); the error says why the bytes are not an image.
pub fn decode_image_bytes(bytes: &[u8], channels: usize, size: (usize, usize)) -> Result<Vec<f32>, String> {
    let img = image::load_from_memory(bytes).map_err(|e| e.to_string())?;
    Ok(to_pixels(img, channels, size))
}

/// Resized (bilinear) to `size` = (height, width), grey or RGB planes, scaled to [0, 1].
fn to_pixels(img: image::DynamicImage, channels: usize, size: (usize, usize)) -> Vec<f32> {
    let (h, w) = size;
    let img = if img.height() as usize != h || img.width() as usize != w {
        img.resize_exact(w as u32, h as u32, image::imageops::FilterType::Triangle)
    } else {
        img
    };
    if channels == 1 {
        img.to_luma8()
            .into_raw()
            .into_iter()
            .map(|p| p as f32 / 255.0)
            .collect()
    } else {
        let rgb = img.to_rgb8();
        let mut out = vec![0f32; 3 * h * w];
        for (i, px) in rgb.pixels().enumerate() {
            for c in 0..3 {
                out[c * h * w + i] = px[c] as f32 / 255.0;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_classes_resizes_and_names_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        for (class, shade) in [("cat", 10u8), ("dog", 200u8)] {
            std::fs::create_dir_all(dir.path().join(class)).unwrap();
            let img = image::RgbImage::from_pixel(6, 4, image::Rgb([shade, shade, shade]));
            img.save(dir.path().join(class).join("a.png")).unwrap();
            image::RgbImage::from_pixel(3, 3, image::Rgb([shade, 0, 0]))
                .save(dir.path().join(class).join("b.jpg"))
                .unwrap();
        }
        std::fs::write(dir.path().join("dog/notes.txt"), "not an image").unwrap();
        let set = ImageFolder::open(dir.path(), 3, (4, 6), None).unwrap();
        assert_eq!(set.classes(), ["cat", "dog"]);
        assert_eq!(set.len(), 4);
        let im = set.get(2).unwrap();
        assert_eq!((im.label, im.pixels.len()), (1, 3 * 4 * 6));
        assert!((im.pixels[0] - 200.0 / 255.0).abs() < 1e-6);
        let grey = ImageFolder::open(dir.path(), 1, (2, 2), None).unwrap();
        assert_eq!(grey.get(1).unwrap().pixels.len(), 4, "resized");

        std::fs::write(dir.path().join("cat/c.png"), "garbage").unwrap();
        let set = ImageFolder::open(dir.path(), 1, (4, 6), None).unwrap();
        let err = set.get(2).unwrap_err().to_string();
        assert!(err.contains("c.png"), "{err}");
        let err = ImageFolder::open(dir.path(), 1, (4, 6), Some(&["cat".into()]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("'dog' is not one of the classes"), "{err}");
    }
}
