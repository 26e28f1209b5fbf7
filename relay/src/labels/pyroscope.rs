//! Pyroscope.
