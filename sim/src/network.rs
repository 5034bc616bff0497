//! The simulated clock and the queue of pending deliveries: every message between actors is an
//! [`Event`] due at a simulated millisecond; ties go in the order they were scheduled.
use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::world::Event;

struct Item {
    at: u64,
    seq: u64,
    ev: Event,
}

impl PartialEq for Item {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    // Reversed: the heap pops the earliest.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Default)]
pub struct Network {
    pub now: u64,
    seq: u64,
    queue: BinaryHeap<Item>,
}

impl Network {
    pub fn at(&mut self, at: u64, ev: Event) {
        self.seq += 1;
        self.queue.push(Item {
            at: at.max(self.now),
            seq: self.seq,
            ev,
        });
    }

    pub fn after(&mut self, delay: u64, ev: Event) {
        self.at(self.now + delay, ev);
    }

    /// When the next event is due.
    pub fn next_at(&self) -> Option<u64> {
        self.queue.peek().map(|i| i.at)
    }

    /// The next event, advancing the clock to it.
    pub fn pop(&mut self) -> Option<Event> {
        let item = self.queue.pop()?;
        self.now = item.at;
        Some(item.ev)
    }
}

/// In-order delivery on one connection direction: a message never overtakes the one before it.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fifo(u64);

impl Fifo {
    pub fn due(&mut self, now: u64, latency: u64) -> u64 {
        self.0 = self.0.max(now + latency);
        self.0
    }
}
