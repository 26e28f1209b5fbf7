//! The relay's command-line plumbing: durations, log set-up and the stop signal. One copy, in
//! `ember-common`, shared with the sampler; re-exported here under the names the relay uses.

pub use ember_common::{
    init_logging, install_stop_handlers, parse_duration, stop_requested, LogFormat,
};
