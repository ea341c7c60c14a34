//! FUSE over io_uring (Linux 6.14+; Documentation/filesystems/fuse/fuse-io-uring.rst).
//!
//! After INIT granted `FUSE_OVER_IO_URING`, the kernel keeps one request queue per possible CPU
//! and hands a request issued on CPU `q` to an entry registered on queue `q`. Each entry is a
//! pair of user buffers given to the kernel with `FUSE_IO_URING_CMD_REGISTER` (an
//! `IORING_OP_URING_CMD` on the /dev/fuse fd, in a 128-byte SQE): a 288-byte header
//! (`struct fuse_uring_req_header`: `in_out` = `fuse_in_header`/`fuse_out_header`, `op_in` = the
//! opcode's fixed in-struct, `ring_ent_in_out` = commit id and payload size) and a payload
//! buffer of at least the connection's maximum payload. The command completes when a request
//! has been copied into the entry; the reply is written into the same buffers and handed back
//! with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also waits for the next request.
//!
//! Each entry here has its own thread and its own ring, pinned to the entry's CPU (except while
//! it serves a streamed read, see `Placement`): the thread that serves a request runs where the
//! requester runs, so a round trip costs two context
//! switches on one CPU instead of two cross-CPU wake-ups (on the 2-vCPU VMs we measured, a
//! GETATTR round trip went from ~25-50 us to ~4 us). The kernel uses the rings only once every
//! queue has an entry; until then, and always for FORGET and INTERRUPT, requests still arrive
//! through /dev/fuse.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use parking_lot::Condvar;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::ChannelSender;
use crate::ll::Operation;
use crate::reply::ReplyEmpty;
use crate::request::ReplyTo;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// `FUSE_URING_IN_OUT_HEADER_SZ`: bytes of `in_out` (holds `fuse_in_header`, 40 bytes, on a
/// request and `fuse_out_header`, 16 bytes, on a reply).
const IN_OUT_SZ: usize = 128;
/// `FUSE_URING_OP_IN_OUT_SZ`: bytes of `op_in` (the opcode's first in-argument).
const OP_IN_SZ: usize = 128;
/// `sizeof(struct fuse_uring_req_header)`: `in_out`, `op_in`, then the 32-byte
/// `struct fuse_uring_ent_in_out { u64 flags; u64 commit_id; u32 payload_sz; u32 pad; u64 rsvd }`.
const HEADER_SZ: usize = IN_OUT_SZ + OP_IN_SZ + 32;
const ENT_COMMIT_ID: usize = IN_OUT_SZ + OP_IN_SZ + 8;
const ENT_PAYLOAD_SZ: usize = IN_OUT_SZ + OP_IN_SZ + 16;
/// `sizeof(struct fuse_in_header)` and `sizeof(struct fuse_out_header)`.
const IN_HEADER_SZ: usize = 40;
const OUT_HEADER_SZ: usize = 16;
/// `enum fuse_uring_cmd`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `FUSE_URING_IOV_SEGS`: a REGISTER carries two iovecs (header, payload).
const IOV_SEGS: u32 = 2;

/// The reply slot of one ring entry. Replies may be sent from any thread (fuser's contract);
/// `send` (or `fill`, for READ data) writes the reply straight into the entry's buffers and the entry's thread waits in
/// `take` until it has, then commits.
#[derive(Debug)]
pub(crate) struct RingReply {
    /// Body length of the reply written for the current request (`Err` when it did not fit);
    /// `None` until the filesystem has replied.
    written: Mutex<Option<Result<usize, usize>>>,
    ready: Condvar,
    /// The entry's `in_out` header area (receives the 16-byte `fuse_out_header`).
    out_header: *mut u8,
    /// The entry's payload buffer and its size in bytes.
    payload: *mut u8,
    payload_sz: usize,
    /// For passthrough backing-file ioctls, which always go to /dev/fuse.
    ch: ChannelSender,
}

