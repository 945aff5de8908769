//! Trident's serving engine: backends behind one trait, model instances on OS threads,
//! the dynamic batcher, the repository manager and per-model statistics.
//!
//! Nothing here knows about HTTP or gRPC; `trident-server` puts protocols on top.
#![warn(missing_docs)]

pub mod backend;
pub mod batcher;
pub mod cache;
mod classify;
pub mod ensemble;
mod error;
pub mod model;
pub mod repository;
mod scheduler;
pub mod sequence;
pub mod stats;
pub mod warmup;

pub use error::{ConfigError, LoadError, ServeError};
pub use model::{InferRequest, InferResponse, IoSpec, ModelVersion, OutputRequest, Responses};
pub use repository::{ControlMode, LoadOverride, OnnxEngine, Repository, RepositoryOptions};
