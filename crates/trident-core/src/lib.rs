//! Shared types for Trident: Triton data types, tensor payloads, and the Triton model
//! configuration (`config.pbtxt`) with its parser and validator.
//!
//! This crate has no runtime in it (no tokio, no HTTP, no tensor engine): the serving
//! engine, the network front ends and the training crates all build on it.
#![warn(missing_docs)]

pub mod config;
pub mod dtype;
pub mod tensor;

pub use dtype::DataType;
pub use tensor::{Tensor, TensorError};
