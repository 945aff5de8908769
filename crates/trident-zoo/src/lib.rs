//! Trident's model zoo: the model kinds a run config names (`[model]`), the model card a
//! checkpoint carries (`trident.json`), and [`Model`], which builds a network from a card
//! or loads a checkpoint. The CLI (`train`, `eval`, `predict`), the ONNX exporter and the
//! server's pre-processing all load checkpoints through [`Model::load_checkpoint`].

pub mod card;
pub mod error;
#[doc(hidden)]
pub mod fixtures;
pub mod gan_step;
pub mod graph_step;
pub mod model;

pub use card::{BertWidth, InputSpec, ModelCard, ModelConfig, RnnModel, SequentialModel, SeriesSpec};
pub use error::ZooError;
pub use model::{image_collate, Batch, Gan, Model, Net, Network};
