//! Objects whose bytes have arrived and wait to be verified and written into `held/`, in the
//! order a reader needs them: first the objects a reader waits for, then the traced ones in
//! the order the recorded run opened them, then the rest in arrival order (the last of them
//! may be left for later: [`Queue::next`]).
//!
//! A unit's GET hands its objects here as their bytes come in and ends when its last byte is
//! in, not when its objects are written: on a filesystem where creating a file is slow (an
//! ext4 without a journal skips, on every inode it allocates, the inodes freed in the last
//! seconds to minutes: 0.2-0.3 ms a file after a tree was removed), writing the thousands of
//! small files of a trace replay took longer than fetching them, the units held their slots
//! meanwhile and the link idled while the run waited for files queued behind others it
//! needed later. At most [`WORKERS`] blocking threads drain the queue.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use parking_lot::Mutex;

/// Blocking threads writing queued objects at most (two: the cores of a small runner; more
/// only contend for the partial directory's lock).
pub(in crate::remote::lazy) const WORKERS: usize = 2;

/// The priority of an object a reader waits for (the lowest value: first).
pub(in crate::remote::lazy) const URGENT: u32 = 0;

/// An object's bytes, waiting to be verified and stored.
pub(in crate::remote::lazy) struct Item<C> {
    /// The object's bytes (not verified yet).
    pub bytes: Vec<u8>,
    /// What the fetch holds while the object is not stored (its fetch lock): dropped with
    /// the item.
    pub _hold: C,
}

/// The queue (see the module docs); `C` is what an item holds until it is stored.
pub(in crate::remote::lazy) struct Queue<C> {
    state: Mutex<State<C>>,
}

struct State<C> {
    items: HashMap<u32, Item<C>>,
    /// `(priority, arrival, object)`, lowest first; an object may have a stale entry (it was
    /// urged after it was queued): entries of objects no longer in `items` are skipped.
    order: BinaryHeap<Reverse<(u32, u64, u32)>>,
    arrivals: u64,
    /// Bytes of the items.
    bytes: u64,
    /// Workers draining the queue (at least one while it holds an item).
    workers: usize,
}

impl<C> State<C> {
    /// Counts a worker more and says so when fewer than [`WORKERS`] run.
    fn start_worker(&mut self) -> bool {
        if self.workers < WORKERS {
            self.workers += 1;
            return true;
        }
        false
    }
}

impl<C> Queue<C> {
    /// An empty queue.
    pub fn new() -> Queue<C> {
        Queue {
            state: Mutex::new(State {
                items: HashMap::new(),
                order: BinaryHeap::new(),
                arrivals: 0,
                bytes: 0,
                workers: 0,
            }),
        }
    }

    /// Queues object `o` with priority `priority` (lower first); an object already queued
    /// keeps its first item. Returns whether the caller must start a worker (it then
    /// counts as running: it calls [`Queue::next`] until that says stop).
    pub fn push(&self, o: u32, priority: u32, item: Item<C>) -> bool {
        let mut s = self.state.lock();
        if s.items.contains_key(&o) {
            return false;
        }
        s.bytes += item.bytes.len() as u64;
        s.items.insert(o, item);
        let n = s.arrivals;
        s.arrivals += 1;
        s.order.push(Reverse((priority, n, o)));
        s.start_worker()
    }

    /// Moves object `o`, if queued, ahead of every object not urged (a reader waits for it).
    /// Returns whether the caller must start a worker (as [`Queue::push`]).
    pub fn urge(&self, o: u32) -> bool {
        let mut s = self.state.lock();
        if !s.items.contains_key(&o) {
            return false;
        }
        let n = s.arrivals;
        s.arrivals += 1;
        s.order.push(Reverse((URGENT, n, o)));
        s.start_worker()
    }

    /// Whether the caller must start a worker for the objects queued (none runs while some
    /// wait: they were left for later, [`Queue::next`]).
    pub fn kick(&self) -> bool {
        let mut s = self.state.lock();
        !s.items.is_empty() && s.start_worker()
    }

