# The sampler <-> relay protocol of ember. One Cap'n Proto message per SOCK_SEQPACKET datagram;
# open file descriptors ride in the same datagram as SCM_RIGHTS and are referenced by their index
# in that datagram's descriptor list ("fd index"). Evolve by adding fields and union members only;
# bump `protocolVersion` when a change is not backwards compatible.
@0x8a66bb243be03d9d;

# v3: `filesClosed` added; `Hello.bootTimeUnixNs`, `Mapping.buildId` and the thread list of
# `ProcessInfo` removed (nobody read them: thread names come with each sample's row).
const protocolVersion :UInt32 = 3;

# Everything the sampler sends. The first message on a connection is `hello`.
struct SamplerMessage {
  union {
    hello @0 :Hello;
    files @1 :FileBatch;
    process @2 :ProcessInfo;
    batch @3 :Batch;
    exited @4 :ProcessExit;
    processMappings @5 :ProcessMappings;
    filesClosed @6 :FilesClosed;
  }
}

struct Hello {
  protocolVersion @0 :UInt32;
  samplerVersion @1 :Text;
  hostname @2 :Text;
  frequencyHz @3 :UInt32;
  # Index of an fd of /proc/kallsyms opened by the privileged sampler; -1 when it could not open it.
  # Must stay the first five fields: a relay reads `protocolVersion` of any generation's hello.
  kallsymsFd @4 :Int32;
  # Only this process is sampled; 0 means all processes.
  targetPid @5 :UInt32;
  # Rows and table entries the sampler's unwind maps hold (`--unwind-memory-bytes`); 0 with
  # `--unwind fp` or from an older sampler. The relay sends no more than this, each file owner
  # within a fair share.
  unwindRows @6 :UInt32;
  unwindTables @7 :UInt32;
}

# Mapped files, each opened once per (device, inode) by the sampler and passed as an fd. A file
# stays valid on the connection until a `filesClosed` names its id.
struct FileBatch {
  files @0 :List(FileInfo);
}

struct FileInfo {
  # Sampler-assigned id, unique on this connection; mappings refer to files by it.
  fileId @0 :UInt64;
  device @1 :UInt64;
  inode @2 :UInt64;
  path @3 :Text;
  # Index of the fd in this datagram, or -1 when the sampler could not open the file.
  fd @4 :Int32;
  # Why the file could not be opened (empty when `fd` is set).
  openError @5 :Text;
}

struct Mapping {
  start @0 :UInt64;
  end @1 :UInt64;
  fileOffset @2 :UInt64;
  path @3 :Text;
  device @4 :UInt64;
  inode @5 :UInt64;
  # The `FileInfo.fileId` of the mapped file; 0 when no file was passed (anonymous, vdso, ...).
  # The sampler parses no ELF: the relay reads the build id from the passed file.
  fileId @6 :UInt64;
}

# Facts about a process: sent when the sampler first sees it and whenever its mappings change.
struct ProcessInfo {
  pid @0 :UInt32;
  # Process start, wall clock (0 when unknown); with `pid` it identifies the process across reuse:
  # facts with another start time for a known pid replace the old process's.
  startTimeUnixNs @1 :UInt64;
  executablePath @2 :Text;
  executableName @3 :Text;
  # The text of /proc/<pid>/cgroup, unparsed (every hierarchy's line: v1 hosts have several),
  # at most 4 KiB, cut after a whole line. A sampler before this change sent only the v2 path
  # (the `0::` line's path); the relay reads both.
  cgroup @4 :Text;
  # Executable mappings only, sorted by start address.
  mappings @5 :List(Mapping);
  # Executable mappings the sampler left out because of its per-process cap.
  mappingsOmitted @6 :UInt32;
  # Added in v3 at the end (older peers read and write the defaults, so the version stays 3):
  # The real uid (the `Uid:` line of /proc/<pid>/status); 4294967295 = unknown.
  uid @7 :UInt32 = 4294967295;
  # The only two variables of /proc/<pid>/environ the sampler forwards (its allowlist); empty =
  # not set. Each at most 4 KiB; nothing else of a process's environment is ever sent.
  otelServiceName @8 :Text;
  otelResourceAttributes @9 :Text;
  # /proc/<pid>/cmdline as read (arguments NUL-terminated), at most 4 KiB; only when the sampler
  # runs with --command-line (it can hold secrets): empty = not forwarded.
  commandLine @10 :Data;
  # The process's perf map (`/tmp/perf-<N>.map` as the process sees it, N its pid in its own pid
  # namespace), opened by the sampler without following any link and passed only when it is a
  # regular file owned by the process's real uid: the index of its fd in this datagram, or -1.
  # Sent with every `process` message of the process (the relay keeps the newest).
  perfMapFd @11 :Int32 = -1;
  # Why a perf map that exists was not passed (another owner, not a regular file, a symlink,
  # too large); empty when passed or when there is none.
  perfMapRefused @12 :Text;
}

