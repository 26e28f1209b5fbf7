//! `ember-relay record`: the one-command local mode. As root it starts ember-sampler on one end of
//! a socketpair, then drops to an unprivileged user before reading a single byte, records for the
//! requested time (Ctrl-C ends early), and writes the flamegraph, pprof and folded files (or what
//! `--format` chooses), then with `--open` shows the flamegraph in a browser. With
//! exporters configured it also exports every interval, and exits only once the OTLP queue has
//! drained or `export_timeout` has passed, saying which.

use std::{
    collections::HashSet,
    io::IsTerminal as _,
    os::{
        fd::{AsFd as _, AsRawFd as _, OwnedFd},
        unix::process::CommandExt as _,
    },
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _};
use ember_protocol::{transport, Limits, Losses, SamplerMessage};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use ember_common::LogFormat;

use crate::{
    browser::{self, Opener},
    config::Exporters,
    driver::{self, Driver, Ended, Flow, Policy, Tick},
    metrics::{self, Metrics, MetricsSettings},
    model::Profile,
    pipeline::Handled,
    privileges, sampler_binary,
    session::FileLimits,
    sink::{
        exporters::{self, OtlpFinished},
        files::{writer::FLAMEGRAPH, FilesSink, OutputFormat},
        otlp::{stats::DropReason, Drained},
        SinkReport, Sinks,
    },
    source::{self, SourceEvent},
    symbolize,
    unwind::sender::UnwindMode,
};
use crate::{config::labels::LabelConfig, usage::UsageError};

pub struct RecordConfig {
    pub duration: Duration,
    pub output: PathBuf,
    /// `--format`: which files `output` gets.
    pub formats: Vec<OutputFormat>,
    /// `--open`: show flamegraph.svg in a browser at the end (svg is in `formats`).
    pub open: bool,
    pub frequency_hz: u32,
    pub pid: Option<u32>,
    /// `--user`; None: the `ember` account, else a picked unused uid.
    pub user: Option<String>,
    pub sampler: Option<PathBuf>,
    pub interval: Duration,
    pub max_message_bytes: usize,
    pub log_format: LogFormat,
    /// The log level chosen for the command line (`warn`, or more with -v), handed to the
    /// sampler as `EMBER_LOG` unless the environment already sets a filter.
    pub log_level: &'static str,
    /// Resolved before privileges are dropped (TLS files are read then).
    pub exporters: Exporters,
    /// How long to wait for the OTLP queue to drain at the end.
    pub export_timeout: Duration,
    pub file_limits: FileLimits,
    /// Tags, relabel rules, process filter, folded root.
    pub labels: LabelConfig,
    /// `--unwind`, also passed to the sampler.
    pub unwind: UnwindMode,
    /// `--command-line`, passed to the sampler (which decides what leaves it).
    pub command_line: bool,
    /// `--metrics-address` (off unless asked for).
    pub metrics: MetricsSettings,
    /// `--state-dir`: where compiled unwind tables are cached (none by default).
    pub state_dir: Option<PathBuf>,
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
    ember_common::install_stop_handlers()?;
    // Chosen while root (the choice reads every process's status), before the sampler starts.
    let user = privileges::choose_user(config.user.as_deref())?;
    symbolize::sigbus::install().context("installing the SIGBUS guard")?;
    source::raise_nofile_limit();
    // Created as root (in a directory the invoking user may own), written after the drop; a
    // directory that cannot be made is refused before the sampler starts.
    let files = FilesSink::create(&config.output, &config.formats)
        .map_err(|err| {
            UsageError(format!(
                "--output {}: cannot create the output files there ({err:#}); choose a \
                 writable directory with -o DIR",
                config.output.display()
            ))
        })?
        .with_folded_root(config.labels.folded_root);
    // Reads /etc/passwd and the machine id (bounded) before the drop.
    let labels = config.labels.stage();
    // As root, before the drop and before any thread: the opener becomes the invoking user.
    let opener = opener(&config);
    let (ours, mut child) = start_sampler(&config)?;

    privileges::drop_to(&user)?;
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

    let control = ours.try_clone().context("duplicating the sampler socket")?;
    let limits = Limits {
        max_message_bytes: config.max_message_bytes,
    };
    let (events_tx, events) = driver::intake();
    thread::Builder::new()
        .name("sampler-conn".into())
        .spawn(move || source::serve_connection(1, ours, limits, events_tx))
        .context("starting the connection thread")?;

