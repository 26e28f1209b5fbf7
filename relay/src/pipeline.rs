//! The relay's single pipeline thread: takes source events in order, keeps one [`Session`] per
//! sampler connection, symbolizes batches and accumulates them into the current [`Profile`].
//! Symbolizer state is not `Send` (blazesym resolvers), which is why all of it lives here.

use std::{collections::HashMap, os::fd::OwnedFd, time::Duration};

use ember_protocol::{Losses, SamplerMessage};

use crate::{
    model::Profile,
    session::{FileLimits, Session},
    source::{ConnectionId, SourceEvent},
    symbolize::{sigbus, ElfCache},
};

/// Resolvers unused this long are closed.
const RESOLVER_IDLE: Duration = Duration::from_secs(600);

/// What one handled event amounted to, for callers that report progress.
#[derive(Debug, Default, PartialEq, Eq)]
pub enum Handled {
    #[default]
    Nothing,
    /// A batch part was symbolized into the profile; `last_part` when it completed its interval.
    Batch { samples: u64, last_part: bool },
    /// A connection ended.
    Closed,
}

#[derive(Default)]
pub struct Pipeline {
    sessions: HashMap<ConnectionId, Session>,
    cache: ElfCache,
    pub profile: Profile,
    /// Samples since the last [`Pipeline::take_export`], when exporting (see
    /// [`Pipeline::with_export`]).
    export: Option<Profile>,
    /// Samples symbolized since start.
    pub samples: u64,
    /// Samples the sampler could not deliver, from its latest loss report.
    pub last_losses: Losses,
    pub connections_seen: u64,
    /// `processMappings` messages that continued no known process (ignored).
    pub orphan_mappings_messages: u64,
    /// `--max-copy-bytes` / `--max-open-files`, see [`Pipeline::set_file_limits`].
    limits: FileLimits,
    /// The SIGBUS guard's repair count when the pipeline last looked.
    sigbus_seen: u64,
}

impl Pipeline {
    pub fn new() -> Self {
        Self::default()
    }

    /// A pipeline that also keeps the samples of each interval for exporters
    /// ([`Pipeline::take_export`]), besides the window profile.
    pub fn with_export() -> Self {
        Self {
            export: Some(Profile::default()),
            ..Self::default()
        }
    }

    /// Applies the file limits; `max_open_files` is lowered to the soft RLIMIT_NOFILE minus a
    /// reserve when that is smaller.
    pub fn set_file_limits(&mut self, limits: FileLimits) {
        self.limits = limits.clamped_to_rlimit();
        self.cache.max_copy_bytes = self.limits.max_copy_bytes;
    }

    pub fn handle(&mut self, event: SourceEvent) -> Handled {
        match event {
            SourceEvent::Connected {
                conn,
                peer_uid,
                peer_pid,
            } => {
                self.connections_seen += 1;
                tracing::info!(connection = conn, peer_uid, peer_pid, "sampler connected");
                Handled::Nothing
            }
            SourceEvent::Closed { conn, error } => {
                if let Some(session) = self.sessions.remove(&conn) {
                    tracing::info!(
                        connection = conn,
                        samples = session.samples,
                        clean = error.is_none(),
                        "sampler disconnected"
                    );
                }
                Handled::Closed
            }
            SourceEvent::Message { conn, message, fds } => self.message(conn, message, fds),
        }
    }

