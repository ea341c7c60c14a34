//! Where the FUSE-over-io_uring entry threads run: layercache's policy behind vendor/fuser's
//! [`fuser::RingHooks`] (the transport itself is vendor/fuser/src/uring.rs).
//!
//! * **Pinned** to the entry's CPU queue: the kernel hands a request to an entry of the
//!   requester's CPU, so a thread pinned there serves it where the requester runs and a round
//!   trip costs two context switches on one CPU instead of two cross-CPU wake-ups (several times
//!   faster on the 2-vCPU VMs we run on). A queue whose CPU is outside
//!   the affinity the daemon inherited (`taskset`) is served from that affinity instead.
//! * **Spread** while serving a streamed read (a READ of at least [`STREAM_READ_MIN`] bytes):
//!   on the requester's CPU all its work (reading the backing file, the kernel's copy into the
//!   page cache, the reader's own copy) is serialized while the other CPUs idle; spread over
//!   the thread's original CPUs, readahead overlaps consumption. Pinned again at the next
//!   other request. One `sched_setaffinity` per change, none otherwise. The commit of a
//!   streamed read makes no SCHED_IDLE hand-off (below), which would keep the reader here.
//! * **SCHED_IDLE hand-off**: the commit of a reply is submitted while the thread is briefly
//!   `SCHED_IDLE`, so the wake-up of the requester sees this CPU as idle (the scheduler's
//!   `sched_idle_cpu` test) and keeps the requester here, where it preempts us at once,
//!   instead of migrating it to another, halted CPU (an IPI and a VM exit per request). Used
//!   only with `CAP_SYS_NICE`: per sched(7) a thread without it (root in a default Docker
//!   container) may enter SCHED_IDLE but not leave it. Every `sched_setscheduler` result is
//!   checked; a thread that cannot switch stops trying. A SCHED_IDLE thread runs only when
//!   nothing else wants its CPU, so when another task keeps that CPU busy the commit itself
//!   can wait for hundreds of ms (lookups stalled so during a `mv` of a lower tree that kept the
//!   daemon busy; `scripts/rename-latency.sh` measures it): no hand-off is tried while the
//!   machine has more runnable tasks than CPUs (the running count of /proc/loadavg, read at
//!   most every [`LOAD_PROBE`] per thread), and a commit that took longer than [`STARVED`]
//!   while that count says so turns the hand-off off for that thread for [`BACK_OFF`],
//!   doubled after each further starved commit (up to [`MAX_BACK_OFF`]) and reset by a quick
//!   one. A long commit on an otherwise idle machine is no starvation: the requester it woke
//!   preempts this thread, as intended, and runs until its next request.
//!
//! The effect of each is in the committed bench reports (benches/results/, e.g.
//! 2026-11-29-bench-quick-seqread-bc09e50.md for the streamed read).

use std::io;

use fuser::{RingHooks, RingThread};
use rustix::thread::CpuSet;

/// READs of at least this many bytes (512 KiB, a quarter of the mount's readahead window
/// [`super::READ_AHEAD_KB`]) are readahead of a file being streamed: the kernel grows a
/// sequential reader's window up to `read_ahead_kb`, and small files never get one this large.
pub const STREAM_READ_MIN: u32 = (super::READ_AHEAD_KB as u32) * 1024 / 4;

/// A commit submitted as SCHED_IDLE that took longer than this (2 ms) while other tasks wanted
/// the CPUs waited for a busy CPU. The submit returns once this thread runs again, so it also
/// includes the woken requester's run up to its next request: tens of µs for a reader going
/// file by file, which a 200 µs limit took for starvation (the hand-off was then off for 2 s,
/// then 4 s… up to 2 min: 2 hand-offs in a first read-all of ~26,000 requests at idle).
const STARVED: std::time::Duration = std::time::Duration::from_millis(2);
/// How long a thread whose commit was starved first commits without the hand-off (2 s).
const BACK_OFF: std::time::Duration = std::time::Duration::from_secs(2);
/// The longest pause of the hand-off after starved commits in a row (2 min).
const MAX_BACK_OFF: std::time::Duration = std::time::Duration::from_secs(120);

