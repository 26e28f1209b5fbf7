//! Sinks: where aggregated profiles go. Local files now (pprof, folded stacks, flamegraph SVG);
//! OTLP exporters later. Each sink owns one output format.

pub mod flamegraph;
pub mod folded;
pub mod pprof;
