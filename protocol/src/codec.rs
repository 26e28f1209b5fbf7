//! Cap'n Proto encoding and bounded decoding of [`SamplerMessage`].

use capnp::message::{Builder, ReaderOptions};

use crate::{
    ember_capnp::{
        batch, file_info, files_closed, hello, interp_code, interp_stack, interpreter_process,
        mapping, process_info, process_mappings, relay_message, row, sampler_message,
    },
    losses::Losses,
    messages::*,
};

/// Bounds applied to everything read from a peer.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest datagram accepted; larger ones are refused unparsed.
    pub max_message_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_bytes: 4 << 20,
        }
    }
}

impl Limits {
    /// Traversal budget for a message of `len` bytes: each word may be visited a few times
    /// (lists of structs with pointers), never more, so a crafted message cannot loop the reader.
    fn reader_options(&self, len: usize) -> ReaderOptions {
        let words = (len / 8) as u64;
        let mut options = ReaderOptions::new();
        options
            .traversal_limit_in_words(Some((words.saturating_mul(4) + 1024) as usize))
            .nesting_limit(16);
        options
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("message of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge { len: usize, limit: usize },
    #[error("not a valid Cap'n Proto message: {0}")]
    Capnp(#[from] capnp::Error),
    #[error("unknown message kind (union discriminant {0}); is the peer a newer ember?")]
    UnknownKind(u16),
    #[error("invalid field `{field}`: {reason}")]
    Invalid {
        field: &'static str,
        reason: &'static str,
    },
}

/// Encodes one message as a flat byte buffer (segment table + segments).
pub fn encode_sampler_message(message: &SamplerMessage) -> Vec<u8> {
    let mut builder = Builder::new_default();
    let root = builder.init_root::<sampler_message::Builder>();
    match message {
        SamplerMessage::Hello(hello) => write_hello(root.init_hello(), hello),
        SamplerMessage::Files(files) => {
            let mut list = root.init_files().init_files(len_u32(files.len()));
            for (i, file) in files.iter().enumerate() {
                write_file(list.reborrow().get(i as u32), file);
            }
        }
        SamplerMessage::Process(process) => write_process(root.init_process(), process),
        SamplerMessage::Batch(batch) => write_batch(root.init_batch(), batch),
        SamplerMessage::Exited { pids } => {
            let mut exited = root.init_exited();
            let (first, more) = pids.split_first().map_or((0, &[][..]), |(f, m)| (*f, m));
            exited.set_pid(first);
            let mut list = exited.init_more_pids(len_u32(more.len()));
            for (i, pid) in more.iter().enumerate() {
                list.set(i as u32, *pid);
            }
        }
        SamplerMessage::ProcessMappings(more) => {
            write_process_mappings(root.init_process_mappings(), more);
        }
        SamplerMessage::FilesClosed(ids) => write_files_closed(root.init_files_closed(), ids),
    }
    capnp::serialize::write_message_to_words(&builder)
}

/// Opens one datagram as a capnp message under `limits`: its size first, then the traversal
/// budget that grows with it. Both directions' decoders start here.
fn open<'a>(
    bytes: &'a [u8],
    limits: &Limits,
) -> Result<capnp::message::Reader<capnp::serialize::BufferSegments<&'a [u8]>>, DecodeError> {
    if bytes.len() > limits.max_message_bytes {
        return Err(DecodeError::TooLarge {
            len: bytes.len(),
            limit: limits.max_message_bytes,
        });
    }
    let mut slice = bytes;
    Ok(capnp::serialize::read_message_from_flat_slice(
        &mut slice,
        limits.reader_options(bytes.len()),
    )?)
}

/// Decodes one datagram, enforcing `limits`.
pub fn decode_sampler_message(
    bytes: &[u8],
    limits: &Limits,
) -> Result<SamplerMessage, DecodeError> {
    let reader = open(bytes, limits)?;
    let root = reader.get_root::<sampler_message::Reader>()?;
    let message = match root.which() {
        Ok(sampler_message::Hello(hello)) => SamplerMessage::Hello(read_hello(hello?)?),
        Ok(sampler_message::Files(files)) => {
            let files = files?.get_files()?;
            let mut out = Vec::with_capacity(files.len() as usize);
            for file in files.iter() {
                out.push(read_file(file)?);
            }
            SamplerMessage::Files(out)
        }
        Ok(sampler_message::Process(process)) => SamplerMessage::Process(read_process(process?)?),
        Ok(sampler_message::Batch(batch)) => SamplerMessage::Batch(read_batch(batch?)?),
        Ok(sampler_message::Exited(exited)) => {
            let exited = exited?;
            let more = exited.get_more_pids()?;
            let mut pids = Vec::with_capacity(more.len() as usize + 1);
            pids.push(exited.get_pid());
            pids.extend(more.iter());
            SamplerMessage::Exited { pids }
        }
        Ok(sampler_message::ProcessMappings(more)) => {
            SamplerMessage::ProcessMappings(read_process_mappings(more?)?)
        }
        Ok(sampler_message::FilesClosed(closed)) => {
            SamplerMessage::FilesClosed(closed?.get_file_ids()?.iter().collect())
        }
        Err(capnp::NotInSchema(kind)) => return Err(DecodeError::UnknownKind(kind)),
    };
    Ok(message)
}

/// Encodes one relay -> sampler message.
pub fn encode_relay_message(message: &RelayMessage) -> Vec<u8> {
    let mut builder = Builder::new_default();
    let root = builder.init_root::<relay_message::Builder>();
    match message {
        RelayMessage::UnwindTableChunk(chunk) => {
            let mut b = root.init_unwind_table_chunk();
            b.set_file_id(chunk.file_id);
            b.set_chunk(chunk.chunk);
            b.set_chunks(chunk.chunks);
            b.set_data(&chunk.data);
            b.set_vaddr_minus_offset(chunk.vaddr_minus_offset);
        }
        RelayMessage::DropUnwindTable { file_id } => {
            root.init_drop_unwind_table().set_file_id(*file_id);
        }
        RelayMessage::IgnoreProcesses(ignore) => {
            let mut b = root.init_ignore_processes();
            b.set_forget_all(ignore.forget_all);
            let mut list = b.init_processes(len_u32(ignore.processes.len()));
            for (i, process) in ignore.processes.iter().enumerate() {
                let mut entry = list.reborrow().get(i as u32);
                entry.set_pid(process.pid);
                entry.set_start_time_unix_ns(process.start_time_unix_ns);
            }
        }
        RelayMessage::InterpreterProcess(process) => {
            write_interpreter_process(root.init_interpreter_process(), process);
        }
    }
    capnp::serialize::write_message_to_words(&builder)
}

/// Decodes one relay -> sampler datagram, enforcing `limits`. A chunk whose data is over
/// [`MAX_UNWIND_CHUNK_BYTES`] is refused here, before anyone copies it; members the sampler does
/// not act on (`welcome`, `goodbye`) are [`DecodeError::UnknownKind`]. Of an `ignoreProcesses`
/// only the first [`MAX_IGNORE_PER_MESSAGE`] entries are read; the rest are counted in `excess`.
pub fn decode_relay_message(bytes: &[u8], limits: &Limits) -> Result<RelayMessage, DecodeError> {
    let reader = open(bytes, limits)?;
    let root = reader.get_root::<relay_message::Reader>()?;
    match root.which() {
        Ok(relay_message::UnwindTableChunk(chunk)) => {
            let chunk = chunk?;
            let data = chunk.get_data()?;
            if data.len() > MAX_UNWIND_CHUNK_BYTES {
                return Err(DecodeError::Invalid {
                    field: "unwindTableChunk.data",
                    reason: "over 48 KiB",
                });
            }
            Ok(RelayMessage::UnwindTableChunk(UnwindTableChunk {
                file_id: chunk.get_file_id(),
                chunk: chunk.get_chunk(),
                chunks: chunk.get_chunks(),
                data: data.to_vec(),
                vaddr_minus_offset: chunk.get_vaddr_minus_offset(),
            }))
        }
        Ok(relay_message::DropUnwindTable(drop)) => Ok(RelayMessage::DropUnwindTable {
            file_id: drop?.get_file_id(),
        }),
        Ok(relay_message::IgnoreProcesses(ignore)) => {
            let ignore = ignore?;
            let list = ignore.get_processes()?;
            let read = list.len().min(len_u32(MAX_IGNORE_PER_MESSAGE));
            let processes = (0..read)
                .map(|i| {
                    let entry = list.get(i);
                    IgnoredProcess {
                        pid: entry.get_pid(),
                        start_time_unix_ns: entry.get_start_time_unix_ns(),
                    }
                })
                .collect();
            Ok(RelayMessage::IgnoreProcesses(IgnoreProcesses {
                forget_all: ignore.get_forget_all(),
                processes,
                excess: list.len() - read,
            }))
        }
        Ok(relay_message::InterpreterProcess(process)) => Ok(RelayMessage::InterpreterProcess(
            read_interpreter_process(process?)?,
        )),
        Ok(relay_message::Welcome(_)) => Err(DecodeError::UnknownKind(0)),
        Ok(relay_message::Goodbye(())) => Err(DecodeError::UnknownKind(1)),
        Err(capnp::NotInSchema(kind)) => Err(DecodeError::UnknownKind(kind)),
    }
}

fn write_interpreter_process(mut b: interpreter_process::Builder<'_>, p: &InterpreterProcess) {
    b.set_pid(p.pid);
    b.set_start_time_unix_ns(p.start_time_unix_ns);
    b.set_file_id(p.file_id);
    b.set_runtime(p.runtime);
    b.set_root(p.root);
    b.set_code_type(p.code_type);
    b.set_forget(p.forget);
    let mut layout = b.init_layout(len_u32(p.layout.len()));
    for (i, &offset) in p.layout.iter().enumerate() {
        layout.set(i as u32, offset);
    }
}

/// An `interpreterProcess` whose layout has exactly [`INTERP_LAYOUT_LEN`] offsets (a forget may
/// have none); the sampler checks the values.
fn read_interpreter_process(
    r: interpreter_process::Reader<'_>,
) -> Result<InterpreterProcess, DecodeError> {
    let list = r.get_layout()?;
    let forget = r.get_forget();
    let mut layout = [INTERP_LAYOUT_ABSENT; INTERP_LAYOUT_LEN];
    if list.len() as usize == INTERP_LAYOUT_LEN {
        for (slot, offset) in layout.iter_mut().zip(list.iter()) {
            *slot = offset;
        }
    } else if !(forget && list.is_empty()) {
        return Err(DecodeError::Invalid {
            field: "interpreterProcess.layout",
            reason: "not exactly 17 offsets",
        });
    }
    Ok(InterpreterProcess {
        pid: r.get_pid(),
        start_time_unix_ns: r.get_start_time_unix_ns(),
        file_id: r.get_file_id(),
        runtime: r.get_runtime(),
        root: r.get_root(),
        code_type: r.get_code_type(),
        layout,
        forget,
    })
}

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

fn text(reader: capnp::Result<capnp::text::Reader<'_>>) -> Result<String, DecodeError> {
    // Paths and command names are bytes to the kernel; keep what we can rather than fail.
    Ok(String::from_utf8_lossy(reader?.as_bytes()).into_owned())
}

fn write_hello(mut b: hello::Builder<'_>, hello: &Hello) {
    b.set_protocol_version(hello.protocol_version);
    b.set_sampler_version(&hello.sampler_version[..]);
    b.set_hostname(&hello.hostname[..]);
    b.set_frequency_hz(hello.frequency_hz);
    b.set_kallsyms_fd(hello.kallsyms_fd);
    b.set_target_pid(hello.target_pid);
    b.set_unwind_rows(hello.unwind_rows);
    b.set_unwind_tables(hello.unwind_tables);
}

fn read_hello(r: hello::Reader<'_>) -> Result<Hello, DecodeError> {
    Ok(Hello {
        protocol_version: r.get_protocol_version(),
        sampler_version: text(r.get_sampler_version())?,
        hostname: text(r.get_hostname())?,
        frequency_hz: r.get_frequency_hz(),
        kallsyms_fd: r.get_kallsyms_fd(),
        target_pid: r.get_target_pid(),
        unwind_rows: r.get_unwind_rows(),
        unwind_tables: r.get_unwind_tables(),
    })
}

fn write_file(mut b: file_info::Builder<'_>, file: &FileInfo) {
    b.set_file_id(file.file_id);
    b.set_device(file.device);
    b.set_inode(file.inode);
    b.set_path(&file.path[..]);
    b.set_fd(file.fd);
    b.set_open_error(&file.open_error[..]);
}

fn read_file(r: file_info::Reader<'_>) -> Result<FileInfo, DecodeError> {
    Ok(FileInfo {
        file_id: r.get_file_id(),
        device: r.get_device(),
        inode: r.get_inode(),
        path: text(r.get_path())?,
        fd: r.get_fd(),
        open_error: text(r.get_open_error())?,
    })
}

fn write_mapping(mut b: mapping::Builder<'_>, m: &Mapping) {
    b.set_start(m.start);
    b.set_end(m.end);
    b.set_file_offset(m.file_offset);
    b.set_path(&m.path[..]);
    b.set_device(m.device);
    b.set_inode(m.inode);
    b.set_file_id(m.file_id);
}

fn read_mapping(r: mapping::Reader<'_>) -> Result<Mapping, DecodeError> {
    let mapping = Mapping {
        start: r.get_start(),
        end: r.get_end(),
        file_offset: r.get_file_offset(),
        path: text(r.get_path())?,
        device: r.get_device(),
        inode: r.get_inode(),
        file_id: r.get_file_id(),
    };
    if mapping.end < mapping.start {
        return Err(DecodeError::Invalid {
            field: "mapping.end",
            reason: "ends before it starts",
        });
    }
    Ok(mapping)
}

fn write_process(mut b: process_info::Builder<'_>, p: &ProcessInfo) {
    b.set_pid(p.pid);
    b.set_start_time_unix_ns(p.start_time_unix_ns);
    b.set_executable_path(&p.executable_path[..]);
    b.set_executable_name(&p.executable_name[..]);
    b.set_cgroup(&p.cgroup[..]);
    b.set_mappings_omitted(p.mappings_omitted);
    b.set_uid(p.uid.unwrap_or(UNKNOWN_UID));
    b.set_otel_service_name(p.otel_service_name.as_deref().unwrap_or(""));
    b.set_otel_resource_attributes(p.otel_resource_attributes.as_deref().unwrap_or(""));
    b.set_command_line(p.command_line.as_deref().unwrap_or_default());
    b.set_perf_map_fd(p.perf_map_fd.unwrap_or(NO_FD));
    b.set_perf_map_refused(&p.perf_map_refused[..]);
    write_mappings(b.init_mappings(len_u32(p.mappings.len())), &p.mappings);
}

fn write_files_closed(b: files_closed::Builder<'_>, ids: &[u64]) {
    let mut list = b.init_file_ids(len_u32(ids.len()));
    for (i, &id) in ids.iter().enumerate() {
        list.set(i as u32, id);
    }
}

fn write_mappings(mut list: capnp::struct_list::Builder<'_, mapping::Owned>, mappings: &[Mapping]) {
    for (i, m) in mappings.iter().enumerate() {
        write_mapping(list.reborrow().get(i as u32), m);
    }
}

fn read_mappings(
    list: capnp::struct_list::Reader<'_, mapping::Owned>,
) -> Result<Vec<Mapping>, DecodeError> {
    let mut mappings = Vec::with_capacity(list.len() as usize);
    for m in list.iter() {
        mappings.push(read_mapping(m)?);
    }
    Ok(mappings)
}

fn write_process_mappings(mut b: process_mappings::Builder<'_>, p: &ProcessMappings) {
    b.set_pid(p.pid);
    b.set_start_time_unix_ns(p.start_time_unix_ns);
    write_mappings(b.init_mappings(len_u32(p.mappings.len())), &p.mappings);
}

fn read_process_mappings(r: process_mappings::Reader<'_>) -> Result<ProcessMappings, DecodeError> {
    Ok(ProcessMappings {
        pid: r.get_pid(),
        start_time_unix_ns: r.get_start_time_unix_ns(),
        mappings: read_mappings(r.get_mappings()?)?,
    })
}

fn read_process(r: process_info::Reader<'_>) -> Result<ProcessInfo, DecodeError> {
    let mappings = read_mappings(r.get_mappings()?)?;
    Ok(ProcessInfo {
        pid: r.get_pid(),
        start_time_unix_ns: r.get_start_time_unix_ns(),
        executable_path: text(r.get_executable_path())?,
        executable_name: text(r.get_executable_name())?,
        cgroup: text(r.get_cgroup())?,
        mappings,
        mappings_omitted: r.get_mappings_omitted(),
        uid: Some(r.get_uid()).filter(|&uid| uid != UNKNOWN_UID),
        otel_service_name: Some(text(r.get_otel_service_name())?).filter(|v| !v.is_empty()),
        otel_resource_attributes: Some(text(r.get_otel_resource_attributes())?)
            .filter(|v| !v.is_empty()),
        command_line: Some(r.get_command_line()?.to_vec()).filter(|v| !v.is_empty()),
        perf_map_fd: Some(r.get_perf_map_fd()).filter(|&fd| fd >= 0),
        perf_map_refused: text(r.get_perf_map_refused())?,
    })
}

/// `ProcessInfo.uid` on the wire when the uid is unknown (the schema's default).
const UNKNOWN_UID: u32 = u32::MAX;

fn write_stacks(
    mut list: capnp::struct_list::Builder<'_, crate::ember_capnp::stack::Owned>,
    stacks: &[Vec<u64>],
) {
    for (i, stack) in stacks.iter().enumerate() {
        let mut frames = list
            .reborrow()
            .get(i as u32)
            .init_frames(len_u32(stack.len()));
        for (j, addr) in stack.iter().enumerate() {
            frames.set(j as u32, *addr);
        }
    }
}

fn read_stacks(
    list: capnp::struct_list::Reader<'_, crate::ember_capnp::stack::Owned>,
) -> Result<Vec<Vec<u64>>, DecodeError> {
    let mut out = Vec::with_capacity(list.len() as usize);
    for stack in list.iter() {
        out.push(stack.get_frames()?.iter().collect());
    }
    Ok(out)
}

fn stack_ref_parts(stack: StackRef) -> (i32, i32) {
    match stack {
        StackRef::Index(index) => (i32::try_from(index).unwrap_or(i32::MAX), 0),
        StackRef::Missing(errno) => (-1, errno),
    }
}

fn stack_ref(
    index: i32,
    errno: i32,
    stacks: usize,
    field: &'static str,
) -> Result<StackRef, DecodeError> {
    if index < 0 {
        return Ok(StackRef::Missing(errno));
    }
    if index as usize >= stacks {
        return Err(DecodeError::Invalid {
            field,
            reason: "stack index out of range",
        });
    }
    Ok(StackRef::Index(index as u32))
}

fn write_batch(mut b: batch::Builder<'_>, batch: &Batch) {
    b.set_sequence(batch.sequence);
    b.set_part(batch.part);
    b.set_parts(batch.parts);
    b.set_interval_start_unix_ns(batch.interval_start_unix_ns);
    b.set_interval_end_unix_ns(batch.interval_end_unix_ns);
    b.set_frequency_hz(batch.frequency_hz);
    b.set_ignored_samples(batch.ignore.ignored_samples);
    b.set_ignore_refused(batch.ignore.refused);
    b.set_ignored_processes(batch.ignore.processes);
    write_stacks(
        b.reborrow()
            .init_user_stacks(len_u32(batch.user_stacks.len())),
        &batch.user_stacks,
    );
    write_stacks(
        b.reborrow()
            .init_kernel_stacks(len_u32(batch.kernel_stacks.len())),
        &batch.kernel_stacks,
    );
    let mut rows = b.reborrow().init_rows(len_u32(batch.rows.len()));
    for (i, row) in batch.rows.iter().enumerate() {
        write_row(rows.reborrow().get(i as u32), row);
    }
    write_interp_stacks(
        b.reborrow()
            .init_interp_stacks(len_u32(batch.interp_stacks.len())),
        &batch.interp_stacks,
    );
    write_interp_codes(
        b.reborrow()
            .init_interp_codes(len_u32(batch.interp_codes.len())),
        &batch.interp_codes,
    );
    let l = &batch.losses;
    let mut lb = b.init_losses();
    lb.set_samples(l.samples);
    lb.set_idle(l.idle);
    lb.set_filtered(l.filtered);
    lb.set_user_stack_lost(l.user_stack_lost);
    lb.set_kernel_stack_lost(l.kernel_stack_lost);
    lb.set_counts_full(l.counts_full);
    lb.set_backlog_dropped_batches(l.backlog_dropped_batches);
    lb.set_backlog_dropped_samples(l.backlog_dropped_samples);
    lb.set_proc_errors(l.proc_errors);
    lb.set_facts_dropped(l.facts_dropped);
    lb.set_facts_truncated(l.facts_truncated);
    lb.set_files_unopened(l.files_unopened);
    lb.set_unwind_tables_loaded(l.unwind_tables_loaded);
    lb.set_unwind_tables_refused(l.unwind_tables_refused);
    lb.set_unwind_stopped(l.unwind_stopped);
    lb.set_unwind_cut(l.unwind_cut);
    lb.set_unwind_map_full(l.unwind_map_full);
    lb.set_unwind_outermost(l.unwind_outermost);
    lb.set_unwind_stop_cfa_register(l.unwind_stop_cfa_register);
    lb.set_unwind_stop_cfa_expression(l.unwind_stop_cfa_expression);
    lb.set_unwind_stop_offset_range(l.unwind_stop_offset_range);
    lb.set_unwind_stop_return_address_rule(l.unwind_stop_return_address_rule);
    lb.set_unwind_stop_rbp_rule(l.unwind_stop_rbp_rule);
    lb.set_unwind_stop_malformed(l.unwind_stop_malformed);
    lb.set_unwind_stop_budget(l.unwind_stop_budget);
    lb.set_unwind_read_failed(l.unwind_read_failed);
    lb.set_unwind_zero_end(l.unwind_zero_end);
    lb.set_unwind_fp_no_mapping(l.unwind_fp_no_mapping);
    lb.set_unwind_fp_no_table(l.unwind_fp_no_table);
    lb.set_unwind_fp_gap(l.unwind_fp_gap);
    lb.set_unwind_no_process(l.unwind_no_process);
    lb.set_unwind_tables_evicted(l.unwind_tables_evicted);
    lb.set_interp_walked(l.interp_walked);
    lb.set_interp_no_thread(l.interp_no_thread);
    lb.set_interp_read_failed(l.interp_read_failed);
    lb.set_interp_cut(l.interp_cut);
    lb.set_interp_stacks_full(l.interp_stacks_full);
    lb.set_interp_codes_full(l.interp_codes_full);
    lb.set_interp_bad_code(l.interp_bad_code);
    lb.set_interp_refused(l.interp_refused);
    lb.set_off_cpu_kept(l.off_cpu_kept);
    lb.set_off_cpu_sampled_out(l.off_cpu_sampled_out);
    lb.set_off_cpu_counts_full(l.off_cpu_counts_full);
}

fn write_row(mut b: row::Builder<'_>, row: &Row) {
    b.set_pid(row.pid);
    b.set_tid(row.tid);
    b.set_comm(&row.comm[..]);
    let (user, user_errno) = stack_ref_parts(row.user_stack);
    b.set_user_stack(user);
    b.set_user_stack_errno(user_errno);
    let (kernel, kernel_errno) = stack_ref_parts(row.kernel_stack);
    b.set_kernel_stack(kernel);
    b.set_kernel_stack_errno(kernel_errno);
    b.set_count(row.count);
    b.set_interp_stack(row.interp_stack.map_or(0, |i| i.saturating_add(1)));
    b.set_off_cpu_ns(row.off_cpu_ns);
}

fn write_interp_stacks(
    mut list: capnp::struct_list::Builder<'_, interp_stack::Owned>,
    stacks: &[InterpStackWire],
) {
    for (i, stack) in stacks.iter().enumerate() {
        let mut b = list.reborrow().get(i as u32);
        b.set_end(stack.end);
        let mut frames = b.init_frames(len_u32(stack.frames.len()));
        for (j, frame) in stack.frames.iter().enumerate() {
            let mut f = frames.reborrow().get(j as u32);
            f.set_code(frame.code);
            f.set_instruction(frame.instruction);
            f.set_marker(frame.marker);
        }
    }
}

fn write_interp_codes(
    mut list: capnp::struct_list::Builder<'_, interp_code::Owned>,
    codes: &[InterpCodeWire],
) {
    for (i, code) in codes.iter().enumerate() {
        let mut b = list.reborrow().get(i as u32);
        b.set_pid(code.pid);
        b.set_code(code.code);
        b.set_first_line(code.first_line);
        b.set_name(&code.name);
        b.set_filename(&code.filename);
        b.set_linetable(&code.linetable);
    }
}

/// The interpreter stacks of a batch, each at most [`MAX_INTERP_FRAMES`] deep.
fn read_interp_stacks(
    list: capnp::struct_list::Reader<'_, interp_stack::Owned>,
) -> Result<Vec<InterpStackWire>, DecodeError> {
    let mut out = Vec::with_capacity(list.len() as usize);
    for stack in list.iter() {
        let frames = stack.get_frames()?;
        if frames.len() as usize > MAX_INTERP_FRAMES {
            return Err(DecodeError::Invalid {
                field: "interpStack.frames",
                reason: "over 64 frames",
            });
        }
        out.push(InterpStackWire {
            frames: frames
                .iter()
                .map(|f| InterpFrameWire {
                    code: f.get_code(),
                    instruction: f.get_instruction(),
                    marker: f.get_marker(),
                })
                .collect(),
            end: stack.get_end(),
        });
    }
    Ok(out)
}

/// Raw bytes of at most `limit`, else the field is refused.
fn bounded_data(
    data: capnp::Result<capnp::data::Reader<'_>>,
    limit: usize,
    field: &'static str,
) -> Result<Vec<u8>, DecodeError> {
    let data = data?;
    if data.len() > limit {
        return Err(DecodeError::Invalid {
            field,
            reason: "longer than the kernel copies",
        });
    }
    Ok(data.to_vec())
}

fn read_interp_codes(
    list: capnp::struct_list::Reader<'_, interp_code::Owned>,
) -> Result<Vec<InterpCodeWire>, DecodeError> {
    let mut out = Vec::with_capacity(list.len() as usize);
    for code in list.iter() {
        out.push(InterpCodeWire {
            pid: code.get_pid(),
            code: code.get_code(),
            first_line: code.get_first_line(),
            name: bounded_data(code.get_name(), INTERP_NAME_BYTES, "interpCode.name")?,
            filename: bounded_data(
                code.get_filename(),
                INTERP_FILE_BYTES,
                "interpCode.filename",
            )?,
            linetable: bounded_data(
                code.get_linetable(),
                INTERP_LINES_BYTES,
                "interpCode.linetable",
            )?,
        });
    }
    Ok(out)
}

fn read_batch(r: batch::Reader<'_>) -> Result<Batch, DecodeError> {
    let user_stacks = read_stacks(r.get_user_stacks()?)?;
    let kernel_stacks = read_stacks(r.get_kernel_stacks()?)?;
    let interp_stacks = read_interp_stacks(r.get_interp_stacks()?)?;
    let interp_codes = read_interp_codes(r.get_interp_codes()?)?;
    let rows_r = r.get_rows()?;
    let mut rows = Vec::with_capacity(rows_r.len() as usize);
    for row in rows_r.iter() {
        rows.push(Row {
            pid: row.get_pid(),
            tid: row.get_tid(),
            comm: text(row.get_comm())?,
            user_stack: stack_ref(
                row.get_user_stack(),
                row.get_user_stack_errno(),
                user_stacks.len(),
                "row.userStack",
            )?,
            kernel_stack: stack_ref(
                row.get_kernel_stack(),
                row.get_kernel_stack_errno(),
                kernel_stacks.len(),
                "row.kernelStack",
            )?,
            count: row.get_count(),
            interp_stack: match row.get_interp_stack() {
                0 => None,
                n if (n as usize) <= interp_stacks.len() => Some(n - 1),
                _ => {
                    return Err(DecodeError::Invalid {
                        field: "row.interpStack",
                        reason: "stack index out of range",
                    })
                }
            },
            off_cpu_ns: row.get_off_cpu_ns(),
        });
    }
    let l = r.get_losses()?;
    Ok(Batch {
        sequence: r.get_sequence(),
        part: r.get_part(),
        parts: r.get_parts(),
        interval_start_unix_ns: r.get_interval_start_unix_ns(),
        interval_end_unix_ns: r.get_interval_end_unix_ns(),
        frequency_hz: r.get_frequency_hz(),
        user_stacks,
        kernel_stacks,
        rows,
        losses: Box::new(Losses {
            samples: l.get_samples(),
            idle: l.get_idle(),
            filtered: l.get_filtered(),
            user_stack_lost: l.get_user_stack_lost(),
            kernel_stack_lost: l.get_kernel_stack_lost(),
            counts_full: l.get_counts_full(),
            backlog_dropped_batches: l.get_backlog_dropped_batches(),
            backlog_dropped_samples: l.get_backlog_dropped_samples(),
            proc_errors: l.get_proc_errors(),
            facts_dropped: l.get_facts_dropped(),
            facts_truncated: l.get_facts_truncated(),
            files_unopened: l.get_files_unopened(),
            unwind_tables_loaded: l.get_unwind_tables_loaded(),
            unwind_tables_refused: l.get_unwind_tables_refused(),
            unwind_stopped: l.get_unwind_stopped(),
            unwind_cut: l.get_unwind_cut(),
            unwind_map_full: l.get_unwind_map_full(),
            unwind_outermost: l.get_unwind_outermost(),
            unwind_stop_cfa_register: l.get_unwind_stop_cfa_register(),
            unwind_stop_cfa_expression: l.get_unwind_stop_cfa_expression(),
            unwind_stop_offset_range: l.get_unwind_stop_offset_range(),
            unwind_stop_return_address_rule: l.get_unwind_stop_return_address_rule(),
            unwind_stop_rbp_rule: l.get_unwind_stop_rbp_rule(),
            unwind_stop_malformed: l.get_unwind_stop_malformed(),
            unwind_stop_budget: l.get_unwind_stop_budget(),
            unwind_read_failed: l.get_unwind_read_failed(),
            unwind_zero_end: l.get_unwind_zero_end(),
            unwind_fp_no_mapping: l.get_unwind_fp_no_mapping(),
            unwind_fp_no_table: l.get_unwind_fp_no_table(),
            unwind_fp_gap: l.get_unwind_fp_gap(),
            unwind_no_process: l.get_unwind_no_process(),
            unwind_tables_evicted: l.get_unwind_tables_evicted(),
            interp_walked: l.get_interp_walked(),
            interp_no_thread: l.get_interp_no_thread(),
            interp_read_failed: l.get_interp_read_failed(),
            interp_cut: l.get_interp_cut(),
            interp_stacks_full: l.get_interp_stacks_full(),
            interp_codes_full: l.get_interp_codes_full(),
            interp_bad_code: l.get_interp_bad_code(),
            interp_refused: l.get_interp_refused(),
            off_cpu_kept: l.get_off_cpu_kept(),
            off_cpu_sampled_out: l.get_off_cpu_sampled_out(),
            off_cpu_counts_full: l.get_off_cpu_counts_full(),
        }),
        ignore: IgnoreStats {
            ignored_samples: r.get_ignored_samples(),
            refused: r.get_ignore_refused(),
            processes: r.get_ignored_processes(),
        },
        interp_stacks,
        interp_codes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_batch() -> Batch {
        Batch {
            sequence: 3,
            part: 1,
            parts: 2,
            interval_start_unix_ns: 10,
            interval_end_unix_ns: 20,
            frequency_hz: 97,
            user_stacks: vec![vec![0x401000, 0x401200], vec![0x7f00_0000_1000]],
            kernel_stacks: vec![vec![0xffff_ffff_8100_0000]],
            rows: vec![
                Row {
                    pid: 42,
                    tid: 43,
                    comm: "worker".into(),
                    user_stack: StackRef::Index(1),
                    kernel_stack: StackRef::Index(0),
                    count: 7,
                    interp_stack: Some(1),
                    off_cpu_ns: 0,
                },
                Row {
                    pid: 42,
                    tid: 44,
                    comm: "idle\u{fffd}".into(),
                    user_stack: StackRef::Missing(17),
                    kernel_stack: StackRef::Missing(14),
                    count: 1,
                    interp_stack: None,
                    off_cpu_ns: 0,
                },
            ],
            losses: Box::new(Losses {
                samples: 100,
                user_stack_lost: 1,
                backlog_dropped_batches: 2,
                facts_dropped: 3,
                facts_truncated: 4,
                files_unopened: 5,
                unwind_tables_refused: 6,
                unwind_cut: 7,
                unwind_stop_rbp_rule: 8,
                unwind_tables_evicted: 9,
                unwind_fp_gap: 10,
                ..Losses::default()
            }),
            ignore: IgnoreStats {
                ignored_samples: 8,
                refused: 9,
                processes: 10,
            },
            interp_stacks: vec![
                InterpStackWire {
                    frames: vec![],
                    end: 2,
                },
                InterpStackWire {
                    frames: vec![
                        InterpFrameWire {
                            code: 0x7f00_0000_2000,
                            instruction: u64::MAX,
                            marker: 3,
                        },
                        InterpFrameWire {
                            code: 0x7f00_0000_3000,
                            instruction: 0x7f00_0000_3042,
                            marker: 0,
                        },
                    ],
                    end: 1,
                },
            ],
            interp_codes: vec![InterpCodeWire {
                pid: 42,
                code: 0x7f00_0000_2000,
                first_line: -3,
                name: b"\x01\0hot".to_vec(),
                filename: vec![0xff; INTERP_FILE_BYTES],
                linetable: Vec::new(),
            }],
        }
    }

    fn interpreter_process() -> InterpreterProcess {
        let mut layout = [INTERP_LAYOUT_ABSENT; INTERP_LAYOUT_LEN];
        for (i, slot) in layout.iter_mut().enumerate().skip(3) {
            *slot = 8 * i as u16;
        }
        InterpreterProcess {
            pid: 42,
            start_time_unix_ns: 5,
            file_id: 3,
            runtime: INTERP_RUNTIME_CPYTHON,
            root: 0x7f00_0010_0000,
            code_type: 0x7f00_0020_0000,
            layout,
            forget: false,
        }
    }

    #[test]
    fn interpreter_processes_round_trip_and_a_layout_of_another_length_is_refused() {
        let limits = Limits::default();
        let forget = InterpreterProcess {
            forget: true,
            ..interpreter_process()
        };
        for message in [interpreter_process(), forget] {
            let message = RelayMessage::InterpreterProcess(message);
            let bytes = encode_relay_message(&message);
            assert_eq!(
                decode_relay_message(&bytes, &limits).expect("decodes"),
                message
            );
        }
        // Given a layout of 16 and one of 18 offsets, When decoded, Then both are refused
        for len in [INTERP_LAYOUT_LEN - 1, INTERP_LAYOUT_LEN + 1] {
            let mut builder = Builder::new_default();
            let mut b = builder
                .init_root::<relay_message::Builder<'_>>()
                .init_interpreter_process();
            b.set_pid(42);
            b.init_layout(len as u32);
            let bytes = capnp::serialize::write_message_to_words(&builder);
            assert!(
                matches!(
                    decode_relay_message(&bytes, &limits),
                    Err(DecodeError::Invalid { .. })
                ),
                "{len} offsets"
            );
        }
    }

    #[test]
    fn interp_stacks_and_codes_over_the_kernel_bounds_are_refused() {
        let frame = InterpFrameWire::default();
        // Given a stack of 64 frames, When it round-trips, Then it is kept
        let mut at_cap = sample_batch();
        at_cap.interp_stacks[0].frames = vec![frame; MAX_INTERP_FRAMES];
        let bytes = encode_sampler_message(&SamplerMessage::Batch(at_cap.clone()));
        assert_eq!(
            decode_sampler_message(&bytes, &Limits::default()).expect("decodes"),
            SamplerMessage::Batch(at_cap)
        );
        // Given one of 65 frames, a name one byte over and a row past the stacks: each refused
        let mut deep = sample_batch();
        deep.interp_stacks[0].frames = vec![frame; MAX_INTERP_FRAMES + 1];
        let mut long_name = sample_batch();
        long_name.interp_codes[0].name = vec![b'a'; INTERP_NAME_BYTES + 1];
        let mut long_lines = sample_batch();
        long_lines.interp_codes[0].linetable = vec![0; INTERP_LINES_BYTES + 1];
        let mut dangling = sample_batch();
        dangling.rows[1].interp_stack = Some(2);
        for bad in [deep, long_name, long_lines, dangling] {
            let bytes = encode_sampler_message(&SamplerMessage::Batch(bad));
            assert!(matches!(
                decode_sampler_message(&bytes, &Limits::default()),
                Err(DecodeError::Invalid { .. })
            ));
        }
    }

    #[test]
    fn relay_messages_round_trip_and_oversized_chunks_are_refused() {
        let limits = Limits::default();
        let chunk = RelayMessage::UnwindTableChunk(UnwindTableChunk {
            file_id: 7,
            chunk: 1,
            chunks: 3,
            data: vec![0xab; MAX_UNWIND_CHUNK_BYTES],
            vaddr_minus_offset: -0x1000,
        });
        let dropped = RelayMessage::DropUnwindTable { file_id: 9 };
        for message in [chunk, dropped] {
            let bytes = encode_relay_message(&message);
            assert_eq!(
                decode_relay_message(&bytes, &limits).expect("decodes"),
                message
            );
        }
        // Given a chunk one byte over the bound, When decoded, Then it is refused unparsed.
        let over = encode_relay_message(&RelayMessage::UnwindTableChunk(UnwindTableChunk {
            file_id: 7,
            chunk: 0,
            chunks: 1,
            data: vec![0; MAX_UNWIND_CHUNK_BYTES + 1],
            vaddr_minus_offset: 0,
        }));
        assert!(matches!(
            decode_relay_message(&over, &limits),
            Err(DecodeError::Invalid { .. })
        ));
        assert!(decode_relay_message(&[1, 2, 3], &limits).is_err());
    }

    #[test]
    fn ignore_processes_round_trips_and_reads_at_most_the_per_message_cap() {
        let limits = Limits::default();
        let entry = |pid: u32| IgnoredProcess {
            pid,
            start_time_unix_ns: u64::from(pid) << 32 | 7,
        };
        // Given a message at the cap, When decoded, Then it is what was sent
        let full = RelayMessage::IgnoreProcesses(IgnoreProcesses {
            forget_all: true,
            processes: (0..MAX_IGNORE_PER_MESSAGE as u32).map(entry).collect(),
            excess: 0,
        });
        let bytes = encode_relay_message(&full);
        assert_eq!(
            decode_relay_message(&bytes, &limits).expect("decodes"),
            full
        );
        // Given 300 entries over the cap, When decoded, Then only the first 1024 are read and
        // the rest are counted as excess
        let over = RelayMessage::IgnoreProcesses(IgnoreProcesses {
            forget_all: false,
            processes: (0..MAX_IGNORE_PER_MESSAGE as u32 + 300)
                .map(entry)
                .collect(),
            excess: 0,
        });
        let Ok(RelayMessage::IgnoreProcesses(read)) =
            decode_relay_message(&encode_relay_message(&over), &limits)
        else {
            panic!("an ignoreProcesses over the cap must still decode");
        };
        assert_eq!(read.processes.len(), MAX_IGNORE_PER_MESSAGE);
        assert_eq!(read.processes.last(), Some(&entry(1023)));
        assert_eq!((read.excess, read.forget_all), (300, false));
    }

    #[test]
    fn every_loss_counter_crosses_the_wire_under_its_own_field() {
        // Given a batch whose loss counters each hold a value no other holds
        let batch = Batch {
            losses: Box::new(crate::distinct_losses(1000)),
            ..sample_batch()
        };
        // When it is encoded and decoded
        let bytes = encode_sampler_message(&SamplerMessage::Batch(batch.clone()));
        let Ok(SamplerMessage::Batch(read)) = decode_sampler_message(&bytes, &Limits::default())
        else {
            panic!("a batch decodes");
        };
        // Then every counter arrives with its value (a field the codec forgets arrives as 0,
        // two fields crossed arrive swapped)
        for (counter, sent) in batch.losses.counters() {
            assert_eq!((counter.get)(&read.losses), sent, "{}", counter.field);
        }
    }

    #[test]
    fn every_message_kind_round_trips() {
        let messages = vec![
            SamplerMessage::Hello(Hello {
                protocol_version: crate::PROTOCOL_VERSION,
                sampler_version: "0.1.0".into(),
                hostname: "node-1".into(),
                frequency_hz: 97,
                kallsyms_fd: 0,
                target_pid: 0,
                unwind_rows: 3_000_000,
                unwind_tables: 10_000,
            }),
            SamplerMessage::Files(vec![FileInfo {
                file_id: 1,
                device: 2049,
                inode: 77,
                path: "/usr/bin/app".into(),
                fd: 0,
                open_error: String::new(),
            }]),
            SamplerMessage::Process(ProcessInfo {
                pid: 42,
                start_time_unix_ns: 5,
                executable_path: "/usr/bin/app".into(),
                executable_name: "app".into(),
                cgroup: "/system.slice/app.service".into(),
                mappings: vec![Mapping {
                    start: 0x400000,
                    end: 0x401000,
                    file_offset: 0x1000,
                    path: "/usr/bin/app".into(),
                    device: 2049,
                    inode: 77,
                    file_id: 1,
                }],
                mappings_omitted: 6,
                uid: Some(1000),
                otel_service_name: Some("billing".into()),
                otel_resource_attributes: Some("team=finance".into()),
                command_line: Some(b"app\0--port\x008080\0\xff\0".to_vec()),
                // (both at once only here: the sampler sends one or the other)
                perf_map_fd: Some(0),
                perf_map_refused: "it is a symlink".into(),
            }),
            SamplerMessage::ProcessMappings(ProcessMappings {
                pid: 42,
                start_time_unix_ns: 5,
                mappings: vec![Mapping {
                    start: 0x500000,
                    end: 0x502000,
                    file_offset: 0,
                    path: "/usr/lib/libx.so".into(),
                    device: 2049,
                    inode: 78,
                    file_id: 2,
                }],
            }),
            SamplerMessage::Batch(sample_batch()),
            SamplerMessage::Exited { pids: vec![42] },
            SamplerMessage::Exited {
                pids: vec![42, 7, 4_000_000],
            },
            SamplerMessage::FilesClosed(vec![1, 2, u64::MAX]),
            SamplerMessage::FilesClosed(Vec::new()),
        ];
        for message in messages {
            let bytes = encode_sampler_message(&message);
            let back = decode_sampler_message(&bytes, &Limits::default()).expect("decodes");
            assert_eq!(back, message);
        }
    }

    #[test]
    fn a_process_without_the_new_fields_reads_as_unknown_uid_and_no_environment() {
        // Given a v3 `process` written as a peer that predates uid and the environment fields
        // writes it: those fields never set (an old schema has no setter for them)
        let mut builder = Builder::new_default();
        let mut process = builder
            .init_root::<sampler_message::Builder<'_>>()
            .init_process();
        process.set_pid(7);
        process.set_executable_name("app");
        let bytes = capnp::serialize::write_message_to_words(&builder);
        let old = ProcessInfo {
            pid: 7,
            executable_name: "app".into(),
            ..ProcessInfo::default()
        };
        // When decoded, Then uid is unknown and no variable is set (no protocol bump needed)
        match decode_sampler_message(&bytes, &Limits::default()) {
            Ok(SamplerMessage::Process(info)) => {
                assert_eq!(info, old);
                assert_eq!(
                    (
                        info.uid,
                        info.otel_service_name,
                        info.otel_resource_attributes,
                        info.command_line
                    ),
                    (None, None, None, None)
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_version_2_hello_still_decodes_so_its_version_can_be_refused() {
        // Given a hello as a v2 sampler wrote it (built word by word: this build has no v2
        // schema): data section protocolVersion 2, frequencyHz 99, kallsymsFd -1, targetPid 0,
        // then v2's bootTimeUnixNs in a third data word that v3 no longer has
        let words: [u64; 8] = [
            1 << 32 | 1 << 48,   // root: struct, 1 data word, 1 pointer
            0,                   // union discriminant 0: hello
            3 << 32 | 2 << 48,   // -> Hello: 3 data words, 2 pointers (v3 has 2 words)
            2 | 99 << 32,        // protocolVersion, frequencyHz
            u64::from(u32::MAX), // kallsymsFd -1, targetPid 0
            123,                 // bootTimeUnixNs (v2 only)
            0,                   // samplerVersion: null
            0,                   // hostname: null
        ];
        let mut bytes = vec![0, 0, 0, 0, 8, 0, 0, 0];
        bytes.extend(words.iter().flat_map(|w| w.to_le_bytes()));
        // When this build decodes it
        let decoded = decode_sampler_message(&bytes, &Limits::default()).expect("decodes");
        // Then it is a hello whose version the relay can read (and refuse)
        let SamplerMessage::Hello(hello) = decoded else {
            panic!("expected a hello, got {}", decoded.kind());
        };
        assert_eq!(
            (
                hello.protocol_version,
                hello.frequency_hz,
                hello.kallsyms_fd
            ),
            (2, 99, NO_FD)
        );
        assert_ne!(hello.protocol_version, crate::PROTOCOL_VERSION);
    }

    #[test]
    fn garbage_and_truncation_are_errors() {
        let bytes = encode_sampler_message(&SamplerMessage::Batch(sample_batch()));
        assert!(decode_sampler_message(&bytes[..bytes.len() / 2], &Limits::default()).is_err());
        assert!(
            decode_sampler_message(b"definitely not capnp at all", &Limits::default()).is_err()
        );
        assert!(decode_sampler_message(&[], &Limits::default()).is_err());
    }

    #[test]
    fn oversized_is_refused_before_parsing() {
        let bytes = encode_sampler_message(&SamplerMessage::Batch(sample_batch()));
        let limits = Limits {
            max_message_bytes: bytes.len() - 1,
        };
        assert!(matches!(
            decode_sampler_message(&bytes, &limits),
            Err(DecodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn out_of_range_stack_index_is_refused() {
        let mut batch = sample_batch();
        batch.rows[0].user_stack = StackRef::Index(9);
        let bytes = encode_sampler_message(&SamplerMessage::Batch(batch));
        assert!(matches!(
            decode_sampler_message(&bytes, &Limits::default()),
            Err(DecodeError::Invalid { .. })
        ));
    }

    #[test]
    fn a_list_bomb_hits_the_traversal_limit() {
        // Given a well-formed message of a few KiB in which 301 stack pointers all point at one
        // stack of 300 words: reading it visits ~90,000 words, far more than its size allows
        // (the limit is 4 x its words + 1024) but less than capnp's default limit (8 Mi words),
        // so only our limit can refuse it.
        const DEPTH: u64 = 300;
        const STACKS: usize = 300;
        let mut batch = sample_batch();
        batch.rows = Vec::new();
        batch.kernel_stacks = Vec::new();
        batch.user_stacks = vec![Vec::new(); STACKS + 1];
        batch.user_stacks[0] = vec![0x40_1000; DEPTH as usize];
        let mut bytes = encode_sampler_message(&SamplerMessage::Batch(batch));
        assert_eq!(
            &bytes[..4],
            &[0, 0, 0, 0],
            "one segment, so pointers are near"
        );
        let word = |b: &[u8], i: usize| {
            u64::from_le_bytes(b[8 + 8 * i..16 + 8 * i].try_into().expect("8 bytes"))
        };
        // A list pointer (kind 1) to 8-byte elements (size 5) with `count` elements.
        let is_list = |w: u64, count: u64| w & 3 == 1 && (w >> 32) & 7 == 5 && w >> 35 == count;
        let words = (bytes.len() - 8) / 8;
        let first = (0..words)
            .find(|&i| is_list(word(&bytes, i), DEPTH))
            .expect("the deep stack's pointer");
        let offset = i64::from((word(&bytes, first) as u32 as i32) >> 2);
        let target = first as i64 + 1 + offset;
        for pointer in first + 1..=first + STACKS {
            assert!(
                is_list(word(&bytes, pointer), 0),
                "an empty stack's pointer"
            );
            let offset = target - (pointer as i64 + 1);
            let low = ((offset as i32) << 2) as u32 | 1;
            let aimed = u64::from(low) | ((DEPTH << 3 | 5) << 32);
            bytes[8 + 8 * pointer..16 + 8 * pointer].copy_from_slice(&aimed.to_le_bytes());
        }
        let limits = Limits {
            max_message_bytes: 8 << 20,
        };
        // When it is decoded
        let result = decode_sampler_message(&bytes, &limits);
        // Then decoding fails on the traversal limit, not on anything else
        match result {
            Err(DecodeError::Capnp(err)) => {
                assert_eq!(err.kind, capnp::ErrorKind::ReadLimitExceeded, "{err}");
            }
            Err(other) => panic!("expected the traversal limit to refuse it, got {other}"),
            Ok(message) => panic!(
                "expected the traversal limit to refuse it, but a `{}` decoded",
                message.kind()
            ),
        }
    }
}