/// How often an entry thread reads the machine's runnable-task count (100 ms).
const LOAD_PROBE: std::time::Duration = std::time::Duration::from_millis(100);

/// Whether more tasks are runnable than there are CPUs (the 4th field of /proc/loadavg,
/// "running/total"; false when it cannot be read).
fn cpus_busy() -> bool {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(3)?
                .split('/')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .is_some_and(|running| running > cpus)
}

/// `FUSE_READ` (include/uapi/linux/fuse.h `enum fuse_opcode`).
const FUSE_READ: u32 = 15;
/// `CAP_SYS_NICE` (include/uapi/linux/capability.h).
const CAP_SYS_NICE: u32 = 23;

/// The policy given to fuser in `Config::ring_hooks`.
pub struct Policy {
    /// Whether the SCHED_IDLE hand-off may be used (the daemon has CAP_SYS_NICE).
    hand_off: bool,
}

impl Policy {
    /// The policy for this process: the hand-off only with CAP_SYS_NICE in the effective set.
    pub fn new() -> Policy {
        let hand_off = has_effective_cap(CAP_SYS_NICE);
        if !hand_off {
            tracing::debug!("no CAP_SYS_NICE: io_uring replies are committed without SCHED_IDLE");
        }
        Policy { hand_off }
    }
}

impl RingHooks for Policy {
    fn thread(&self, qid: u16) -> Box<dyn RingThread> {
        Box::new(EntryThread {
            placement: Placement::pin(qid),
            hand_off: self.hand_off,
            backed_off_until: None,
            back_off: BACK_OFF,
            probed: None,
            busy: false,
        })
    }
}

/// Whether capability `cap` is in this thread's effective set (`CapEff` of
/// /proc/thread-self/status; false when it cannot be read).
fn has_effective_cap(cap: u32) -> bool {
    std::fs::read_to_string("/proc/thread-self/status").is_ok_and(|s| cap_in_status(&s, cap))
}

/// Whether `cap` is in the `CapEff` line of a /proc status text.
fn cap_in_status(status: &str, cap: u32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|set| set & (1 << cap) != 0)
}

/// Sets the calling thread's scheduling policy (`SCHED_OTHER` keeps its nice value).
///
/// Errors: the `sched_setscheduler` errno (`EPERM`).
fn set_policy(policy: i32) -> io::Result<()> {
    crate::sys::sched_setscheduler_self(policy, 0)
}

/// The hooks of one entry thread.
struct EntryThread {
    placement: Placement,
    hand_off: bool,
    /// Set after a starved commit: no hand-off until then.
    backed_off_until: Option<std::time::Instant>,
    /// The pause after the next starved commit.
    back_off: std::time::Duration,
    /// When [`cpus_busy`] was last read, and what it said.
    probed: Option<std::time::Instant>,
    busy: bool,
}

impl EntryThread {
    /// Reads [`cpus_busy`] now (`now`), remembers it, returns it.
    fn probe(&mut self, now: std::time::Instant) -> bool {
        self.busy = cpus_busy();
        self.probed = Some(now);
        self.busy
    }
}

impl RingThread for EntryThread {
    fn request(&mut self, opcode: u32, read_size: Option<u32>) {
        let stream = opcode == FUSE_READ && read_size.is_some_and(|n| n >= STREAM_READ_MIN);
        self.placement.serve(stream);
    }