// SAFETY: the raw pointers refer to the entry's buffers, which outlive every RingReply clone
// handed to a request (serve_entry keeps them alive, or leaks them). They are written only by
// `send` or `fill`, once per request, while the request is outstanding: the kernel does not touch the
// buffers then and the entry's thread is in dispatch or blocked in `take`.
unsafe impl Send for RingReply {}
unsafe impl Sync for RingReply {}

impl RingReply {
    /// Writes a complete reply (`fuse_out_header` followed by its payload) into the entry.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let mut written = self.written.lock();
        let total: usize = data.iter().map(|d| d.len()).sum();
        let body = total.saturating_sub(OUT_HEADER_SZ);
        *written = Some(if total < OUT_HEADER_SZ || body > self.payload_sz {
            Err(total)
        } else {
            let mut at = 0usize;
            for part in data {
                let mut p: &[u8] = part;
                if at < OUT_HEADER_SZ {
                    let n = (OUT_HEADER_SZ - at).min(p.len());
                    // SAFETY: at + n <= OUT_HEADER_SZ <= IN_OUT_SZ (see the impl's SAFETY note).
                    unsafe {
                        std::ptr::copy_nonoverlapping(p.as_ptr(), self.out_header.add(at), n)
                    };
                    at += n;
                    p = &p[n..];
                }
                if !p.is_empty() {
                    // SAFETY: at >= OUT_HEADER_SZ here and at - OUT_HEADER_SZ + p.len() <= body
                    // <= payload_sz; our reply data never lives in the entry buffers.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            p.as_ptr(),
                            self.payload.add(at - OUT_HEADER_SZ),
                            p.len(),
                        )
                    };
                    at += p.len();
                }
            }
            Ok(body)
        });
        self.ready.notify_one();
        Ok(())
    }

    /// Bytes a reply body may have.
    pub(crate) fn capacity(&self) -> usize {
        self.payload_sz
    }

    /// Replies to request `unique` with data that `fill` writes straight into the entry's
    /// payload buffer (`max` bytes, at most `capacity()`), or with the errno it returns.
    pub(crate) fn fill(
        &self,
        unique: u64,
        max: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<usize, crate::Errno>,
    ) {
        let mut written = self.written.lock();
        let max = max.min(self.payload_sz);
        // SAFETY: see the impl's SAFETY note; max <= payload_sz.
        let buf = unsafe { std::slice::from_raw_parts_mut(self.payload, max) };
        let (body, error) = match fill(buf) {
            Ok(n) => (n.min(max), 0i32),
            Err(e) => (0, -e.code()),
        };
        // struct fuse_out_header { u32 len; i32 error; u64 unique; }
        let mut h = [0u8; OUT_HEADER_SZ];
        h[0..4].copy_from_slice(&((OUT_HEADER_SZ + body) as u32).to_ne_bytes());
        h[4..8].copy_from_slice(&error.to_ne_bytes());
        h[8..16].copy_from_slice(&unique.to_ne_bytes());
        // SAFETY: OUT_HEADER_SZ <= IN_OUT_SZ bytes of the entry's header area.
        unsafe { std::ptr::copy_nonoverlapping(h.as_ptr(), self.out_header, OUT_HEADER_SZ) };
        *written = Some(Ok(body));
        self.ready.notify_one();
    }

    pub(crate) fn channel(&self) -> &ChannelSender {
        &self.ch
    }

    /// Waits for the reply to the current request: its body length, or `Err(total length)`
    /// when it did not fit the entry.
    fn take(&self) -> Result<usize, usize> {
        let mut written = self.written.lock();
        loop {
            if let Some(r) = written.take() {
                return r;
            }
            self.ready.wait(&mut written);
        }
    }
}

#[repr(C, align(64))]
struct Header([u8; HEADER_SZ]);

