//! IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed.
//!
//! Layout: two zero bytes, a type code (0x08 = unsigned byte), the number of dimensions,
//! one big-endian u32 per dimension, then the data row-major.

use crate::{DataError, Dataset};
use std::path::{Path, PathBuf};

/// An IDX array of unsigned bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct IdxArray {
    /// Dimensions (e.g. `[60000, 28, 28]`).
    pub dims: Vec<usize>,
    /// Row-major values.
    pub data: Vec<u8>,
}

/// Reads an IDX file of unsigned bytes; `.gz` (by magic number, not name) is decompressed.
pub fn read_idx(file: &Path) -> Result<IdxArray, DataError> {
    let bytes = crate::read_file(file)?;
    parse_idx(&bytes).map_err(|m| format_error(file, m))
}

fn format_error(file: &Path, message: String) -> DataError {
    DataError::Format {
        file: file.to_path_buf(),
        line: 0,
        message,
    }
}

fn parse_idx(bytes: &[u8]) -> Result<IdxArray, String> {
    let [0, 0, kind, ndims, rest @ ..] = bytes else {
        return Err("not an IDX file (expected magic 00 00 <type> <dims>)".into());
    };
    if *kind != 0x08 {
        return Err(format!(
            "IDX element type 0x{kind:02x} is not supported (only 0x08, unsigned byte)"
        ));
    }
    let header = 4 * *ndims as usize;
    if rest.len() < header {
        return Err(format!(
            "IDX header declares {ndims} dimensions but the file ends first"
        ));
    }
    let dims: Vec<usize> = rest[..header]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes(c.try_into().expect("4 bytes")) as usize)
        .collect();
    let expected = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("IDX dimensions overflow")?;
    let data = &rest[header..];
    if data.len() != expected {
        return Err(format!(
            "IDX dimensions {dims:?} need {expected} bytes of data, the file has {}",
            data.len()
        ));
    }
    Ok(IdxArray {
        dims,
        data: data.to_vec(),
    })
}

/// An image classification set from an images file and a labels file (MNIST layout).
#[derive(Debug, Clone)]
pub struct IdxImages {
    images: IdxArray,
    labels: Vec<u8>,
    pixels: usize,
}

/// One image: pixel values scaled to `[0, 1]`, row-major, and its label.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    /// Height × width values in `[0, 1]`.
    pub pixels: Vec<f32>,
    /// Class index.
    pub label: usize,
}

impl IdxImages {
    /// Reads `images` (`[n, h, w]`) and `labels` (`[n]`) and checks they agree.
    pub fn open(images: &Path, labels: &Path) -> Result<Self, DataError> {
        let imgs = read_idx(images)?;
        let labs = read_idx(labels)?;
        if imgs.dims.len() != 3 {
            return Err(format_error(
                images,
                format!("expected [count, height, width], got {:?}", imgs.dims),
            ));
        }
        if labs.dims.len() != 1 || labs.dims[0] != imgs.dims[0] {
            return Err(format_error(
                labels,
                format!(
                    "expected [{}] labels to match {}, got {:?}",
                    imgs.dims[0],
                    path(images),
                    labs.dims
                ),
            ));
        }
        let pixels = imgs.dims[1] * imgs.dims[2];
        Ok(IdxImages {
            images: imgs,
            labels: labs.data,
            pixels,
        })
    }

    /// `(height, width)`.
    pub fn image_size(&self) -> (usize, usize) {
        (self.images.dims[1], self.images.dims[2])
    }

    /// The class of image `index`.
    pub fn label(&self, index: usize) -> usize {
        self.labels[index] as usize
    }
}

fn path(p: &Path) -> String {
    PathBuf::from(p).display().to_string()
}

impl Dataset for IdxImages {
    type Item = Image;

    fn len(&self) -> usize {
        self.labels.len()
    }

    fn get(&self, index: usize) -> Result<Image, DataError> {
        let raw = &self.images.data[index * self.pixels..(index + 1) * self.pixels];
        Ok(Image {
            pixels: raw.iter().map(|&p| p as f32 / 255.0).collect(),
            label: self.labels[index] as usize,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use std::io::Write;

    fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut out = vec![0, 0, 8, dims.len() as u8];
        for d in dims {
            out.extend_from_slice(&d.to_be_bytes());
        }
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn reads_plain_and_gzip_and_pairs_images_with_labels() {
        let dir = tempfile::tempdir().unwrap();
        let pixels: Vec<u8> = (0..2 * 2 * 3).map(|i| (i * 20) as u8).collect();
        std::fs::write(dir.path().join("img"), idx(&[2, 2, 3], &pixels)).unwrap();
        let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&idx(&[2], &[7, 1])).unwrap();
        std::fs::write(dir.path().join("lab.gz"), gz.finish().unwrap()).unwrap();
        let set = IdxImages::open(&dir.path().join("img"), &dir.path().join("lab.gz")).unwrap();
        assert_eq!((set.len(), set.image_size()), (2, (2, 3)));
        let second = set.get(1).unwrap();
        assert_eq!(second.label, 1);
        assert_eq!(second.pixels[0], 120.0 / 255.0);
    }

    /// The real Fashion-MNIST (fetch with `scripts/fetch-data.sh fashion`).
    #[test]
    #[ignore = "needs data/fashion-mnist from scripts/fetch-data.sh"]
    fn fashion_mnist_has_60000_balanced_training_images() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fashion-mnist");
        let set = IdxImages::open(
            &dir.join("train-images-idx3-ubyte.gz"),
            &dir.join("train-labels-idx1-ubyte.gz"),
        )
        .unwrap();
        assert_eq!((set.len(), set.image_size()), (60_000, (28, 28)));
        let mut counts = [0; 10];
        for i in 0..set.len() {
            counts[set.get(i).unwrap().label] += 1;
        }
        assert_eq!(counts, [6000; 10]);
    }

    #[test]
    fn rejects_bad_files_with_their_name() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("bad");
        std::fs::write(&f, idx(&[3, 2], &[1, 2, 3])).unwrap();
        let err = read_idx(&f).unwrap_err().to_string();
        assert!(err.contains("bad") && err.contains("need 6 bytes"), "{err}");
        std::fs::write(&f, b"PK\x03\x04").unwrap();
        assert!(read_idx(&f).unwrap_err().to_string().contains("not an IDX file"));
        let images = dir.path().join("img");
        std::fs::write(&images, idx(&[2, 1, 1], &[0, 0])).unwrap();
        std::fs::write(&f, idx(&[3], &[0, 0, 0])).unwrap();
        assert!(IdxImages::open(&images, &f)
            .unwrap_err()
            .to_string()
            .contains("expected [2] labels"));
    }
}
