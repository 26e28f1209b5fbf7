//! `ember-relay record`: the one-command local mode. As root it starts ember-sampler on one end of
//! a socketpair, then drops to an unprivileged user before reading a single byte, records for the
//! requested time (Ctrl-C ends early), and writes the flamegraph, pprof and folded files (or what
//! `--format` chooses), then with `--open` shows the flamegraph in a browser. With
//! exporters configured it also exports every interval, and exits only once the OTLP queue has
//! drained or `export_timeout` has passed, saying which. The parts are built by
//! [`crate::assembly`]; `record` owns its policy: the sampler it starts, the privilege drop, its
//! duration and progress line, the summary, the browser.

use std::{
    collections::HashSet,
    io::IsTerminal as _,
    os::{
        fd::{AsFd as _, AsRawFd as _, OwnedFd},
        unix::process::CommandExt as _,
    },
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _};
use ember_common::LogFormat;
use ember_protocol::{transport, Losses, SamplerMessage, Summary};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::{
    assembly::{self, OutputUnwritable, Settings},
    browser::{self, Opener},
    driver::{Ended, Flow, Policy, Tick},
    labels::labeled::LabeledProfile,
    model::SampleKind,
    pipeline::Handled,
    privileges::{self, Target},
    sampler_binary,
    sink::{
        exporters::OtlpFinished,
        files::writer::FLAMEGRAPH,
        otlp::{stats::DropReason, Drained},
        SinkReport,
    },
    source::{self, SourceEvent},
    unwind::sender::UnwindMode,
    usage::UsageError,
};

pub struct RecordConfig {
    pub duration: Duration,
    /// `--open`: show flamegraph.svg in a browser at the end (svg is in `formats`).
    pub open: bool,
    /// `--user`; None: the `ember` account, else a picked unused uid.
    pub user: Option<String>,
    /// How the sampler is started.
    pub sampler: SamplerLaunch,
    /// The log level chosen for the command line (`warn`, or more with -v), handed to the
    /// sampler as `EMBER_LOG` unless the environment already sets a filter.
    pub log_level: &'static str,
    /// How long to wait for the OTLP queue to drain at the end.
    pub export_timeout: Duration,
    /// The relay's parts: `-o` and `--format`, the exporters (resolved before privileges are
    /// dropped: TLS files are read then), metrics, labels, unwinding (`--unwind` is also passed
    /// to the sampler). No window: one for the whole recording.
    pub parts: Settings,
}

/// `record`'s flags for the sampler it starts.
pub struct SamplerLaunch {
    /// `--sampler`: the binary; `None`: next to this executable, then `$PATH`.
    pub binary: Option<PathBuf>,
    pub frequency_hz: u32,
    pub pid: Option<u32>,
    pub interval: Duration,
    pub log_format: LogFormat,
    /// `--command-line`, passed to the sampler (which decides what leaves it).
    pub command_line: bool,
    /// `--off-cpu` with its `--off-cpu-min`, passed to the sampler.
    pub off_cpu_min: Option<Duration>,
}

/// How long to wait for the sampler's last batch after asking it to stop.
const FINISH_TIMEOUT: Duration = Duration::from_secs(20);

fn sampler_path(explicit: Option<PathBuf>) -> PathBuf {
    if let Some(path) = explicit {
        return path;
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("ember-sampler")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("ember-sampler"))
}