/// Builds a `FUSE_IO_URING_CMD_*` SQE for queue `qid`; `iov` is set for REGISTER only.
fn uring_cmd(
    fd: i32,
    op: u32,
    qid: u16,
    commit_id: u64,
    iov: Option<&[libc::iovec; 2]>,
) -> squeue::Entry128 {
    // struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 padding[6]; } at the
    // start of the 80-byte command area; the rest stays zero.
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut b = opcode::UringCmd80::new(types::Fd(fd), op).cmd(cmd);
    if let Some(iov) = iov {
        b = b.addr(Some(iov.as_ptr() as u64));
    }
    let sqe = b.build();
    let Some(_) = iov else { return sqe };
    // The io-uring crate has no setter for `sqe->len`, which REGISTER uses for the iovec count.
    // SAFETY: Entry128 is #[repr(C)] over struct io_uring_sqe (64 bytes) + 64 command bytes;
    // `len` is the u32 at byte offset 24 of io_uring_sqe.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&IOV_SEGS.to_ne_bytes());
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// `IORING_ENTER_GETEVENTS` (include/uapi/linux/io_uring.h).
const IORING_ENTER_GETEVENTS: u32 = 1;

/// Sets the calling thread's scheduling policy (`SCHED_OTHER` keeps the thread's nice value).
/// Best effort: without CAP_SYS_NICE leaving SCHED_IDLE may fail, so it is never entered then.
fn set_policy(policy: i32) {
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `p` is a valid sched_param.
    unsafe { libc::sched_setscheduler(0, policy, &p) };
}

/// The calling thread's CPU affinity mask.
fn affinity() -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size. On failure
    // the zeroed set is returned and set_affinity then fails harmlessly (EINVAL).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set);
        set
    }
}

/// Sets the calling thread's CPU affinity mask. Errors: `EINVAL` if no CPU of `set` is allowed
/// (a cpuset that excludes them).
fn set_affinity(set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: sched_setaffinity only reads `set`.
    if unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The set holding only `cpu`.
fn only_cpu(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes one bit of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        set
    }
}

/// `FUSE_READ` (include/uapi/linux/fuse.h `enum fuse_opcode`).
const FUSE_READ: u32 = 15;

/// READs of at least this many bytes (512 KiB) are readahead of a file being streamed (the
/// kernel grows a sequential reader's readahead window up to the mount's `read_ahead_kb`, and
/// small files never get a window this large).
const STREAM_READ_MIN: u32 = 512 << 10;

/// Whether `req` (a request in /dev/fuse layout: `fuse_in_header`, then `fuse_read_in` with
/// `size` at bytes 16..20) is a READ of at least [`STREAM_READ_MIN`] bytes.
fn is_stream_read(req: &[u8]) -> bool {
    let u32_at = |i: usize| {
        req.get(i..i + 4)
            .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
    };
    u32_at(4) == Some(FUSE_READ)
        && u32_at(IN_HEADER_SZ + 16).is_some_and(|size| size >= STREAM_READ_MIN)
}

