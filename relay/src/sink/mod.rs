//! Sinks: where aggregated profiles go. Local files (pprof, folded stacks, flamegraph SVG), the
//! OTLP profiles exporter, and the debug exporter that prints what OTLP would send. Each sink
//! owns one output format.

pub mod debug;
pub mod flamegraph;
pub mod folded;
pub mod otlp;
pub mod pprof;
