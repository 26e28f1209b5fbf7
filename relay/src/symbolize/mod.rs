//! Addresses -> frames. A miss is data, not an error: a frame that cannot be named becomes
//! `[unknown]` with its module, and a lost stack becomes a marker frame, so every sample stays.

pub mod alloc;
pub mod debug_links;
pub mod elf;
pub mod gofile;
pub mod gopclntab;
pub mod headers;
pub mod kernel;
pub mod sigbus;

#[cfg(test)]
mod go_tests;

use std::sync::Arc;

use ember_protocol::StackRef;

pub use self::{
    elf::{ElfCache, FileKey},
    kernel::KernelSymbols,
};
use crate::model::{Frame, FrameKind, Module, UNKNOWN};

/// The module every kernel frame belongs to.
pub fn kernel_module() -> Arc<Module> {
    Arc::new(Module {
        path: Arc::from("[kernel.kallsyms]"),
        build_id: None,
        start: 0,
        end: u64::MAX,
        file_offset: 0,
        file: None,
    })
}

/// Symbolizes kernel addresses (leaf first) with `symbols`, when there are any.
pub fn kernel_frames(
    addrs: &[u64],
    symbols: Option<&KernelSymbols>,
    module: &Arc<Module>,
) -> Vec<Frame> {
    addrs
        .iter()
        .map(|&address| Frame {
            function: symbols
                .and_then(|s| s.lookup(address))
                .cloned()
                .unwrap_or_else(|| Arc::from(UNKNOWN)),
            file: None,
            line: None,
            kind: FrameKind::Kernel,
            inlined: false,
            address,
            module: Some(Arc::clone(module)),
        })
        .collect()
}

/// A frame standing for a stack the kernel could not give, or `None` when the absence is
/// normal (EFAULT: no user stack in a kernel thread, no kernel stack in user mode).
pub fn missing_stack_marker(stack: StackRef, what: &str) -> Option<Frame> {
    let StackRef::Missing(errno) = stack else {
        return None;
    };
    let reason = match errno {
        14 => return None,
        17 => "stack-map collision",
        2 => "stack vanished before the drain",
        12 => "stack map full",
        _ => "error",
    };
    Some(Frame {
        function: Arc::from(format!("[lost {what} stack: {reason}]")),
        file: None,
        line: None,
        kind: FrameKind::Marker,
        inlined: false,
        address: 0,
        module: None,
    })
}