/// Where an entry thread may run: pinned to its queue's CPU, where the requester runs, so a
/// round trip costs two context switches on one CPU; spread over the thread's original CPUs
/// while it serves a streamed read (see [`Placement::serve`]).
struct Placement {
    /// The affinity the thread started with (the daemon's; a cpuset or taskset may narrow it).
    home: libc::cpu_set_t,
    /// Only the queue's CPU.
    own: libc::cpu_set_t,
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
        let own = only_cpu(usize::from(qid));
        // SAFETY: CPU_ISSET reads one bit of a plain-data set.
        let allowed = usize::from(qid) < libc::CPU_SETSIZE as usize
            && unsafe { libc::CPU_ISSET(usize::from(qid), &home) };
        let pinned = allowed
            && match set_affinity(&own) {
                Ok(()) => true,
                Err(e) => {
                    debug!("io_uring queue {qid}: not pinned: {e}");
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

    /// Places the thread for the request it is about to serve. A streamed read served on the
    /// requester's CPU serializes all its work (reading the backing file, the kernel's copy
    /// into the page cache, the reader's own copy) on that CPU while the others idle; spread,
    /// the scheduler runs this thread beside the reader and readahead overlaps consumption
    /// (first pass over a 512 MiB file on 2 vCPUs: ~310 ms pinned, ~210 ms spread). Any other
    /// request pins the thread back. One `sched_setaffinity` per change, none otherwise.
    fn serve(&mut self, stream: bool) {
        if self.pinned && stream != self.spread {
            let _ = set_affinity(if stream { &self.home } else { &self.own });
            self.spread = stream;
        }
    }
}

/// One entry's ring: 128-byte SQEs, single issuer, deferred task work (Linux 6.1+).
pub(crate) type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// What INIT set up for FUSE over io_uring: the entries' payload buffer size (bytes) and one
/// disabled ring per entry, queue-major (`possible_cpus() * per_queue`).
pub(crate) struct Setup {
    pub(crate) payload: usize,
    pub(crate) rings: Vec<Ring>,
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Setup {{ payload: {}, rings: {} }}",
            self.payload,
            self.rings.len()
        )
    }
}

/// Creates `n` rings for the entry threads, disabled (`IORING_SETUP_R_DISABLED`) so that the
/// thread that enables one becomes its single issuer. Done before INIT asks for
/// FUSE_OVER_IO_URING: io_uring may be disabled (`kernel.io_uring_disabled`), filtered by
/// seccomp (Docker's default profile) or short of fds or locked memory, and once the kernel
/// granted io_uring it holds every request until all queues have an entry.
pub(crate) fn new_rings(n: usize) -> io::Result<Vec<Ring>> {
    (0..n)
        .map(|_| {
            IoUring::builder()
                .setup_single_issuer()
                .setup_defer_taskrun()
                .setup_r_disabled()
                .build(2)
        })
        .collect()
}