    let mut sinks = Sinks::default();
    sinks.push(Box::new(files));
    // Started unprivileged: threads created earlier would keep root's capabilities.
    // Served unprivileged too (the listening socket and its thread are created here).
    let metrics = Arc::new(Metrics::default());
    metrics::serve(config.metrics, &metrics)?;
    sinks.extend(exporters::start(config.exporters, &metrics)?);
    let mut policy = Recording::new(config.duration, control);
    let ended = Driver::new(sinks, config.file_limits, None)
        .with_labels(labels)
        .with_unwind(config.unwind, config.state_dir.as_deref())?
        .with_metrics(metrics)
        .run(&events, &mut policy)?;
    policy.progress.finish_and_clear();
    let exit = wait_child(&mut child);
    let verbose = config.log_level != "warn";
    finish(
        ended,
        policy.sampler_error,
        &exit,
        config.export_timeout,
        verbose,
    )?;
    opener.open();
    Ok(())
}

/// With `--open`, the waiting browser opener for flamegraph.svg (see [`browser`]).
fn opener(config: &RecordConfig) -> Opener {
    if !config.open {
        return Opener::Off;
    }
    browser::prepare(&config.output.join(FLAMEGRAPH), &|name| {
        std::env::var(name).ok()
    })
}

/// Starts ember-sampler on one end of a socketpair (inherited as `--fd`); returns our end.
fn start_sampler(config: &RecordConfig) -> anyhow::Result<(OwnedFd, Child)> {
    let (ours, theirs) = transport::pair().context("creating the sampler socketpair")?;
    nix::fcntl::fcntl(
        &theirs,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .context("letting the sampler inherit its socket")?;
    let named = sampler_path(config.sampler.clone());
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
        .arg(config.unwind.as_str())
        .stdin(Stdio::null());
    if let Some(pid) = config.pid {
        command.arg("--pid").arg(pid.to_string());
    }
    if config.command_line {
        command.arg("--command-line");
    }
    if !ember_common::log_filter_in_env() {
        command.env(ember_common::LOG_ENV, config.log_level);
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
    verbose: bool,
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
            SinkReport::Files(paths) => print_summary(&profile, &paths, &losses, verbose),
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

/// With `--unwind dwarf`: how the walked user stacks ended, per reason (totals since the
/// sampler started), and the tables the sampler loaded, refused and evicted.
fn print_unwind_summary(losses: &Losses) {
    let ends = [
        ("outermost", losses.unwind_outermost),
        ("zero_end", losses.unwind_zero_end),
        ("cut_at_frame_cap", losses.unwind_cut),
        ("read_failed", losses.unwind_read_failed),
        ("cfa_register", losses.unwind_stop_cfa_register),
        ("cfa_expression", losses.unwind_stop_cfa_expression),
        ("offset_range", losses.unwind_stop_offset_range),
        (
            "return_address_rule",
            losses.unwind_stop_return_address_rule,
        ),
        ("rbp_rule", losses.unwind_stop_rbp_rule),
        ("malformed", losses.unwind_stop_malformed),
        ("budget", losses.unwind_stop_budget),
    ];
    if ends.iter().all(|(_, n)| *n == 0) && losses.unwind_tables_loaded == 0 {
        return;
    }
    let listed: Vec<String> = ends
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| format!("{name} {n}"))
        .collect();
    println!("unwinding: stacks ended by {}", listed.join(", "));
    println!(
        "unwinding: frames by frame pointers: {} no mapping, {} no table, {} gap; \
         {} samples of processes not known yet; tables {} loaded, {} refused, {} evicted",
        losses.unwind_fp_no_mapping,
        losses.unwind_fp_no_table,
        losses.unwind_fp_gap,
        losses.unwind_no_process,
        losses.unwind_tables_loaded,
        losses.unwind_tables_refused,
        losses.unwind_tables_evicted,
    );
}

/// What `record` prints at the end: what was recorded, what was lost and why in words, the
/// files, the top functions; with `-v` also how the user stacks were unwound (internals).
fn print_summary(profile: &Profile, paths: &[PathBuf], losses: &Losses, verbose: bool) {
    let total = profile.total_samples();
    println!(
        "recorded {total} samples at {} Hz over {:.1}s",
        profile.frequency_hz,
        profile.end_unix_ns.saturating_sub(profile.start_unix_ns) as f64 / 1e9
    );
    let stacks: Vec<String> = [
        ("user", losses.user_stack_lost),
        ("kernel", losses.kernel_stack_lost),
    ]
    .iter()
    .filter(|(_, n)| *n > 0)
    .map(|(kind, n)| format!("the {kind} stack of {n} samples"))
    .collect();
    if !stacks.is_empty() {
        println!(
            "lost: {} (two stacks collided in the kernel's stack table, or it was full); the \
             samples are kept, their stacks marked [lost stack]",
            stacks.join(" and ")
        );
    }
    if losses.counts_full > 0 {
        println!(
            "lost: {} samples: more distinct stacks came in one interval than the sampler's \
             in-kernel table holds (a lower --frequency or a shorter --interval helps)",
            losses.counts_full
        );
    }
    if verbose {
        print_unwind_summary(losses);
    }
    for line in crate::interp::seen::summary_lines(&crate::interp::seen::snapshot()) {
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
}