# More executable mappings of the process whose `process` message came just before: its facts
# did not fit one datagram. Appended to that process (same pid and start time), else ignored.
struct ProcessMappings {
  pid @0 :UInt32;
  startTimeUnixNs @1 :UInt64;
  mappings @2 :List(Mapping);
}

# Processes that exited, all that the sampler forgot at once: one datagram (and one wake-up of the
# relay) for every exit of an interval, not one each. An older relay reads `pid` alone.
struct ProcessExit {
  pid @0 :UInt32;
  # The other processes that exited, after `pid`.
  morePids @1 :List(UInt32);
}

# Files the sampler closed: no process it describes maps them any more (the process exited or its
# new facts no longer map them). Sent after the `exited` or `process` that made them unreferenced;
# the relay closes exactly these. File ids are never reused on a connection.
struct FilesClosed {
  fileIds @0 :List(UInt64);
}

# A stack: raw instruction addresses, leaf first.
struct Stack {
  frames @0 :List(UInt64);
}

struct Row {
  pid @0 :UInt32;
  tid @1 :UInt32;
  comm @2 :Text;
  # Index into `Batch.userStacks`, or -1 when there is none (see `userStackErrno`).
  userStack @3 :Int32;
  # When `userStack` is -1: the errno of the stack walk (14 = no user stack, e.g. kernel thread).
  userStackErrno @4 :Int32;
  kernelStack @5 :Int32;
  kernelStackErrno @6 :Int32;
  count @7 :UInt64;
  # Index + 1 into `Batch.interpStacks` of the interpreter frames walked for these samples; 0: none.
  interpStack @8 :UInt32;
  # Nanoseconds this thread spent off the CPU (blocked) with these stacks: the sum of the kept
  # waits' weights (`--off-cpu`: an unbiased estimate of the total). An off-CPU row has count 0.
  offCpuNs @9 :UInt64;
}

# One interpreter frame as the kernel read it (docs/design/interpreters.md): the code object's
# address, the raw 8 bytes of the instruction field and the marker byte. The relay decodes them.
struct InterpFrame {
  code @0 :UInt64;
  instruction @1 :UInt64;
  marker @2 :UInt8;
}

# The interpreter frames of some samples, leaf first (at most 64), and how the walk ended
# (0 = at a null frame, 1 = cut at 64 frames, 2 = a read failed).
struct InterpStack {
  frames @0 :List(InterpFrame);
  end @1 :UInt8;
}

# A code object of process `pid` as the kernel copied it: raw bytes from the start of its name,
# file name and line table objects (at most 192, 320 and 256 bytes; empty when the read failed).
struct InterpCode {
  pid @0 :UInt32;
  code @1 :UInt64;
  firstLine @2 :Int32;
  name @3 :Data;
  filename @4 :Data;
  linetable @5 :Data;
}

