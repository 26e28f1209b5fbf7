//! The labels stage's output, what the sinks take: each sample filed under its process's
//! resource labels. A [`LabeledThread`] is a symbolized [`Thread`] with the one shared
//! `Arc<Labels>` of its process; a [`LabeledProfile`] aggregates samples by it, so the rows of one
//! process (and of every process with the same labels) come together in the profile's order.
//!
//! The dependency points from here to the model: `model` knows nothing of labels.

use std::{ops::Deref, sync::Arc};

use super::{keys, Labels};
use crate::model::{Profile, SampleRef, Thread};

/// The shared labels of a process, as the profile carries them.
pub type Resource = Arc<Labels>;

/// A sampled thread and its process's resource labels (empty when no labels stage ran: sinks
/// then fall back to the thread's facts).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LabeledThread {
    pub thread: Thread,
    pub resource: Resource,
}

/// Hashes the thread only: a process's labels are one shared set, the same for every thread of a
/// pid, so hashing them per sample would cost without telling threads apart (equal threads still
/// hash equal; equality compares the labels, pointer first).
impl std::hash::Hash for LabeledThread {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.thread.hash(state);
    }
}

/// Sinks read a labelled thread's facts as they read a thread's (`sample.thread.pid`): the
/// labels are an addition to the thread, not a wrapper around it.
impl Deref for LabeledThread {
    type Target = Thread;

    fn deref(&self) -> &Thread {
        &self.thread
    }
}

/// A thread with no labels (what a profile built without the labels stage holds).
impl From<Thread> for LabeledThread {
    fn from(thread: Thread) -> Self {
        Self {
            thread,
            resource: Resource::default(),
        }
    }
}

impl LabeledThread {
    /// The resource's `service.name`, else the process name.
    pub fn service_name(&self) -> &str {
        self.resource
            .get(keys::SERVICE_NAME)
            .unwrap_or(&self.thread.process_name)
    }
}

/// Samples aggregated by labelled thread over an interval or a window: what sinks receive.
pub type LabeledProfile = Profile<LabeledThread>;

/// One row of a [`LabeledProfile`], borrowed from it: what sinks iterate.
pub type LabeledSample<'a> = SampleRef<'a, LabeledThread>;