    fn message(
        &mut self,
        conn: ConnectionId,
        message: SamplerMessage,
        fds: Vec<OwnedFd>,
    ) -> Handled {
        let fds: Vec<Option<OwnedFd>> = fds.into_iter().map(Some).collect();
        if let SamplerMessage::Hello(hello) = message {
            tracing::info!(
                connection = conn,
                sampler_version = %hello.sampler_version,
                hostname = %hello.hostname,
                frequency_hz = hello.frequency_hz,
                target_pid = hello.target_pid,
                "sampler hello"
            );
            if self.profile.frequency_hz == 0 {
                self.profile.frequency_hz = hello.frequency_hz;
            }
            let session = Session::new(hello, fds).with_max_open_files(self.limits.max_open_files);
            self.sessions.insert(conn, session);
            return Handled::Nothing;
        }
        // The source lets nothing but a hello open a connection.
        let Some(session) = self.sessions.get_mut(&conn) else {
            return Handled::Nothing;
        };
        match message {
            SamplerMessage::Hello(_) => Handled::Nothing,
            SamplerMessage::Files(files) => {
                session.add_files(files, fds);
                Handled::Nothing
            }
            SamplerMessage::Process(info) => {
                session.set_process(info);
                Handled::Nothing
            }
            SamplerMessage::ProcessMappings(more) => {
                if !session.append_mappings(more.pid, more.start_time_unix_ns, more.mappings) {
                    self.orphan_mappings_messages += 1;
                    tracing::debug!(
                        connection = conn,
                        pid = more.pid,
                        ignored = self.orphan_mappings_messages,
                        "mappings for an unknown process (or another start time) ignored"
                    );
                }
                Handled::Nothing
            }
            SamplerMessage::Exited { pid } => {
                session.remove_process(pid);
                Handled::Nothing
            }
            SamplerMessage::FilesClosed(ids) => {
                session.close_files(&ids);
                Handled::Nothing
            }
            SamplerMessage::Batch(batch) => {
                if self.profile.frequency_hz == 0 {
                    self.profile.frequency_hz = batch.frequency_hz;
                }
                let mut part = Profile::new(self.profile.frequency_hz);
                session.symbolize_batch(&batch, &mut self.cache, &mut part);
                if let Some(export) = self.export.as_mut() {
                    export.merge(part.clone());
                }
                self.profile.merge(part);
                let samples = batch.sample_count();
                self.samples += samples;
                self.last_losses = *batch.losses;
                tracing::info!(
                    connection = conn,
                    sequence = batch.sequence,
                    part = batch.part,
                    parts = batch.parts,
                    interval_start_unix_ns = batch.interval_start_unix_ns,
                    interval_end_unix_ns = batch.interval_end_unix_ns,
                    samples,
                    processes = session.process_count(),
                    files = session.file_count(),
                    unknown_frames = session.stats.unknown_frames,
                    frames = session.stats.frames,
                    user_stack_lost = batch.losses.user_stack_lost,
                    kernel_stack_lost = batch.losses.kernel_stack_lost,
                    counts_full = batch.losses.counts_full,
                    backlog_dropped_samples = batch.losses.backlog_dropped_samples,
                    facts_dropped = batch.losses.facts_dropped,
                    facts_truncated = batch.losses.facts_truncated,
                    files_unopened = batch.losses.files_unopened,
                    "batch received"
                );
                self.cache.evict_idle(RESOLVER_IDLE);
                self.check_sigbus();
                Handled::Batch {
                    samples,
                    last_part: batch.part.saturating_add(1) >= batch.parts,
                }
            }
        }
    }

    /// After the SIGBUS guard repaired a mapping (a file shrank while mapped), drops every
    /// resolver so no damaged mapping stays in use.
    fn check_sigbus(&mut self) {
        let repaired = sigbus::repaired();
        if repaired != self.sigbus_seen {
            tracing::warn!(
                pages = repaired.wrapping_sub(self.sigbus_seen),
                resolvers_dropped = self.cache.len(),
                "a mapped file shrank while the relay read it (truncated by its owner): the \
                 pages past its end read as zeros, symbols of that file were dropped, and every \
                 open symbolizer was closed to be reopened on demand"
            );
            self.sigbus_seen = repaired;
            self.cache.clear();
        }
    }

    /// Takes the samples accumulated for exporters since the last call (`None` without
    /// [`Pipeline::with_export`], or when there are none).
    pub fn take_export(&mut self) -> Option<Profile> {
        let export = self.export.as_mut()?;
        if export.is_empty() {
            return None;
        }
        let frequency = self.profile.frequency_hz;
        Some(std::mem::replace(export, Profile::new(frequency)))
    }

    /// Takes the accumulated profile, leaving an empty one with the same frequency.
    pub fn take_profile(&mut self) -> Profile {
        let frequency = self.profile.frequency_hz;
        std::mem::replace(&mut self.profile, Profile::new(frequency))
    }
}
