//! ember-relay: the unprivileged half of ember. Receives batches from ember-sampler, symbolizes
//! them from the file descriptors the sampler passed, aggregates and writes profiles.

pub mod cli;
pub mod config;
pub mod export;
pub mod labels;
pub mod model;
pub mod output;
pub mod pipeline;
pub mod privileges;
pub mod record;
pub mod relabel;
pub mod run;
pub mod session;
pub mod sink;
pub mod source;
pub mod symbolize;