    /// The next object for a worker to store, of priority `limit` or below, or `None` when
    /// there is none: the worker then stops (it no longer counts as running; objects of a
    /// priority above `limit` wait for the next worker).
    pub fn next(&self, limit: u32) -> Option<(u32, Item<C>)> {
        let mut s = self.state.lock();
        while let Some(&Reverse((priority, _, o))) = s.order.peek() {
            if !s.items.contains_key(&o) {
                s.order.pop();
                continue;
            }
            if priority > limit {
                break;
            }
            s.order.pop();
            let item = s.items.remove(&o).expect("checked");
            s.bytes -= item.bytes.len() as u64;
            return Some((o, item));
        }
        s.workers -= 1;
        None
    }

    /// Takes the most wanted queued object, whatever its priority, for a caller that is not a
    /// counted worker (the daemon's exit, [`Queue::next`]'s bookkeeping untouched); `None`
    /// when the queue is empty.
    pub fn take(&self) -> Option<(u32, Item<C>)> {
        let mut s = self.state.lock();
        while let Some(Reverse((_, _, o))) = s.order.pop() {
            if let Some(item) = s.items.remove(&o) {
                s.bytes -= item.bytes.len() as u64;
                return Some((o, item));
            }
        }
        None
    }

    /// Bytes queued.
    pub fn bytes(&self) -> u64 {
        self.state.lock().bytes
    }

    /// Whether an object is queued or being stored (a worker is running).
    pub fn busy(&self) -> bool {
        let s = self.state.lock();
        !s.items.is_empty() || s.workers > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(n: usize) -> Item<()> {
        Item {
            bytes: vec![0; n],
            _hold: (),
        }
    }

    #[test]
    fn objects_come_out_by_priority_then_arrival_and_urged_ones_first() {
        let q = Queue::new();
        assert!(
            q.push(7, u32::MAX, item(1)),
            "the first push starts a worker"
        );
        assert!(q.push(3, 5, item(2)), "a second worker");
        assert!(!q.push(4, 5, item(3)), "no third");
        assert!(!q.push(9, 1, item(4)));
        assert!(!q.push(9, 0, item(5)), "queued already: kept as it was");
        assert_eq!(q.bytes(), 10);
        assert!(!q.urge(4), "two workers run");
        assert!(!q.urge(42), "not queued: nothing");
        let order: Vec<u32> = std::iter::from_fn(|| q.next(u32::MAX).map(|(o, _)| o)).collect();
        assert_eq!(order, [4, 9, 3, 7]);
        assert_eq!(q.bytes(), 0);
        assert!(q.busy(), "one worker still counts as running");
        assert!(q.next(u32::MAX).is_none());
        assert!(!q.busy());
    }

    #[test]
    fn objects_above_the_limit_wait_for_a_kick_or_an_urge() {
        let q = Queue::new();
        assert!(q.push(1, u32::MAX, item(1)));
        assert!(q.push(2, u32::MAX, item(1)));
        assert!(q.next(u32::MAX - 1).is_none(), "both wait: a worker stops");
        assert!(q.next(u32::MAX - 1).is_none(), "and the other");
        assert!(q.busy(), "objects wait");
        assert!(q.urge(2), "an urged object starts a worker");
        assert_eq!(q.next(u32::MAX - 1).map(|(o, _)| o), Some(2));
        assert!(q.next(u32::MAX - 1).is_none());
        assert!(q.kick(), "a kick starts one for the rest");
        assert_eq!(q.next(u32::MAX).map(|(o, _)| o), Some(1));
        assert!(q.next(u32::MAX).is_none());
        assert!(!q.kick(), "nothing queued");
        assert!(!q.busy());
    }

    #[test]
    fn take_empties_the_queue_most_wanted_first_and_leaves_the_workers_count() {
        let q = Queue::new();
        assert!(q.push(7, 5, item(3)));
        assert!(q.push(8, URGENT, item(4)));
        assert_eq!(q.take().map(|(o, _)| o), Some(8));
        assert_eq!(q.take().map(|(o, _)| o), Some(7));
        assert!(q.take().is_none());
        assert_eq!(q.bytes(), 0);
        // The workers the pushes started are still counted until their next() says stop.
        assert!(q.busy());
        for _ in 0..WORKERS {
            assert!(q.next(u32::MAX).is_none());
        }
        assert!(!q.busy());
    }
}