# What the kernel side and the sampler could not keep, totals since the sampler started.
struct Losses {
  samples @0 :UInt64;           # every sample the program saw (not a loss; the denominator)
  idle @1 :UInt64;              # idle-task samples, not recorded by design
  filtered @2 :UInt64;          # other processes' samples while a target pid is set
  userStackLost @3 :UInt64;     # stack-map collisions or full map: the sample kept, its user stack lost
  kernelStackLost @4 :UInt64;
  countsFull @5 :UInt64;        # samples dropped: the counts map was full
  backlogDroppedBatches @6 :UInt64;  # batches dropped from the sampler's backlog while no relay was there
  backlogDroppedSamples @7 :UInt64;
  procErrors @8 :UInt64;        # processes whose facts could not be read (often: exited first)
  factsDropped @9 :UInt64;      # per-connection state datagrams the socket refused (EMSGSIZE, ENOBUFS): dropped, never retried
  factsTruncated @10 :UInt64;   # processes whose facts were cut to the sampler's caps
  filesUnopened @11 :UInt64;    # mapped files not opened because of the sampler's open-file caps
  unwindTablesLoaded @12 :UInt64;   # unwind tables the sampler checked and accepted
  unwindTablesRefused @13 :UInt64;  # unwind tables (or chunks) refused: malformed, unknown file, over budget
  unwindStopped @14 :UInt64;    # DWARF-walked user stacks cut at a row the unwinder cannot follow
  unwindCut @15 :UInt64;        # DWARF-walked user stacks cut at the 64-frame cap
  unwindMapFull @16 :UInt64;    # samples whose walked stack found the stack map full (frame-pointer stack kept)
  unwindOutermost @17 :UInt64;  # stacks that ended at a stop row of code 1: the outermost frame (_start, thread start), the normal end
  unwindStopCfaRegister @18 :UInt64;  # stacks cut at a stop row of code 2: CFA from a register other than rsp/rbp
  unwindStopCfaExpression @19 :UInt64;  # code 3: CFA a DWARF expression other than PLT/signal
  unwindStopOffsetRange @20 :UInt64;  # code 4: an offset over the row's field
  unwindStopReturnAddressRule @21 :UInt64;  # code 5: return address not at CFA - 8
  unwindStopRbpRule @22 :UInt64;  # code 6: rbp restored by a rule without a row kind
  unwindStopMalformed @23 :UInt64;  # code 7: malformed CFI
  unwindStopBudget @24 :UInt64;  # code 8: FDE over the compiler's budget
  unwindReadFailed @25 :UInt64;  # stacks ended by a failed read of user memory
  unwindZeroEnd @26 :UInt64;  # stacks ended at rbp 0 or a return address 0 (end of a frame-pointer chain)
  unwindFpNoMapping @27 :UInt64;  # frames unwound by frame pointers: pc in no known file mapping
  unwindFpNoTable @28 :UInt64;  # frames unwound by frame pointers: their file has no table loaded (absent, refused, evicted)
  unwindFpGap @29 :UInt64;  # frames unwound by frame pointers: a gap row or outside the table
  unwindNoProcess @30 :UInt64;  # user-mode samples of processes whose mappings the unwinder does not know yet (frame-pointer stack kept)
  unwindTablesEvicted @31 :UInt64;  # loaded tables evicted (least recently sampled first) to make room under --unwind-memory-bytes
  interpWalked @32 :UInt64;     # interpreter walks that ended at a null frame (the whole stack)
  interpNoThread @33 :UInt64;   # samples of an interpreter process whose thread state was not found
  interpReadFailed @34 :UInt64; # interpreter walks ended by a failed read of the process's memory
  interpCut @35 :UInt64;        # interpreter walks cut at 64 frames
  interpStacksFull @36 :UInt64; # interpreter stacks lost: the kernel's stack map was full
  interpCodesFull @37 :UInt64;  # code objects not copied: the kernel's code map was full
  interpBadCode @38 :UInt64;    # frames whose code pointer was not a code object (left unnamed)
  interpRefused @39 :UInt64;    # interpreterProcess messages the sampler refused
  offCpuKept @40 :UInt64;      # off-CPU waits kept (each weighed into an off-CPU row; not a loss)
  offCpuSampledOut @41 :UInt64; # off-CPU waits under --off-cpu-min left out by the draw (by design: the kept ones are weighed; not a loss)
  offCpuCountsFull @42 :UInt64; # off-CPU waits dropped: the counts map was full
}