pub fn record(config: RecordConfig) -> anyhow::Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!(
            "`ember-relay record` starts the eBPF sampler, which needs root: run it with sudo \
             (the relay itself drops to an unprivileged user before it reads anything)"
        );
    }
    // Chosen while root (the choice reads every process's status), before the sampler starts.
    let user = privileges::choose_user(config.user.as_deref())?;
    let unwind = config.parts.unwind;
    let interpreters = config.parts.interpreters;
    let flamegraph = config
        .parts
        .output_dir
        .as_ref()
        .map(|dir| dir.join(FLAMEGRAPH));
    // As root: the output files are created in a directory the invoking user may own (written
    // after the drop), and one that cannot be made is refused before the sampler starts.
    let prepared = assembly::prepare(config.parts).map_err(output_refused)?;
    // As root, before the drop and before any thread: the opener becomes the invoking user.
    let opener = opener(config.open, flamegraph.as_deref());
    let (ours, mut child) = start_sampler(&config.sampler, unwind, config.log_level)?;

    privileges::drop_to(&user)?;
    log_dropped(&user);
    let control = ours.try_clone().context("duplicating the sampler socket")?;
    // Started unprivileged: threads created earlier would keep root's capabilities.
    let (relay, intake) = prepared.start()?;
    thread::Builder::new()
        .name("sampler-conn".into())
        .spawn(move || {
            source::serve_connection(1, ours, intake.limits, intake.events, &intake.refusals)
        })
        .context("starting the connection thread")?;
    let mut policy = Recording::new(config.duration, control);
    let ended = relay.run(&mut policy)?;
    policy.progress.finish_and_clear();
    let exit = wait_child(&mut child);
    let verbose = config.log_level != "warn";
    finish(
        ended,
        policy.sampler_error,
        &exit,
        config.export_timeout,
        Said {
            verbose,
            interpreters,
        },
    )?;
    opener.open();
    Ok(())
}

/// An output directory that cannot be made is a usage error naming the flag to change.
fn output_refused(err: anyhow::Error) -> anyhow::Error {
    match err.downcast::<OutputUnwritable>() {
        Ok(OutputUnwritable { dir, source }) => UsageError(format!(
            "--output {}: cannot create the output files there ({source:#}); choose a \
             writable directory with -o DIR",
            dir.display()
        ))
        .into(),
        Err(err) => err,
    }
}

/// The user the relay became, and with what it is left, for the log.
fn log_dropped(user: &Target) {
    let status = privileges::status();
    tracing::info!(
        user = %user.name,
        why = user.reason.as_str(),
        uid = %status.uid,
        gid = %status.gid,
        groups = %status.groups,
        cap_eff = %status.cap_eff,
        cap_prm = %status.cap_prm,
        cap_bnd = %status.cap_bnd,
        no_new_privs = %status.no_new_privs,
        "relay privileges dropped"
    );
}

/// With `--open`, the waiting browser opener for flamegraph.svg (see [`browser`]).
fn opener(open: bool, flamegraph: Option<&Path>) -> Opener {
    match flamegraph {
        Some(file) if open => browser::prepare(file, &|name| std::env::var(name).ok()),
        _ => Opener::Off,
    }
}

