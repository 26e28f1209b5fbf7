//! ember-relay: the unprivileged half of ember. Receives batches from ember-sampler, symbolizes
//! them from the file descriptors the sampler passed, aggregates and writes profiles.
//!
//! Flow: `source` (socket threads) -> bounded intake -> `driver` (the one loop of `run` and
//! `record`) -> `pipeline` (sessions, `symbolize`) -> a `model::Profile` per interval -> `sink`s
//! (files, OTLP, debug). `run` and `record` only hold their policy.

pub mod cli;
pub mod config;
pub(crate) mod driver;
pub mod labels;
pub mod model;
pub(crate) mod pipeline;
pub(crate) mod privileges;
pub mod record;
pub mod relabel;
pub mod run;
pub mod session;
pub mod sink;
pub(crate) mod source;
pub(crate) mod symbolize;
pub mod unwind;
