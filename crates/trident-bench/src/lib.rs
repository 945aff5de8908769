//! `trident bench`: a load generator for KServe v2 / Triton HTTP servers.
//!
//! Closed-loop users in traffic phases (SageMaker Inference Recommender's semantics) or
//! concurrency sweeps (perf_analyzer's), and open-loop request rates, constant or Poisson,
//! timed from each request's scheduled send time so that a slow client cannot hide
//! latency (coordinated omission). Latencies go into HDR histograms; levels are measured
//! in windows until perf_analyzer's stability criterion holds; the server's own breakdown
//! comes from its statistics API. Results print as a table and are written as CSV (with
//! perf_analyzer's column names) and JSON.
#![warn(missing_docs)]

pub mod client;
pub mod inputs;
pub mod plot;
pub mod recommend;
pub mod report;
pub mod run;
pub mod schedule;
pub mod stats;

pub use client::Client;
pub use run::{run, Load, Report, Settings, Target};