/// Starts ember-sampler on one end of a socketpair (inherited as `--fd`); returns our end.
fn start_sampler(
    config: &SamplerLaunch,
    unwind: UnwindMode,
    log_level: &'static str,
) -> anyhow::Result<(OwnedFd, Child)> {
    let (ours, theirs) = transport::pair().context("creating the sampler socketpair")?;
    nix::fcntl::fcntl(
        &theirs,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .context("letting the sampler inherit its socket")?;
    let named = sampler_path(config.binary.clone());
    let search_path = std::env::var("PATH").unwrap_or_default();
    let sampler = sampler_binary::trusted(&named, &search_path).map_err(|err| {
        UsageError(format!(
            "not starting {} as root: {err}. The sampler runs as root, so its file and every \
             directory above it must be root's and writable by no one else: install it so \
             (e.g. `sudo install -o root -g root -m 0755 ember-sampler /usr/local/bin/`) and \
             pass --sampler with that path",
            named.display()
        ))
    })?;
    let mut command = Command::new(&sampler);
    command
        .arg("--fd")
        .arg(theirs.as_raw_fd().to_string())
        .arg("--frequency")
        .arg(config.frequency_hz.to_string())
        .arg("--reporter-interval")
        .arg(format!("{}ms", config.interval.as_millis()))
        .arg("--log-format")
        .arg(config.log_format.as_str())
        .arg("--unwind")
        .arg(unwind.as_str())
        .stdin(Stdio::null());
    if let Some(pid) = config.pid {
        command.arg("--pid").arg(pid.to_string());
    }
    if config.command_line {
        command.arg("--command-line");
    }
    if let Some(min) = config.off_cpu_min {
        command
            .arg("--off-cpu")
            .arg("--off-cpu-min")
            .arg(format!("{}ns", min.as_nanos()));
    }
    if !ember_common::log_filter_in_env() {
        command.env(ember_common::LOG_ENV, log_level);
    }
    die_with_parent(&mut command);
    let child = command.spawn().with_context(|| {
        format!(
            "starting {}; build it (`cargo build`) or pass --sampler PATH",
            sampler.display()
        )
    })?;
    drop(theirs);
    Ok((ours, child))
}

/// Ends a recording: refuses an empty one, writes the files and prints the summary, then drains
/// the exporters and prints how that went.
fn finish(
    ended: Ended,
    sampler_error: Option<String>,
    exit: &str,
    export_timeout: Duration,
    said: Said,
) -> anyhow::Result<()> {
    let Ended {
        window: profile,
        losses,
        sinks,
    } = ended;
    if profile.is_empty() {
        let why = sampler_error
            .map(|e| format!("the connection failed: {e}"))
            .unwrap_or_else(|| format!("ember-sampler exited ({exit}); see its log above"));
        return Err(anyhow!("no samples were recorded: {why}"));
    }
    sinks.finish(&profile, export_timeout, &mut |report| {
        match report? {
            SinkReport::Files(paths) => print_summary(&profile, &paths, &losses, said),
            SinkReport::Otlp(finished) => print_export_summary(&finished, export_timeout),
            SinkReport::Quiet => {}
        }
        Ok(())
    })
}

/// `record`'s policy: stop the sampler after `duration` (or on Ctrl-C), end when its connection
/// closes (or it does not finish in time), and show progress meanwhile.
struct Recording {
    duration: Duration,
    /// Our end of the sampler socket, to shut down our sending side.
    control: OwnedFd,
    /// One live line on a terminal (hidden when stderr is not one).
    progress: ProgressBar,
    tty: bool,
    /// Processes that had samples so far.
    pids: HashSet<u32>,
    /// Samples the sampler lost so far (stacks lost, counts map full, backlog dropped).
    lost: u64,
    /// When the sampler's first message arrived: the recording's clock.
    started: Option<Instant>,
    stop_sent: Option<Instant>,
    last_progress: Instant,
    sampler_error: Option<String>,
}

impl Recording {
    fn new(duration: Duration, control: OwnedFd) -> Self {
        let tty = std::io::stderr().is_terminal();
        let target = if tty {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let length = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        let progress = ProgressBar::with_draw_target(Some(length), target);
        progress.set_style(
            ProgressStyle::with_template("{bar:20} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        Self {
            duration,
            control,
            progress,
            tty,
            pids: HashSet::new(),
            lost: 0,
            started: None,
            stop_sent: None,
            last_progress: Instant::now(),
            sampler_error: None,
        }
    }

    /// The live line on a terminal (indicatif limits its redraws); elsewhere an info log line
    /// every 5 s (shown with -v).
    fn progress(&mut self, elapsed: Duration, samples: u64) {
        if self.started.is_none() || self.stop_sent.is_some() {
            return;
        }
        let elapsed = elapsed.min(self.duration);
        let secs = elapsed.as_secs_f64();
        if self.tty {
            self.progress
                .set_position(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
            self.progress.set_message(format!(
                "{secs:.0}s / {:.0}s   {samples} samples   {} processes   {} lost",
                self.duration.as_secs_f64(),
                self.pids.len(),
                self.lost,
            ));
        } else if self.last_progress.elapsed() >= Duration::from_secs(5) {
            self.last_progress = Instant::now();
            tracing::info!(
                elapsed_s = secs.round(),
                samples,
                processes = self.pids.len(),
                lost = self.lost,
                "recording"
            );
        }
    }
}

impl Policy for Recording {
    fn poll_period(&self) -> Duration {
        Duration::from_millis(200)
    }

    fn saw(&mut self, event: &SourceEvent) {
        match event {
            SourceEvent::Closed { error, .. } => self.sampler_error.clone_from(error),
            SourceEvent::Message {
                message: SamplerMessage::Batch(batch),
                ..
            } => {
                self.pids.extend(batch.rows.iter().map(|row| row.pid));
                let l = &batch.losses;
                self.lost = l
                    .user_stack_lost
                    .saturating_add(l.kernel_stack_lost)
                    .saturating_add(l.counts_full)
                    .saturating_add(l.backlog_dropped_samples);
            }
            _ => {}
        }
        if self.started.is_none() && matches!(event, SourceEvent::Message { .. }) {
            self.started = Some(Instant::now());
        }
    }

    fn check(&mut self, tick: &Tick, samples: u64) -> anyhow::Result<Flow> {
        if matches!(tick, Tick::Handled(Handled::Closed) | Tick::Disconnected) {
            return Ok(Flow::Stop);
        }
        let elapsed = self.started.map_or(Duration::ZERO, |s| s.elapsed());
        if self.stop_sent.is_none() && (elapsed >= self.duration || ember_common::stop_requested())
        {
            // Shutting down our sending side tells the sampler to send its last batch and exit.
            if let Err(err) = transport::shutdown_write(self.control.as_fd()) {
                tracing::warn!(%err, "could not signal the sampler to stop");
            }
            self.stop_sent = Some(Instant::now());
        }
        if self.stop_sent.is_some_and(|t| t.elapsed() > FINISH_TIMEOUT) {
            tracing::warn!("ember-sampler did not finish in time; writing what arrived");
            return Ok(Flow::Stop);
        }
        self.progress(elapsed, samples);
        Ok(Flow::Continue)
    }
}

fn print_export_summary(finished: &OtlpFinished, timeout: Duration) {
    let s = &finished.stats;
    match &finished.drained {
        Drained::Drained => println!(
            "OTLP export to {}: queue drained; {} samples sent in {} requests ({} bytes \
             uncompressed)",
            finished.endpoint, s.samples_sent, s.requests_sent, s.bytes_sent
        ),
        Drained::TimedOut { requests, samples } => println!(
            "OTLP export to {}: timed out after {:.0}s with {requests} requests ({samples} \
             samples) undelivered; {} samples sent in {} requests",
            finished.endpoint,
            timeout.as_secs_f64(),
            s.samples_sent,
            s.requests_sent
        ),
    }
    let dropped: Vec<String> = DropReason::ALL
        .iter()
        .filter(|r| s.dropped_samples(**r) > 0)
        .map(|r| format!("{} {}", s.dropped_samples(*r), r.as_str()))
        .collect();
    if !dropped.is_empty() {
        println!("OTLP samples dropped: {}", dropped.join(", "));
    }
    if s.retries > 0 || s.partial_success > 0 {
        println!(
            "OTLP retries: {}, partial successes: {} ({} profiles rejected)",
            s.retries, s.partial_success, s.rejected_profiles
        );
    }
}

/// Makes the sampler die with this process: SIGKILL when the thread that forked it (ours, the
/// main thread, which lives until the relay exits) dies, and an immediate exit if we are already
/// gone when it starts. The sampler also exits when its inherited socket closes, which covers
/// the time after it changed its uid (a credential change clears the death signal).
fn die_with_parent(command: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before execve and calls only prctl, getppid
    // and _exit, which are async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died between fork and prctl: the signal will never come.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

fn wait_child(child: &mut std::process::Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.to_string(),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
            Ok(None) => return "still running".to_owned(),
            Err(err) => return format!("unknown status: {err}"),
        }
    }
}

/// The summary's lines about the sampler's counters: each loss a user needs to know of, in
/// plain words; with `verbose` also how the walked user stacks ended, per reason, and the
/// unwinder's other counts (nothing of them when it walked no stack). Totals since the
/// sampler started.
fn loss_lines(losses: &Losses, verbose: bool) -> Vec<String> {
    let mut lines = Vec::new();
    let (mut ends, mut counts, mut unwound) = (Vec::new(), Vec::new(), false);
    for (counter, n) in losses.counters() {
        match counter.summary {
            Summary::Lost(text) if n > 0 => lines.push(
                text.replace("{n}", &n.to_string())
                    .replace("{s}", if n == 1 { "" } else { "s" }),
            ),
            Summary::StackEnd(name) if n > 0 => ends.push(format!("{name} {n}")),
            Summary::Unwinding(words) => counts.push(format!("{n} {words}")),
            Summary::Hidden | Summary::Lost(_) | Summary::StackEnd(_) => {}
        }
        unwound |= n > 0 && matches!(counter.summary, Summary::Unwinding(_));
    }
    if verbose && (unwound || !ends.is_empty()) {
        if !ends.is_empty() {
            lines.push(format!("unwinding: stacks ended by {}", ends.join(", ")));
        }
        lines.push(format!("unwinding: {}", counts.join(", ")));
    }
    lines
}

/// What `record` prints at the end: what was recorded, what was lost and why in words, the
/// files, the top functions; with `-v` also how the user stacks were unwound (internals).
/// What the summary says beyond the profile: every loss (`--verbose`), and whether
/// interpreters' frames were walked (`--interpreters`).
#[derive(Clone, Copy)]
struct Said {
    verbose: bool,
    interpreters: bool,
}

fn print_summary(profile: &LabeledProfile, paths: &[PathBuf], losses: &Losses, said: Said) {
    let total = profile.total_samples();
    println!(
        "recorded {total} samples at {} Hz over {:.1}s",
        profile.frequency_hz,
        profile.end_unix_ns.saturating_sub(profile.start_unix_ns) as f64 / 1e9
    );
    for line in loss_lines(losses, said.verbose) {
        println!("{line}");
    }
    let seen = crate::interp::seen::snapshot();
    for line in crate::interp::seen::summary_lines(&seen, said.interpreters) {
        println!("{line}");
    }
    println!("wrote:");
    for path in paths {
        println!("  {}", path.display());
    }
    println!("top 10 functions by self time:");
    for (name, count) in profile.top_self(10) {
        println!(
            "  {:5.1}%  {count:>7}  {name}",
            100.0 * count as f64 / total.max(1) as f64
        );
    }
    print_off_cpu_summary(profile);
}

/// With `--off-cpu`: the total time threads spent blocked and the 10 functions they blocked
/// in most (each thread's innermost frame outside the kernel), in seconds.
fn print_off_cpu_summary(profile: &LabeledProfile) {
    let total = profile.total_of(SampleKind::OffCpu);
    if total == 0 {
        return;
    }
    println!(
        "off-CPU: {:.3} s blocked in all threads; top 10 functions by off-CPU time:",
        total as f64 / 1e9
    );
    for (name, ns) in profile.top_self_of(SampleKind::OffCpu, 10) {
        println!(
            "  {:5.1}%  {:>9.3}s  {name}",
            100.0 * ns as f64 / total as f64,
            ns as f64 / 1e9
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_says_each_loss_in_words_and_the_unwinding_only_when_verbose() {
        // Given a recording that lost stacks and samples, and unwound by DWARF
        let losses = Losses {
            samples: 1000,
            user_stack_lost: 3,
            kernel_stack_lost: 0,
            counts_full: 2,
            unwind_outermost: 5,
            unwind_read_failed: 1,
            unwind_tables_loaded: 4,
            unwind_fp_gap: 6,
            ..Losses::default()
        };
        // When the summary is made, Then each loss not zero is one line in plain words
        let lost = [
            "lost: the user stack of 3 samples (two stacks collided in the kernel's stack table, \
             or it was full); the samples are kept, their stacks marked [lost stack]",
            "lost: 2 samples: more distinct stacks came in one interval than the sampler's \
             in-kernel table holds (a lower --frequency or a shorter --interval helps)",
        ];
        assert_eq!(loss_lines(&losses, false), lost);
        // And one lost stack reads in the singular
        let one = Losses {
            kernel_stack_lost: 1,
            ..Losses::default()
        };
        assert_eq!(
            loss_lines(&one, false),
            [
                "lost: the kernel stack of 1 sample (two stacks collided in the kernel's stack \
              table, or it was full); the samples are kept, their stacks marked [lost stack]"
            ]
        );
        // And with -v, how the stacks ended and the unwinder's counts follow
        let verbose = loss_lines(&losses, true);
        assert_eq!(verbose[..2], lost);
        assert_eq!(
            verbose[2..],
            [
                "unwinding: stacks ended by outermost 5, read_failed 1",
                "unwinding: 4 tables loaded, 0 tables refused, 0 frames by frame pointers (no \
                 mapping), 0 frames by frame pointers (no table), 6 frames by frame pointers \
                 (gap), 0 samples of processes not known yet, 0 tables evicted",
            ]
        );
        // And a recording without DWARF unwinding says nothing of it
        let plain = Losses {
            samples: 1000,
            ..Losses::default()
        };
        assert!(loss_lines(&plain, true).is_empty());
    }
}
