//! ember-relay: the unprivileged half of ember. Receives batches from ember-sampler, symbolizes
//! them from the file descriptors the sampler passed, aggregates and writes profiles.

pub mod model;
pub mod sink;
