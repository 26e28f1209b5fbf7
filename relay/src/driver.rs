//! The relay's one loop, shared by `run` and `record`: source events arrive over the bounded
//! intake channel -> the [`Pipeline`] (each batch through the session's symbolization, then the
//! labels stage) -> one [`LabeledProfile`] per completed interval, its samples under their
//! process's resource labels -> the [`Sinks`]. The driver owns the window clock and the current
//! window; the command's [`Policy`] decides when to stop (and prints progress), so `run` and
//! `record` keep only their policy.
//!
//! Invariants: every sample the pipeline symbolized reaches the sinks exactly once per call
//! kind (each interval once to [`Sinks::interval`], each window once to [`Sinks::window`] or,
//! for the last one, to the finish); the loop never blocks longer than the policy's poll
//! period, so stop requests are seen promptly.

use std::{
    path::Path,
    sync::{
        mpsc::{self, Receiver, RecvTimeoutError, SyncSender},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use ember_protocol::Losses;

use crate::{
    labels::labeled::LabeledProfile,
    labels::stage::LabelSettings,
    metrics::{Metrics, Published},
    pipeline::{Handled, Pipeline},
    session::FileLimits,
    sink::Sinks,
    source::{self, SourceEvent},
    unwind::sender::{TableSender, UnwindMode},
};

/// The intake channel between the connection threads and the driver, bounded: when the driver
/// falls behind, connection threads block, which backpressures the samplers.
pub(crate) fn intake() -> (SyncSender<SourceEvent>, Receiver<SourceEvent>) {
    mpsc::sync_channel(source::INTAKE_CAPACITY)
}

/// What the loop saw since it last asked the policy.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Tick {
    /// The pipeline handled an event.
    Handled(Handled),
    /// Nothing arrived within the poll period.
    Quiet,
    /// Every sender is gone: nothing more will arrive.
    Disconnected,
}

/// Whether the loop goes on.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    Stop,
}

/// A command's side of the loop: when to stop, what to print on the way.
pub(crate) trait Policy {
    /// The longest the loop waits for an event before asking [`Policy::check`] anyway.
    fn poll_period(&self) -> Duration;

    /// Sees each event before the pipeline takes it.
    fn saw(&mut self, _event: &SourceEvent) {}

    /// After each event or quiet poll period: go on or stop. `samples` counts every sample
    /// symbolized since start. An error ends the loop with that error (sinks unfinished).
    fn check(&mut self, tick: &Tick, samples: u64) -> anyhow::Result<Flow>;

    /// Between two events: new label settings to use from now on (`run` reloads them on
    /// SIGHUP or a changed config file), or `None` to keep the current ones.
    fn reload(&mut self, _now: Instant) -> Option<LabelSettings> {
        None
    }
}

/// How the loop ended: the last window, the sinks still to finish.
pub(crate) struct Ended {
    /// The last window (everything, when windows never close).
    pub window: LabeledProfile,
    /// The sampler's latest loss report.
    pub losses: Losses,
    pub sinks: Sinks,
}

pub(crate) struct Driver {
    pipeline: Pipeline,
    sinks: Sinks,
    /// The window so far: every completed interval since it started.
    window: LabeledProfile,
    /// `None`: one window for the whole run (`record`).
    window_length: Option<Duration>,
    /// Whether the window keeps samples: `record` (its summary) or a sink that reads windows.
    /// Otherwise it keeps only its time range, so `run` exporting OTLP alone holds no samples
    /// beyond the current interval.
    keep_window: bool,
    /// Samples of the window so far (whether or not it keeps them).
    window_samples: u64,
    /// The last interval handed to the sinks: once none holds it any more, the pipeline
    /// refills it as the next interval ([`Pipeline::recycle`]).
    spent: Option<Arc<LabeledProfile>>,
    window_started: Instant,
    /// What the metrics endpoint serves: published by the loop, never waited on.
    metrics: Arc<Metrics>,
    published: Published,
}

impl Driver {
    pub(crate) fn new(sinks: Sinks, file_limits: FileLimits, window: Option<Duration>) -> Self {
        let mut pipeline = Pipeline::new();
        pipeline.set_file_limits(file_limits);
        let keep_window = window.is_none() || sinks.want_window();
        Self {
            keep_window,
            window_samples: 0,
            spent: None,
            pipeline,
            sinks,
            window: LabeledProfile::default(),
            window_length: window,
            window_started: Instant::now(),
            metrics: Arc::default(),
            published: Published::default(),
        }
    }