# The samples of one interval. A large interval is split into several parts with the same
# `sequence`; each part carries its own stacks table.
struct Batch {
  sequence @0 :UInt64;
  part @1 :UInt32;
  parts @2 :UInt32;
  intervalStartUnixNs @3 :UInt64;
  intervalEndUnixNs @4 :UInt64;
  frequencyHz @5 :UInt32;
  userStacks @6 :List(Stack);
  kernelStacks @7 :List(Stack);
  rows @8 :List(Row);
  losses @9 :Losses;
  # The process filter pushed down to the sampler (`RelayMessage.ignoreProcesses`): samples of
  # ignored processes the program counted and dropped, totals since the sampler started ...
  ignoredSamples @10 :UInt64;
  # ... entries the sampler refused (identity not verified, over its caps, malformed), since start
  ignoreRefused @11 :UInt64;
  # ... and how many processes it ignores now.
  ignoredProcesses @12 :UInt32;
  # Interpreter frames walked in the kernel (rows refer to them by `Row.interpStack`) and the
  # code objects they name, copied raw once per interval and process.
  interpStacks @13 :List(InterpStack);
  interpCodes @14 :List(InterpCode);
}

# Everything the relay may send to the sampler (the control channel: plain messages on the same
# socket, one per datagram, never with descriptors). The sampler trusts none of it: each table is
# checked whole before it is used, and anything it refuses is counted (`Losses.unwindTablesRefused`).
struct RelayMessage {
  union {
    welcome @0 :Welcome;
    # The relay is going away on purpose (end of a recording): flush and stop.
    goodbye @1 :Void;
    # One chunk of the unwind table of a file the sampler passed, compiled by the relay. Chunks of one table
    # come in order, 0 first; their `data` concatenated is the table's encoding (relay/src/unwind/
    # table.rs: a 16-byte header then 12-byte rows).
    unwindTableChunk @2 :UnwindTableChunk;
    # Forget the table of this file id (relay-side eviction).
    dropUnwindTable @3 :DropUnwindTable;
    # Processes the relay's process filter left out: the sampler checks each claimed identity
    # and stops sampling the ones it verified (filter push-down).
    ignoreProcesses @4 :IgnoreProcesses;
    # Walk this process's interpreter frames in the kernel (docs/design/interpreters.md).
    interpreterProcess @5 :InterpreterProcess;
  }
}

# Where a process's interpreter keeps its threads and frames. The sampler checks the process
# (described on this connection, alive with this start time, mapping `fileId`), that `root` and
# `codeType` lie in that file's image, and every offset, before the kernel uses any of it.
struct InterpreterProcess {
  pid @0 :UInt32;
  startTimeUnixNs @1 :UInt64;
  # The sampler's id of the interpreter file (the executable or libpython).
  fileId @2 :UInt64;
  # 1 = CPython.
  runtime @3 :UInt32;
  # Absolute address of the pointer to the first interpreter state.
  root @4 :UInt64;
  # Absolute address of the code objects' type (`PyCode_Type`).
  codeType @5 :UInt64;
  # The 17 offsets of docs/design/interpreters.md, in its order; 65535 = absent.
  layout @6 :List(UInt16);
  # Stop walking this process (the other fields but pid and start time are then ignored).
  forget @7 :Bool;
}

struct Welcome {
  protocolVersion @0 :UInt32;
}

struct UnwindTableChunk {
  fileId @0 :UInt64;
  # Index of this chunk, 0-based, and how many the table has.
  chunk @1 :UInt32;
  chunks @2 :UInt32;
  # At most 48 KiB per chunk (whole rows after chunk 0's header are not required).
  data @3 :Data;
  # `p_vaddr - p_offset` of the file's executable segment (the same in every chunk): a pc in a
  # mapping is at table address pc - mapping start + mapping file offset + this.
  vaddrMinusOffset @4 :Int64;
}

struct DropUnwindTable {
  fileId @0 :UInt64;
}

# The sampler ignores a process only when its pid is one it described on this connection, alive,
# with this start time (read again from /proc/<pid>/stat) and still the executable it described;
# it remembers the executable (path, device and inode of /proc/<pid>/exe) and samples the
# process again when it exits, its pid is reused or it execs. At most 1024 entries per message (the rest are refused unread) and 16384 ignored
# processes in all (more are refused); every refusal is counted in `Batch.ignoreRefused`. Every
# entry is dropped when the connection ends: a new relay may filter otherwise.
struct IgnoreProcesses {
  # Forget every process ignored so far before taking these (the relay's filter changed).
  forgetAll @0 :Bool;
  processes @1 :List(IgnoredProcess);
}

struct IgnoredProcess {
  pid @0 :UInt32;
  # The `ProcessInfo.startTimeUnixNs` the sampler sent for this pid.
  startTimeUnixNs @1 :UInt64;
}
