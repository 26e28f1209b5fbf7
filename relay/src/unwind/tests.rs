//! Tests of the whole compiler on real and crafted binaries.