    /// Publishes the loop's heartbeat and counters to `metrics` (served by `metrics::server`).
    pub(crate) fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Gives the pipeline its labels stage (tags, relabel rules, process filter).
    pub(crate) fn with_labels(mut self, labels: crate::labels::stage::LabelStage) -> Self {
        self.pipeline.set_labels(labels);
        self
    }

    /// With [`UnwindMode::Dwarf`], starts the worker that compiles each passed binary's unwind
    /// table (or takes it from the cache under `state_dir`) and sends it to its sampler.
    pub(crate) fn with_unwind(
        mut self,
        mode: UnwindMode,
        state_dir: Option<&Path>,
    ) -> anyhow::Result<Self> {
        if mode == UnwindMode::Dwarf {
            let cache = state_dir.and_then(crate::unwind::sender::open_cache);
            let sender = TableSender::spawn(cache).context("starting the unwind-table worker")?;
            self.pipeline.send_unwind_tables(sender);
        }
        Ok(self)
    }

    /// With `walk` false (`--interpreters off`), no interpreter's frames are walked.
    pub(crate) fn with_interpreters(mut self, walk: bool) -> Self {
        if !walk {
            self.pipeline.without_interpreters();
        }
        self
    }

    /// Runs until the policy says stop; hands the unfinished interval to the sinks before it
    /// returns.
    pub(crate) fn run(
        mut self,
        events: &Receiver<SourceEvent>,
        policy: &mut dyn Policy,
    ) -> anyhow::Result<Ended> {
        loop {
            let tick = match events.recv_timeout(policy.poll_period()) {
                Ok(event) => {
                    policy.saw(&event);
                    self.handle(event)
                }
                Err(RecvTimeoutError::Timeout) => Tick::Quiet,
                Err(RecvTimeoutError::Disconnected) => Tick::Disconnected,
            };
            self.publish();
            let flow = policy.check(&tick, self.pipeline.samples())?;
            if flow == Flow::Stop {
                break;
            }
            // Between two events: every sample before the swap has the old labels, every later
            // one the new.
            if let Some(settings) = policy.reload(Instant::now()) {
                self.pipeline.reload_labels(settings);
            }
            self.rotate_window();
        }
        self.end_interval();
        Ok(Ended {
            window: self.window,
            losses: self.pipeline.last_losses(),
            sinks: self.sinks,
        })
    }

    fn handle(&mut self, event: SourceEvent) -> Tick {
        let handled = self.pipeline.handle(event);
        if let Handled::Batch {
            last_part: true, ..
        } = handled
        {
            self.end_interval();
        }
        Tick::Handled(handled)
    }

    /// The loop is alive and here is what it counted: a few dozen numbers copied, no lock
    /// waited on (see `metrics`).
    fn publish(&mut self) {
        let (failed, unwritten) = self.sinks.poll();
        if failed > 0 {
            self.published.output.count(failed, unwritten);
        }
        self.metrics.heartbeat();
        self.published.relay = self.pipeline.stats();
        self.metrics.publish(&self.published);
    }

    /// Hands the interval so far to the sinks (unless it has no samples) and adds it to the
    /// window, whose time range grows by the interval's even when it had none.
    fn end_interval(&mut self) {
        if let Some(spent) = self.spent.take().and_then(|p| Arc::try_unwrap(p).ok()) {
            self.pipeline.recycle(spent);
        }
        let interval = Arc::new(self.pipeline.take_interval());
        if !interval.is_empty() {
            self.sinks.interval(&interval);
            self.published
                .latency
                .observe_interval_end(interval.end_unix_ns);
        }
        self.window_samples = self.window_samples.saturating_add(interval.total_samples());
        if self.keep_window {
            // Taken whole unless a sink still holds it (OTLP, until its thread encoded it):
            // then only what the window lacks is copied.
            match Arc::try_unwrap(interval) {
                Ok(interval) => self.window.merge(interval),
                Err(shared) => {
                    self.window
                        .merge_with(&shared, |thread| Some(thread.clone()));
                    self.spent = Some(shared);
                }
            }
        } else {
            self.window
                .observe(interval.start_unix_ns, interval.end_unix_ns);
            self.spent = Some(interval);
        }
    }

