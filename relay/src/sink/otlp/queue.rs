//! The exporter's send queue: encoded requests waiting for delivery, bounded by bytes. Pushing
//! past the bound drops the oldest requests (returned to the caller to count); nothing else
//! removes a request but [`Queue::pop`]. Pure data structure: no I/O, no clock.

use std::collections::VecDeque;

use super::Encoded;

#[derive(Debug)]
pub struct Queue {
    items: VecDeque<Encoded>,
    bytes: usize,
    max_bytes: usize,
    high_water: usize,
}

impl Queue {
    /// A queue holding at most `max_bytes` of request bodies.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            items: VecDeque::new(),
            bytes: 0,
            max_bytes,
            high_water: 0,
        }
    }

    /// Appends `item`, first dropping the oldest items until it fits; returns what was dropped.
    /// An item larger than the whole bound is itself dropped (returned) and nothing else is.
    pub fn push(&mut self, item: Encoded) -> Vec<Encoded> {
        let len = item.body.len();
        if len > self.max_bytes {
            return vec![item];
        }
        let mut dropped = Vec::new();
        while self.bytes + len > self.max_bytes {
            let Some(old) = self.items.pop_front() else {
                break;
            };
            self.bytes -= old.body.len();
            dropped.push(old);
        }
        self.bytes += len;
        self.items.push_back(item);
        self.high_water = self.high_water.max(self.bytes);
        dropped
    }

    pub fn pop(&mut self) -> Option<Encoded> {
        let item = self.items.pop_front()?;
        self.bytes -= item.body.len();
        Some(item)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Bytes queued now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Most bytes ever queued at once.
    pub fn high_water(&self) -> usize {
        self.high_water
    }

    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(len: usize, samples: u64) -> Encoded {
        Encoded {
            body: vec![0u8; len].into(),
            samples,
        }
    }

    #[test]
    fn full_queue_drops_oldest_and_stays_bounded() {
        // Given a 100-byte queue holding 40 + 40 bytes.
        let mut q = Queue::new(100);
        assert!(q.push(item(40, 1)).is_empty());
        assert!(q.push(item(40, 2)).is_empty());
        // When 30 more bytes arrive, then the oldest (samples 1) is dropped.
        let dropped = q.push(item(30, 3));
        assert_eq!(
            dropped.iter().map(|d| d.samples).collect::<Vec<_>>(),
            vec![1]
        );
        assert_eq!(q.bytes(), 70);
        assert!(q.high_water() <= 100);
        // An item bigger than the bound is refused whole.
        let refused = q.push(item(101, 4));
        assert_eq!(refused.len(), 1);
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop().map(|i| i.samples), Some(2));
        assert_eq!(q.pop().map(|i| i.samples), Some(3));
        assert!(q.pop().is_none());
        assert_eq!(q.bytes(), 0);
    }
}