/// Number of FUSE io_uring queues the kernel expects: one per possible CPU
/// (`num_possible_cpus()`, read from /sys/devices/system/cpu/possible, e.g. "0-1").
pub(crate) fn possible_cpus() -> usize {
    // An ascending list of CPUs and ranges: the last number is the highest CPU.
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| s.trim().rsplit([',', '-']).next()?.parse::<usize>().ok())
        .map(|last| last + 1)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Serves one ring entry of queue `qid` until the connection ends (`ENOTCONN`/`ENODEV` on the
/// command), with a payload buffer of `payload_sz` bytes (at least the kernel's
/// `max(FUSE_MIN_READ_BUFFER, max_write, max_pages * PAGE_SIZE)`).
///
/// `registered` receives, once, whether the entry was registered: `Ok` once REGISTER was
/// accepted, the error otherwise (the session must then end: the kernel waits for every queue).
pub(crate) fn serve_entry<FS: Filesystem>(
    se: &SessionEventLoop<FS>,
    ring: Ring,
    qid: u16,
    payload_sz: usize,
    registered: std::sync::mpsc::Sender<io::Result<()>>,
) -> io::Result<()> {
    // The buffers are shared with the kernel, so they are only ever reached through these raw
    // pointers (no Rust reference to them is held while the kernel may write them).
    let header = Box::into_raw(Box::new(Header([0; HEADER_SZ])));
    let payload = Box::into_raw(vec![0u8; payload_sz].into_boxed_slice());
    // SAFETY: both pointers come from Box::into_raw just above.
    let (hdr, pl) = unsafe { ((*header).0.as_mut_ptr(), (*payload).as_mut_ptr()) };
    let res = serve(se, ring, qid, hdr, pl, payload_sz, registered);
    if res.is_ok() {
        // The connection ended and released the entry: the buffers are ours again.
        // SAFETY: from Box::into_raw above, not freed elsewhere.
        unsafe { drop((Box::from_raw(header), Box::from_raw(payload))) };
    }
    // Otherwise the kernel may still hold the entry: the buffers are leaked, never reused.
    res
}

/// The loop of [`serve_entry`] over the entry buffers `hdr` (`HEADER_SZ` bytes) and `pl`
/// (`payload_sz` bytes).
fn serve<FS: Filesystem>(
    se: &SessionEventLoop<FS>,
    mut ring: Ring,
    qid: u16,
    hdr: *mut u8,
    pl: *mut u8,
    payload_sz: usize,
    registered: std::sync::mpsc::Sender<io::Result<()>>,
) -> io::Result<()> {
    let fd = se.ch.as_fd().as_raw_fd();
    let mut placement = Placement::pin(qid);
    if let Err(e) = ring.submitter().register_enable_rings() {
        let _ = registered.send(Err(io::Error::new(e.kind(), format!("io_uring: {e}"))));
        return Err(e);
    }
    let iov = [
        libc::iovec {
            iov_base: hdr.cast(),
            iov_len: HEADER_SZ,
        },
        libc::iovec {
            iov_base: pl.cast(),
            iov_len: payload_sz,
        },
    ];
    let slot = Arc::new(RingReply {
        written: Mutex::new(None),
        ready: Condvar::new(),
        out_header: hdr,
        payload: pl,
        payload_sz,
        ch: se.ch.sender(),
    });
    // Requests are reassembled here in /dev/fuse layout (header, op struct, payload), 8-byte
    // aligned as fuser's parser requires.
    // Sized once for the largest request (header, op struct, full payload); u64 elements keep
    // it 8-byte aligned.
    let mut request: Vec<u64> = vec![0; (IN_HEADER_SZ + OP_IN_SZ + payload_sz).div_ceil(8)];
    let mut next = uring_cmd(fd, CMD_REGISTER, qid, 0, Some(&iov));
    let mut committing = false;
    let mut registered = Some(registered);
    let mut pending: Option<cqueue::Entry> = None;
    // Only a privileged thread can come back from SCHED_IDLE (the daemon runs as root).
    let can_yield = nix::unistd::geteuid().is_root();
    loop {
        // SAFETY: the SQE points at `iov` and the entry buffers. `iov` lives until this function
        // returns, after the REGISTER was consumed; the buffers outlive the ring (serve_entry
        // leaks them if this returns early with the entry still registered).
        unsafe {
            ring.submission()
                .push(&next)
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        if committing && can_yield {
            // Hand the reply over as a SCHED_IDLE thread: the wake-up of the requester then
            // sees this CPU as idle (select_idle_sibling's sched_idle_cpu test) and keeps the
            // requester here, where it preempts us at once, instead of migrating it to the
            // other, halted CPU, which costs an IPI and a VM exit per request. Back to normal
            // priority before sleeping, so a wake-up for the next request is never starved.
            set_policy(libc::SCHED_IDLE);
            let r = ring.submit();
            set_policy(libc::SCHED_OTHER);
            // On EINTR the SQE stays queued and the wait below submits it.
            if let Err(e) = r
                && e.raw_os_error() != Some(libc::EINTR)
            {
                return Err(e);
            }
        }
        if let Some(registered) = registered.take() {
            // REGISTER is checked synchronously: it is submitted here, an error completes it at
            // once (after deferred task work runs, which GETEVENTS with min_complete 0 does),
            // success completes it only when a request arrives.
            // SAFETY: no arguments beyond the count and flags; the SQE was pushed above.
            let r = unsafe {
                ring.submitter()
                    .enter::<libc::sigset_t>(1, 0, IORING_ENTER_GETEVENTS, None)
            };
            let early = ring.completion().next();
            let failed = match (&r, &early) {
                (Err(e), _) => Some(io::Error::new(e.kind(), format!("io_uring REGISTER: {e}"))),
                (_, Some(c)) if c.result() < 0 => Some(io::Error::from_raw_os_error(-c.result())),
                _ => None,
            };
            if let Some(e) = failed {
                error!("io_uring queue {qid}: REGISTER failed: {e}");
                let _ = registered.send(Err(io::Error::new(e.kind(), e.to_string())));
                return Err(e);
            }
            let _ = registered.send(Ok(()));
            if let Some(cqe) = early {
                pending = Some(cqe);
            }
        }
        let cqe = if let Some(cqe) = pending.take() {
            cqe
        } else {
            loop {
                match ring.submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    Err(e) => return Err(e),
                }
                if let Some(cqe) = ring.completion().next() {
                    break cqe;
                }
            }
        };
        let res = cqe.result();
        if res < 0 {
            let err = io::Error::from_raw_os_error(-res);
            return match -res {
                // The connection was aborted or unmounted: the normal end of the session.
                libc::ENOTCONN | libc::ENODEV | libc::ECANCELED => Ok(()),
                _ => {
                    error!("io_uring queue {qid}: {err}");
                    Err(err)
                }
            };
        }
        // SAFETY: the kernel has delivered a request into the entry and does not write it
        // again before our commit; `hdr` spans HEADER_SZ bytes, `pl` payload_sz bytes.
        let (h, payload) = unsafe {
            (
                std::slice::from_raw_parts(hdr.cast_const(), HEADER_SZ),
                std::slice::from_raw_parts(pl.cast_const(), payload_sz),
            )
        };
        let len = u32::from_ne_bytes(h[0..4].try_into().unwrap()) as usize;
        let commit_id = u64::from_ne_bytes(h[ENT_COMMIT_ID..ENT_COMMIT_ID + 8].try_into().unwrap());
        let in_payload =
            u32::from_ne_bytes(h[ENT_PAYLOAD_SZ..ENT_PAYLOAD_SZ + 4].try_into().unwrap()) as usize;
        let op_sz = len
            .checked_sub(IN_HEADER_SZ + in_payload)
            .filter(|&n| n <= OP_IN_SZ && in_payload <= payload_sz);
        let Some(op_sz) = op_sz else {
            error!("io_uring queue {qid}: malformed request (len {len}, payload {in_payload})");
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "malformed io_uring request",
            ));
        };
        // SAFETY: len <= IN_HEADER_SZ + OP_IN_SZ + payload_sz bytes (checked above), which the
        // buffer holds.
        let buf = unsafe { std::slice::from_raw_parts_mut(request.as_mut_ptr().cast::<u8>(), len) };
        buf[..IN_HEADER_SZ].copy_from_slice(&h[..IN_HEADER_SZ]);
        buf[IN_HEADER_SZ..IN_HEADER_SZ + op_sz].copy_from_slice(&h[IN_OUT_SZ..IN_OUT_SZ + op_sz]);
        buf[IN_HEADER_SZ + op_sz..].copy_from_slice(&payload[..in_payload]);

        // Pinned, or spread while streaming a large file.
        placement.serve(is_stream_read(buf));

        match RequestWithSender::new(ReplyTo::Ring(slot.clone()), buf) {
            Some(req) => {
                if let Ok(Operation::Destroy(_)) = req.request.operation() {
                    req.reply::<ReplyEmpty>().ok();
                } else {
                    req.dispatch(se);
                }
            }
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "Invalid request",
                ));
            }
        }
        let body = match slot.take() {
            Ok(body) => body,
            Err(total) => {
                error!("io_uring queue {qid}: a reply of {total} bytes does not fit the entry");
                return Err(io::Error::other(
                    "reply larger than the io_uring payload buffer",
                ));
            }
        };
        // SAFETY: ENT_PAYLOAD_SZ + 4 <= HEADER_SZ; the entry is still ours until the commit.
        unsafe { std::ptr::write_unaligned(hdr.add(ENT_PAYLOAD_SZ).cast::<u32>(), body as u32) };
        next = uring_cmd(fd, CMD_COMMIT_AND_FETCH, qid, commit_id, None);
        committing = true;
    }
}
