//! Sinks: where profiles go. Local files (`files/`: pprof, folded stacks, flamegraph SVG), the
//! OTLP profiles exporter (`otlp/`) and the debug exporter that prints what OTLP would send
//! (`debug`). Each sink owns one output; the commands choose their sinks once, and the driver
//! hands every sink the same calls through the narrow [`Sink`] trait, so adding an output never
//! touches the loop.
//!
//! The calls, in order: [`Sink::interval`] for each completed interval (the samples since the
//! previous one), [`Sink::window`] when a window closes (`run --window`), and [`Sink::finish`]
//! once at exit with the last, unfinished window. A sink does its slow work where it fits: OTLP
//! queues each interval, the files are rendered only at window close and at exit.

use std::{path::PathBuf, sync::Arc, time::Duration};

use crate::labels::labeled::LabeledProfile;

pub mod debug;
pub(crate) mod exporters;
pub(crate) mod files;
pub mod otlp;

/// One output of the relay.
pub(crate) trait Sink {
    /// A completed interval: the samples since the previous call. Must not block on I/O. Shared,
    /// so a sink that reads it later (OTLP, on its own thread) holds it without a copy.
    fn interval(&mut self, _profile: &Arc<LabeledProfile>) {}

    /// A window closed; `profile` holds all of it (shared: a sink may keep it while it writes
    /// it on a thread of its own). Failures are logged by the sink and said in what it returns,
    /// now or at the next call (the driver counts them for the metrics).
    fn window(&mut self, _profile: &Arc<LabeledProfile>) -> WindowOutcome {
        WindowOutcome::Kept
    }

    /// Between two events: what became of a window the sink was writing on its own thread,
    /// once it is done ([`WindowOutcome::Kept`] when there is none, or it is not done).
    fn poll(&mut self) -> WindowOutcome {
        WindowOutcome::Kept
    }

    /// Whether the sink reads the window's samples ([`Sink::window`], [`Sink::finish`]); when
    /// no sink does, the driver keeps only the window's time range, not its samples.
    fn wants_window(&self) -> bool {
        false
    }

    /// The relay is stopping: `window` is the last (unfinished) window, `drain` the longest
    /// the sink may take to deliver what it still holds.
    fn finish(
        self: Box<Self>,
        window: &LabeledProfile,
        drain: Duration,
    ) -> anyhow::Result<SinkReport>;
}

/// What became of a closed window in one sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum WindowOutcome {
    /// Written or queued (or not the sink's business).
    Kept,
    /// A window of `samples` could not be written (the sink logged why); its samples are not
    /// in this sink's output.
    Unwritten { samples: u64 },
}

/// What a sink says when it finishes, for the command to print or log.
#[derive(Debug)]
pub(crate) enum SinkReport {
    /// Nothing worth saying.
    Quiet,
    /// The files sink wrote these files (flamegraph, pprof, folded).
    Files(Vec<PathBuf>),
    /// The OTLP exporter stopped.
    Otlp(Box<exporters::OtlpFinished>),
}

/// The chosen sinks, in the order they get each call (and finish).
#[derive(Default)]
pub(crate) struct Sinks(Vec<Box<dyn Sink>>);

impl Sinks {
    pub(crate) fn push(&mut self, sink: Box<dyn Sink>) {
        self.0.push(sink);
    }

    pub(crate) fn extend(&mut self, sinks: impl IntoIterator<Item = Box<dyn Sink>>) {
        self.0.extend(sinks);
    }

    pub(crate) fn interval(&mut self, profile: &Arc<LabeledProfile>) {
        for sink in &mut self.0 {
            sink.interval(profile);
        }
    }

    /// Whether any sink reads a window's samples.
    pub(crate) fn want_window(&self) -> bool {
        self.0.iter().any(|sink| sink.wants_window())
    }

    /// Hands a closed window to every sink; how many windows could not be written (this one
    /// or, by a sink that writes on its own thread, the one before) and their samples.
    pub(crate) fn window(&mut self, profile: &Arc<LabeledProfile>) -> (u64, u64) {
        let mut failed = (0, 0);
        for sink in &mut self.0 {
            if let WindowOutcome::Unwritten { samples } = sink.window(profile) {
                failed = (failed.0 + 1, failed.1 + samples);
            }
        }
        failed
    }

    /// Asks every sink what became of the windows it was writing ([`Sink::poll`]): how many
    /// could not be written, and their samples.
    pub(crate) fn poll(&mut self) -> (u64, u64) {
        let mut failed = (0, 0);
        for sink in &mut self.0 {
            if let WindowOutcome::Unwritten { samples } = sink.poll() {
                failed = (failed.0 + 1, failed.1 + samples);
            }
        }
        failed
    }

    /// Finishes every sink in order, handing each outcome to `report` as soon as it is there
    /// (so a summary prints before a slow OTLP drain starts). An error `report` returns stops:
    /// later sinks are dropped unfinished.
    pub(crate) fn finish(
        self,
        window: &LabeledProfile,
        drain: Duration,
        report: &mut dyn FnMut(anyhow::Result<SinkReport>) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        for sink in self.0 {
            report(sink.finish(window, drain))?;
        }
        Ok(())
    }
}