    fn commit(&mut self, submit: &mut dyn FnMut() -> io::Result<()>) -> io::Result<()> {
        // A streamed read's reader is better off on another CPU than this thread's (see
        // "Spread" in the module docs): no hand-off that would keep it here.
        if !self.hand_off || self.placement.spread {
            return Ok(());
        }
        if let Some(until) = self.backed_off_until {
            if std::time::Instant::now() < until {
                return Ok(());
            }
            self.backed_off_until = None;
        }
        let start = std::time::Instant::now();
        let busy = if self.probed.is_none_or(|t| start - t > LOAD_PROBE) {
            self.probe(start)
        } else {
            self.busy
        };
        if busy {
            return Ok(());
        }
        if let Err(e) = set_policy(libc::SCHED_IDLE) {
            tracing::debug!("SCHED_IDLE refused ({e}): hand-off off for this thread");
            self.hand_off = false;
            return Ok(());
        }
        let r = submit();
        // Back to normal priority before sleeping, so a wake-up for the next request is never
        // starved.
        if let Err(e) = set_policy(libc::SCHED_OTHER) {
            tracing::error!("cannot leave SCHED_IDLE ({e}): this io_uring thread stays idle-class");
            self.hand_off = false;
        }
        let took = start.elapsed();
        // A long commit is starvation only when other tasks want the CPUs: on an otherwise
        // idle machine it is the requester, woken here as intended, running until its next
        // request (a reader between two files, a compiler between two opens) before this
        // thread gets the CPU back.
        let starved = took > STARVED && self.probe(std::time::Instant::now());
        if starved {
            self.backed_off_until = Some(std::time::Instant::now() + self.back_off);
            let pause = self.back_off;
            tracing::debug!(?took, ?pause, "SCHED_IDLE commit waited for a busy CPU");
            self.back_off = (self.back_off * 2).min(MAX_BACK_OFF);
        } else {
            self.back_off = BACK_OFF;
        }
        r
    }
}

/// The calling thread's CPU affinity mask. On failure the empty set is returned and
/// set_affinity then fails harmlessly (EINVAL).
fn affinity() -> CpuSet {
    rustix::thread::sched_getaffinity(None).unwrap_or_else(|_| CpuSet::new())
}

/// Sets the calling thread's CPU affinity mask. Errors: `EINVAL` if no CPU of `set` is allowed
/// (a cpuset that excludes them).
fn set_affinity(set: &CpuSet) -> io::Result<()> {
    Ok(rustix::thread::sched_setaffinity(None, set)?)
}

/// The set holding only `cpu`.
fn only_cpu(cpu: usize) -> CpuSet {
    let mut set = CpuSet::new();
    set.set(cpu);
    set
}

/// Where an entry thread may run (see the module docs).
struct Placement {
    /// The affinity the thread started with (the daemon's; a cpuset or taskset may narrow it).
    home: CpuSet,
    /// Only the queue's CPU.
    own: CpuSet,
    /// Whether pinning worked at all (if not, the thread stays where it was allowed to run).
    pinned: bool,
    /// Whether the thread is currently spread over `home`.
    spread: bool,
}

impl Placement {
    /// Pins the calling thread to CPU `qid` when the thread may run there. A thread may widen
    /// its own affinity beyond what `taskset` gave the process (only a cpuset is a hard
    /// limit), so a queue whose CPU is outside the inherited mask is served from that mask
    /// instead: the daemon never runs where it was told not to.
    fn pin(qid: u16) -> Self {
        let home = affinity();
        let cpu = usize::from(qid);
        let allowed = cpu < CpuSet::MAX_CPU && home.is_set(cpu);
        let own = only_cpu(cpu.min(CpuSet::MAX_CPU - 1));
        let pinned = allowed
            && match set_affinity(&own) {
                Ok(()) => true,
                Err(e) => {
                    tracing::debug!("io_uring queue {qid}: not pinned: {e}");
                    false
                }
            };
        Placement {
            home,
            own,
            pinned,
            spread: false,
        }
    }

    /// Places the thread for the request it is about to serve: spread for a streamed read,
    /// pinned otherwise.
    fn serve(&mut self, stream: bool) {
        if self.pinned && stream != self.spread {
            let _ = set_affinity(if stream { &self.home } else { &self.own });
            self.spread = stream;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_are_read_from_the_status_text() {
        let docker_root = "Name:\tx\nCapEff:\t00000000a80425fb\n";
        assert!(!cap_in_status(docker_root, CAP_SYS_NICE));
        assert!(cap_in_status(docker_root, 0));
        let full = "CapEff:\t000001ffffffffff\n";
        assert!(cap_in_status(full, CAP_SYS_NICE));
        assert!(!cap_in_status("no such line", CAP_SYS_NICE));
        assert_eq!(STREAM_READ_MIN, 512 << 10);
    }
}