    /// Closes the window when it is due: the sinks get it, a new empty one starts.
    fn rotate_window(&mut self) {
        let Some(length) = self.window_length else {
            return;
        };
        if self.window_started.elapsed() < length {
            return;
        }
        let frequency = self.pipeline.frequency_hz();
        let window = Arc::new(std::mem::replace(
            &mut self.window,
            LabeledProfile::new(frequency),
        ));
        let (failed, unwritten) = self.sinks.window(&window);
        if failed > 0 {
            self.published.output.count(failed, unwritten);
            // Served now rather than at the next loop step.
            self.publish();
        }
        tracing::info!(
            samples = std::mem::take(&mut self.window_samples),
            "window complete; starting a new one"
        );
        drop(window);
        // A window that kept no samples (OTLP alone) freed nothing worth handing back.
        if self.keep_window {
            self.pipeline.freed();
        }
        self.window_started = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, fs, rc::Rc};

    use super::*;
    use crate::{
        pipeline::fixtures::{self, batch, session_start},
        sink::{files::FilesSink, Sink, SinkReport, WindowOutcome},
    };

    /// What a sink was handed, by call, with the sample count.
    #[derive(Debug, PartialEq, Eq)]
    enum Call {
        Interval(u64),
        Window(u64),
        Finish(u64),
    }

    /// A sink that writes down its calls into a log the test keeps.
    struct Recorder(Rc<RefCell<Vec<Call>>>);

    impl Sink for Recorder {
        fn interval(&mut self, profile: &Arc<LabeledProfile>) {
            self.0
                .borrow_mut()
                .push(Call::Interval(profile.total_samples()));
        }

        fn window(&mut self, profile: &Arc<LabeledProfile>) -> WindowOutcome {
            self.0
                .borrow_mut()
                .push(Call::Window(profile.total_samples()));
            WindowOutcome::Kept
        }

        fn finish(
            self: Box<Self>,
            window: &LabeledProfile,
            _: Duration,
        ) -> anyhow::Result<SinkReport> {
            self.0
                .borrow_mut()
                .push(Call::Finish(window.total_samples()));
            Ok(SinkReport::Quiet)
        }
    }

    /// Runs until the source is gone.
    struct UntilDisconnected;

    impl Policy for UntilDisconnected {
        fn poll_period(&self) -> Duration {
            Duration::from_millis(10)
        }

        fn check(&mut self, tick: &Tick, _: u64) -> anyhow::Result<Flow> {
            Ok(if *tick == Tick::Disconnected {
                Flow::Stop
            } else {
                Flow::Continue
            })
        }
    }

    /// A session, an interval in two parts (3 + 4 samples), then one of 5; the source then
    /// goes away.
    fn three_batches_two_intervals() -> Receiver<SourceEvent> {
        let (tx, rx) = intake();
        for event in session_start().into_iter().chain([
            batch(1, 0, 2, 3),
            batch(1, 1, 2, 4),
            batch(2, 0, 1, 5),
        ]) {
            tx.send(event).expect("queue an event");
        }
        rx
    }

    fn recorder() -> (Box<dyn Sink>, Rc<RefCell<Vec<Call>>>) {
        let log = Rc::new(RefCell::new(Vec::new()));
        (Box::new(Recorder(Rc::clone(&log))), log)
    }

    fn run(sinks: Sinks, window: Option<Duration>) -> Ended {
        let driver = Driver::new(sinks, FileLimits::default(), window);
        driver
            .run(&three_batches_two_intervals(), &mut UntilDisconnected)
            .expect("the driver runs")
    }

    fn finish(ended: Ended) -> Vec<SinkReport> {
        let mut reports = Vec::new();
        ended
            .sinks
            .finish(&ended.window, Duration::ZERO, &mut |report| {
                reports.push(report?);
                Ok(())
            })
            .expect("the sinks finish");
        reports
    }

    fn folded(dir: &std::path::Path) -> String {
        fs::read_to_string(dir.join("stacks.folded")).expect("read stacks.folded")
    }

    #[test]
    fn idle_intervals_widen_the_window_without_reaching_the_sinks() {
        // Given a recording sink and a source whose last two intervals had no samples
        let (sink, log) = recorder();
        let mut sinks = Sinks::default();
        sinks.push(sink);
        let (tx, rx) = intake();
        for event in session_start().into_iter().chain([
            batch(1, 0, 1, 5),
            batch(2, 0, 1, 0),
            batch(3, 0, 1, 0),
        ]) {
            tx.send(event).expect("queue an event");
        }
        drop(tx);
        // When they pass through the driver
        let ended = Driver::new(sinks, FileLimits::default(), None)
            .run(&rx, &mut UntilDisconnected)
            .expect("the driver runs");
        // Then the window covers the three observed seconds, not only the one with samples
        assert_eq!(
            (ended.window.start_unix_ns, ended.window.end_unix_ns),
            (1_000_000_000, 4_000_000_000)
        );
        assert_eq!(ended.window.total_samples(), 5);
        // And the sinks got only the interval with samples
        finish(ended);
        assert_eq!(*log.borrow(), [Call::Interval(5), Call::Finish(5)]);
    }

    #[test]
    fn an_interval_no_sink_holds_any_more_is_refilled_as_the_next_one() {
        // Given a driver whose window keeps no samples (no sink reads windows: OTLP alone) and
        // whose sink lets each interval go once handed it (the exporter, once encoded)
        let (sink, log) = recorder();
        let mut sinks = Sinks::default();
        sinks.push(sink);
        let window = Some(Duration::from_secs(60));
        let mut driver = Driver::new(sinks, FileLimits::default(), window);
        for event in session_start() {
            driver.handle(event);
        }
        // When an interval ends, the next one starts from empty
        driver.handle(batch(1, 0, 1, 5));
        assert_eq!(driver.pipeline.interval_row_capacity(), 0);
        // And when the next one ends
        driver.handle(batch(2, 0, 1, 5));
        // Then the one after is the first, emptied: its tables' room is refilled, not regrown
        assert!(driver.pipeline.interval_row_capacity() > 0);
        assert_eq!(*log.borrow(), [Call::Interval(5), Call::Interval(5)]);
    }

    #[test]
    fn each_interval_reaches_the_sinks_once_and_the_window_at_finish() {
        // Given a recording sink and no window length (record)
        let (sink, log) = recorder();
        let mut sinks = Sinks::default();
        sinks.push(sink);
        // When three batches of two intervals pass through the driver and it finishes
        let ended = run(sinks, None);
        assert_eq!(ended.window.total_samples(), 12);
        let reports = finish(ended);
        // Then the sink got each interval when its last part came, and the whole window once
        assert_eq!(
            *log.borrow(),
            [Call::Interval(7), Call::Interval(5), Call::Finish(12)]
        );
        assert!(matches!(reports[..], [SinkReport::Quiet]));
    }

    #[test]
    fn files_are_written_at_finish_not_per_batch() {
        // Given the files sink and no window length
        let tmp = tempfile::tempdir().expect("temp dir");
        let mut sinks = Sinks::default();
        sinks.push(Box::new(FilesSink::create_unowned(tmp.path())));
        // When every batch has passed through the driver
        let ended = run(sinks, None);
        // Then nothing was written yet
        assert_eq!(folded(tmp.path()), "");
        // And after finishing, the files hold the whole window, named
        let reports = finish(ended);
        let text = folded(tmp.path());
        let total: u64 = text
            .lines()
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum();
        assert_eq!(total, 12, "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("fixture;")
                    && l.contains("fixture_leaf_function;do_one_[k] ")),
            "{text}"
        );
        let [SinkReport::Files(paths)] = &reports[..] else {
            panic!("{reports:?}");
        };
        assert_eq!(paths.len(), 3);
    }

    #[test]
    fn a_closed_window_goes_to_the_sinks_and_a_new_one_starts() {
        // Given a window so short that every step of the loop closes it (run --window)
        let tmp = tempfile::tempdir().expect("temp dir");
        let (sink, log) = recorder();
        let mut sinks = Sinks::default();
        sinks.push(Box::new(FilesSink::create_unowned(tmp.path())));
        sinks.push(sink);
        // When the batches pass through
        let ended = run(sinks, Some(Duration::ZERO));
        // Then each interval closed its own window right after it reached the sinks
        let calls: Vec<Call> = log
            .borrow_mut()
            .drain(..)
            .filter(|c| !matches!(c, Call::Window(0)))
            .collect();
        assert_eq!(
            calls,
            [
                Call::Interval(7),
                Call::Window(7),
                Call::Interval(5),
                Call::Window(5)
            ]
        );
        // And finishing with the new, empty window (once the closed one, written on its own
        // thread, is done) leaves the files holding the last closed window
        assert_eq!(ended.window.total_samples(), 0);
        finish(ended);
        assert_eq!(*log.borrow(), [Call::Finish(0)]);
        let text = folded(tmp.path());
        assert!(text.ends_with(" 4\n"), "{text}");
        assert!(text.contains("do_one_[k] 4\n"), "{text}");
    }

    #[test]
    fn windows_a_sink_could_not_write_are_counted_in_the_published_metrics() {
        // Given a sink that can write no window (a full disk under --output-dir), beside one
        // that keeps them, and a window so short that every interval closes one
        struct Unwritable;
        impl Sink for Unwritable {
            fn wants_window(&self) -> bool {
                true
            }
            fn window(&mut self, profile: &Arc<LabeledProfile>) -> WindowOutcome {
                if profile.is_empty() {
                    WindowOutcome::Kept
                } else {
                    WindowOutcome::Unwritten {
                        samples: profile.total_samples(),
                    }
                }
            }
            fn finish(
                self: Box<Self>,
                _: &LabeledProfile,
                _: Duration,
            ) -> anyhow::Result<SinkReport> {
                Ok(SinkReport::Quiet)
            }
        }
        let (sink, _log) = recorder();
        let mut sinks = Sinks::default();
        sinks.push(Box::new(Unwritable));
        sinks.push(sink);
        let metrics = Arc::new(Metrics::default());
        // When the two intervals (7 and 5 samples) pass through
        Driver::new(sinks, FileLimits::default(), Some(Duration::ZERO))
            .with_metrics(Arc::clone(&metrics))
            .run(&three_batches_two_intervals(), &mut UntilDisconnected)
            .expect("the driver runs");
        // Then the metrics hold both windows and their samples as unwritten, once each
        let output = metrics.published().output;
        assert_eq!((output.windows_failed, output.samples_unwritten), (2, 12));
    }

    #[test]
    fn without_a_sink_that_reads_windows_the_window_keeps_its_time_but_no_samples() {
        // Given `run` with sinks that take intervals only (OTLP, debug)
        let (sink, log) = recorder();
        let mut sinks = Sinks::default();
        sinks.push(sink);
        // When the batches pass through a long window
        let ended = run(sinks, Some(Duration::from_secs(600)));
        // Then every interval reached the sinks, the window holds none of their samples but
        // covers their time, and the window's samples are still counted for its log line
        assert_eq!(
            *log.borrow(),
            [Call::Interval(7), Call::Interval(5)],
            "intervals"
        );
        assert!(ended.window.is_empty());
        assert_ne!(ended.window.start_unix_ns, 0);
        assert!(ended.window.end_unix_ns > ended.window.start_unix_ns);
    }

    #[test]
    fn the_intake_is_bounded() {
        // Given the intake channel
        let (tx, _rx) = intake();
        // When nobody receives, then it takes INTAKE_CAPACITY events and refuses the next
        for _ in 0..source::INTAKE_CAPACITY {
            tx.try_send(fixtures::closed()).expect("room in the intake");
        }
        assert!(matches!(
            tx.try_send(fixtures::closed()),
            Err(mpsc::TrySendError::Full(_))
        ));
    }

    #[test]
    fn the_policy_sees_every_event_and_stops_the_loop() {
        // Given a policy that stops at the first completed interval
        struct FirstInterval(usize);
        impl Policy for FirstInterval {
            fn poll_period(&self) -> Duration {
                Duration::from_millis(10)
            }
            fn saw(&mut self, _: &SourceEvent) {
                self.0 += 1;
            }
            fn check(&mut self, tick: &Tick, samples: u64) -> anyhow::Result<Flow> {
                let done = matches!(
                    tick,
                    Tick::Handled(Handled::Batch {
                        last_part: true,
                        ..
                    })
                );
                Ok(if done {
                    assert_eq!(samples, 7);
                    Flow::Stop
                } else {
                    Flow::Continue
                })
            }
        }
        let (sink, log) = recorder();
        let mut sinks = Sinks::default();
        sinks.push(sink);
        let mut policy = FirstInterval(0);
        // When the driver runs
        let ended = Driver::new(sinks, FileLimits::default(), None)
            .run(&three_batches_two_intervals(), &mut policy)
            .expect("the driver runs");
        // Then it stopped after the session's 4 events and the interval's 2 parts
        assert_eq!(policy.0, 6);
        assert_eq!(ended.window.total_samples(), 7);
        assert_eq!(*log.borrow(), [Call::Interval(7)]);
    }
}
