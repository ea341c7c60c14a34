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
//! Each entry here has its own thread and its own ring. Where and how that thread runs is the
//! filesystem's choice, through [`RingHooks`] in `Config::ring_hooks` (a thread pinned to its
//! queue's CPU serves requests where the requester runs; layercache's policy is in its
//! `overlay/ring.rs`); without hooks the threads run wherever the scheduler puts them. Online
//! CPUs get `Config::io_uring` entries each, possible-but-offline CPUs one (the kernel needs
//! one on every queue, and an offline CPU issues no requests). The kernel uses the rings only
//! once every queue has an entry; until then, and always for FORGET and INTERRUPT, requests
//! still arrive through /dev/fuse.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::AtomicU8;
use std::sync::atomic::Ordering;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
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

/// `struct fuse_uring_ent_in_out` (include/uapi/linux/fuse.h).
#[repr(C)]
struct EntInOut {
    flags: u64,
    commit_id: u64,
    payload_sz: u32,
    padding: u32,
    reserved: u64,
}

/// `struct fuse_uring_req_header`: the header buffer of an entry.
#[repr(C)]
struct ReqHeader {
    in_out: [u8; IN_OUT_SZ],
    op_in: [u8; OP_IN_SZ],
    ring_ent_in_out: EntInOut,
}

/// `struct fuse_uring_cmd_req`: the start of a `FUSE_IO_URING_CMD_*` SQE's command area.
#[repr(C)]
struct CmdReq {
    flags: u64,
    commit_id: u64,
    qid: u16,
    padding: [u8; 6],
}

/// `sizeof(struct fuse_uring_req_header)`.
const HEADER_SZ: usize = size_of::<ReqHeader>();
const ENT_COMMIT_ID: usize =
    std::mem::offset_of!(ReqHeader, ring_ent_in_out) + std::mem::offset_of!(EntInOut, commit_id);
const ENT_PAYLOAD_SZ: usize =
    std::mem::offset_of!(ReqHeader, ring_ent_in_out) + std::mem::offset_of!(EntInOut, payload_sz);
/// `sizeof(struct fuse_in_header)` and `sizeof(struct fuse_out_header)`.
const IN_HEADER_SZ: usize = size_of::<crate::ll::fuse_abi::fuse_in_header>();
const OUT_HEADER_SZ: usize = size_of::<crate::ll::fuse_abi::fuse_out_header>();

// The kernel ABI these hand-written layouts follow (include/uapi/linux/fuse.h, Linux 6.14+).
const _: () = assert!(size_of::<EntInOut>() == 32);
const _: () = assert!(HEADER_SZ == 288);
const _: () = assert!(ENT_COMMIT_ID == 264 && ENT_PAYLOAD_SZ == 272);
const _: () = assert!(size_of::<CmdReq>() == 24);
const _: () = assert!(std::mem::offset_of!(CmdReq, commit_id) == 8);
const _: () = assert!(std::mem::offset_of!(CmdReq, qid) == 16);
const _: () = assert!(IN_HEADER_SZ == 40 && OUT_HEADER_SZ == 16);
const _: () = assert!(OUT_HEADER_SZ <= IN_OUT_SZ && IN_HEADER_SZ <= IN_OUT_SZ);
// An SQE128: `struct io_uring_sqe` (64 bytes, `len` at offset 24) and 64 command bytes.
const _: () = assert!(size_of::<squeue::Entry128>() == 128);
/// Offset of `len` in `struct io_uring_sqe`.
const SQE_LEN: usize = 24;
/// `enum fuse_uring_cmd`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `FUSE_URING_IOV_SEGS`: a REGISTER carries two iovecs (header, payload).
const IOV_SEGS: u32 = 2;

/// What a ring entry's reply slot holds: the request it serves and its reply so far.
#[derive(Debug, Default)]
struct Slot {
    /// `unique` of the request being served; 0 while the entry waits for one. A reply for
    /// another request (one that outlived a panicked dispatch answered with EIO) is refused,
    /// as /dev/fuse refuses a reply to an unknown request, instead of landing in the next
    /// request's buffers.
    unique: u64,
    /// Body length of the reply written for that request (`Err` when it did not fit);
    /// `None` until the filesystem has replied.
    reply: Option<Result<usize, usize>>,
}

/// The reply slot of one ring entry. Replies may be sent from any thread (fuser's contract);
/// `send` (or `fill`, for READ data) writes the reply straight into the entry's buffers and the entry's thread waits in
/// `take` until it has, then commits.
#[derive(Debug)]
pub(crate) struct RingReply {
    /// The request the entry serves and its reply so far.
    written: Mutex<Slot>,
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
        // struct fuse_out_header { u32 len; i32 error; u64 unique; }: the first slice holds it.
        let unique = data
            .first()
            .and_then(|h| h.get(8..16))
            .map_or(0, |u| u64::from_ne_bytes(u.try_into().unwrap()));
        if !written.answers(unique) {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        let total: usize = data.iter().map(|d| d.len()).sum();
        let body = total.saturating_sub(OUT_HEADER_SZ);
        written.reply = Some(if total < OUT_HEADER_SZ || body > self.payload_sz {
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
        if !written.answers(unique) {
            return;
        }
        let max = max.min(self.payload_sz);
        // SAFETY: see the impl's SAFETY note; max <= payload_sz.
        let buf = unsafe { std::slice::from_raw_parts_mut(self.payload, max) };
        // A panic in `fill` must still answer the request (the entry would wait for its reply
        // forever): EIO goes out, then the panic goes on.
        let filled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fill(buf)));
        let (body, error) = match &filled {
            Ok(Ok(n)) => ((*n).min(max), 0i32),
            Ok(Err(e)) => (0, -e.code()),
            Err(_) => (0, -libc::EIO),
        };
        self.write_header(unique, error, body);
        written.reply = Some(Ok(body));
        self.ready.notify_one();
        drop(written);
        if let Err(panic) = filled {
            std::panic::resume_unwind(panic);
        }
    }

    pub(crate) fn channel(&self) -> &ChannelSender {
        &self.ch
    }

    /// Waits for the reply to the current request: its body length, or `Err(total length)`
    /// when it did not fit the entry.
    fn take(&self) -> Result<usize, usize> {
        let mut written = self.written.lock();
        loop {
            if let Some(r) = written.reply.take() {
                written.unique = 0;
                return r;
            }
            self.ready.wait(&mut written);
        }
    }

    /// Makes `unique` the request this entry serves: replies for it are taken from now on.
    fn serve(&self, unique: u64) {
        *self.written.lock() = Slot {
            unique,
            reply: None,
        };
    }

    /// Answers request `unique` with `errno` if it is the one being served and has no reply
    /// yet (its dispatch panicked before a reply was written).
    pub(crate) fn answer_unanswered(&self, unique: u64, errno: i32) {
        let mut written = self.written.lock();
        if !written.answers(unique) {
            return;
        }
        self.write_header(unique, -errno, 0);
        written.reply = Some(Ok(0));
        self.ready.notify_one();
    }

    /// Writes the `fuse_out_header` of a reply with `body` bytes and `error` (0 or -errno).
    fn write_header(&self, unique: u64, error: i32, body: usize) {
        // struct fuse_out_header { u32 len; i32 error; u64 unique; }
        let mut h = [0u8; OUT_HEADER_SZ];
        h[0..4].copy_from_slice(&((OUT_HEADER_SZ + body) as u32).to_ne_bytes());
        h[4..8].copy_from_slice(&error.to_ne_bytes());
        h[8..16].copy_from_slice(&unique.to_ne_bytes());
        // SAFETY: OUT_HEADER_SZ <= IN_OUT_SZ bytes of the entry's header area.
        unsafe { std::ptr::copy_nonoverlapping(h.as_ptr(), self.out_header, OUT_HEADER_SZ) };
    }
}

impl Slot {
    /// Whether a reply to `unique` goes into the entry now: it is the request being served
    /// and nothing answered it yet.
    fn answers(&self, unique: u64) -> bool {
        self.unique == unique && unique != 0 && self.reply.is_none()
    }
}

#[repr(C, align(64))]
struct Header([u8; HEADER_SZ]);

/// The scheduling policy of FUSE-over-io_uring entry threads (layercache addition, see
/// PATCHES.md): given in `Config::ring_hooks`, asked once per entry thread for that thread's
/// [`RingThread`].
pub trait RingHooks: Send + Sync + 'static {
    /// Called on the new thread of an entry of CPU queue `qid`, before it registers.
    fn thread(&self, qid: u16) -> Box<dyn RingThread>;
}

/// Per-thread hooks of one ring entry (see [`RingHooks`]); called on the entry's thread.
pub trait RingThread {
    /// Called before a request is served: its FUSE opcode (`enum fuse_opcode`) and, for a
    /// READ, the bytes asked for.
    fn request(&mut self, opcode: u32, read_size: Option<u32>) {
        let _ = (opcode, read_size);
    }

    /// Called when a reply has been queued for commit, before the thread waits for its next
    /// request. `submit` submits the commit at once (`io_uring_enter` without waiting); a hook
    /// that does not call it leaves the commit to be submitted with that wait (one syscall).
    ///
    /// Errors: those of `submit` (`EINTR` is not an error: the wait submits it again).
    fn commit(&mut self, submit: &mut dyn FnMut() -> io::Result<()>) -> io::Result<()> {
        let _ = submit;
        Ok(())
    }
}

/// The hooks of `Config::ring_hooks`: compared by identity.
#[derive(Clone)]
pub struct RingHooksRef(pub Arc<dyn RingHooks>);

impl std::fmt::Debug for RingHooksRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RingHooksRef(..)")
    }
}

impl PartialEq for RingHooksRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for RingHooksRef {}

/// Hooks that change nothing (no `Config::ring_hooks`).
struct NoHooks;

impl RingThread for NoHooks {}

/// Where the session is in starting its ring entries (shared with the entry threads).
pub(crate) struct Startup(AtomicU8);

impl Startup {
    const REGISTERING: u8 = 0;
    const RUNNING: u8 = 1;
    const ABORTED: u8 = 2;

    pub(crate) fn new() -> Arc<Startup> {
        Arc::new(Startup(AtomicU8::new(Self::REGISTERING)))
    }
    /// Every entry is registered: threads wait for requests without a timeout from now on.
    pub(crate) fn running(&self) {
        self.0.store(Self::RUNNING, Ordering::Release);
    }
    /// An entry could not be registered: the others end (within [`STARTUP_POLL`]).
    pub(crate) fn abort(&self) {
        self.0.store(Self::ABORTED, Ordering::Release);
    }
    fn state(&self) -> u8 {
        self.0.load(Ordering::Acquire)
    }
}

/// How often an entry thread looks at [`Startup`] while the session is starting (50 ms).
const STARTUP_POLL: types::Timespec = types::Timespec::new().nsec(50_000_000);

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
    let at = std::mem::offset_of!(CmdReq, commit_id);
    cmd[at..at + 8].copy_from_slice(&commit_id.to_ne_bytes());
    let at = std::mem::offset_of!(CmdReq, qid);
    cmd[at..at + 2].copy_from_slice(&qid.to_ne_bytes());
    let mut b = opcode::UringCmd80::new(types::Fd(fd), op).cmd(cmd);
    if let Some(iov) = iov {
        b = b.addr(Some(iov.as_ptr() as u64));
    }
    let sqe = b.build();
    let Some(_) = iov else { return sqe };
    // The io-uring crate has no setter for `sqe->len`, which REGISTER uses for the iovec count.
    // SAFETY: Entry128 is #[repr(C)] over struct io_uring_sqe (64 bytes) + 64 command bytes
    // (size checked above); `len` is the u32 at byte offset SQE_LEN of io_uring_sqe.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[SQE_LEN..SQE_LEN + 4].copy_from_slice(&IOV_SEGS.to_ne_bytes());
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// `IORING_ENTER_GETEVENTS` (include/uapi/linux/io_uring.h).
const IORING_ENTER_GETEVENTS: u32 = 1;

/// `FUSE_READ` (include/uapi/linux/fuse.h `enum fuse_opcode`).
const FUSE_READ: u32 = 15;

/// The opcode of `req` (a request in /dev/fuse layout: `fuse_in_header`, then for a READ
/// `fuse_read_in` with `size` at bytes 16..20) and, for a READ, its size.
fn opcode_and_read_size(req: &[u8]) -> (u32, Option<u32>) {
    let u32_at = |i: usize| {
        req.get(i..i + 4)
            .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
    };
    let op = u32_at(4).unwrap_or(0);
    let size = (op == FUSE_READ)
        .then(|| u32_at(IN_HEADER_SZ + 16))
        .flatten();
    (op, size)
}

/// One entry's ring: 128-byte SQEs, single issuer, deferred task work (Linux 6.1+).
pub(crate) type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// What INIT set up for FUSE over io_uring: the entries' payload buffer size (bytes), one
/// disabled ring per entry and the CPU queue of each (see [`queues`]).
pub(crate) struct Setup {
    pub(crate) payload: usize,
    pub(crate) rings: Vec<Ring>,
    pub(crate) queues: Vec<u16>,
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

/// The CPUs of a sysfs CPU list such as "0-3,6" (`None` if it cannot be parsed).
fn cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        out.extend(a.parse::<usize>().ok()?..=b.parse::<usize>().ok()?);
    }
    Some(out)
}

/// The CPU queue of each ring entry to start: the kernel keeps one queue per possible CPU
/// (`num_possible_cpus()`, /sys/devices/system/cpu/possible) and serves requests only once
/// every queue has an entry, so each possible CPU gets one, and each online CPU
/// (/sys/devices/system/cpu/online) `per_queue`. Queue-major order.
pub(crate) fn queues(per_queue: usize) -> Vec<u16> {
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/devices/system/cpu/{f}"))
            .ok()
            .and_then(|s| cpu_list(&s))
    };
    let possible = read("possible").and_then(|v| v.last().map(|&l| l + 1));
    let possible =
        possible.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let online = read("online");
    (0..possible)
        .flat_map(|cpu| {
            let on = online.as_ref().is_none_or(|o| o.contains(&cpu));
            let n = if on { per_queue.max(1) } else { 1 };
            std::iter::repeat_n(cpu as u16, n)
        })
        .collect()
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
    startup: Arc<Startup>,
    hooks: Option<RingHooksRef>,
) -> io::Result<()> {
    // The buffers are shared with the kernel, so they are only ever reached through these raw
    // pointers (no Rust reference to them is held while the kernel may write them).
    let header = Box::into_raw(Box::new(Header([0; HEADER_SZ])));
    let payload = Box::into_raw(vec![0u8; payload_sz].into_boxed_slice());
    // SAFETY: both pointers come from Box::into_raw just above.
    let (hdr, pl) = unsafe { ((*header).0.as_mut_ptr(), (*payload).as_mut_ptr()) };
    let mut hooks: Box<dyn RingThread> = match hooks {
        Some(h) => h.0.thread(qid),
        None => Box::new(NoHooks),
    };
    let entry = Entry {
        qid,
        hdr,
        pl,
        payload_sz,
    };
    let res = serve(se, ring, &entry, registered, &startup, hooks.as_mut());
    if res.is_ok() {
        // The connection ended and released the entry: the buffers are ours again.
        // SAFETY: from Box::into_raw above, not freed elsewhere.
        unsafe { drop((Box::from_raw(header), Box::from_raw(payload))) };
    }
    // Otherwise the kernel may still hold the entry: the buffers are leaked, never reused.
    res
}

/// One ring entry: its CPU queue and its buffers, `hdr` (`HEADER_SZ` bytes) and `pl`
/// (`payload_sz` bytes).
struct Entry {
    qid: u16,
    hdr: *mut u8,
    pl: *mut u8,
    payload_sz: usize,
}

/// Waits for one completion on `ring`, submitting what is queued. While the session is
/// starting it wakes every [`STARTUP_POLL`] to see whether the start was aborted (then
/// `Ok(None)`: the thread ends).
fn wait_one(ring: &mut Ring, startup: &Startup) -> io::Result<Option<cqueue::Entry>> {
    loop {
        let starting = startup.state() != Startup::RUNNING;
        let r = if starting {
            let args = types::SubmitArgs::new().timespec(&STARTUP_POLL);
            ring.submitter().submit_with_args(1, &args)
        } else {
            ring.submit_and_wait(1)
        };
        match r {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) if starting && e.raw_os_error() == Some(libc::ETIME) => {}
            Err(e) => return Err(e),
        }
        if let Some(cqe) = ring.completion().next() {
            return Ok(Some(cqe));
        }
        if startup.state() == Startup::ABORTED {
            return Ok(None);
        }
    }
}

/// The loop of [`serve_entry`].
fn serve<FS: Filesystem>(
    se: &SessionEventLoop<FS>,
    mut ring: Ring,
    entry: &Entry,
    registered: std::sync::mpsc::Sender<io::Result<()>>,
    startup: &Startup,
    hooks: &mut dyn RingThread,
) -> io::Result<()> {
    let Entry {
        qid,
        hdr,
        pl,
        payload_sz,
    } = *entry;
    let fd = se.ch.as_fd().as_raw_fd();
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
        written: Mutex::new(Slot::default()),
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
    loop {
        // SAFETY: the SQE points at `iov` and the entry buffers. `iov` lives until this function
        // returns, after the REGISTER was consumed; the buffers outlive the ring (serve_entry
        // leaks them if this returns early with the entry still registered).
        unsafe {
            ring.submission()
                .push(&next)
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        if committing {
            // On EINTR the SQE stays queued and the wait below submits it.
            let mut submit = || match ring.submit() {
                Err(e) if e.raw_os_error() != Some(libc::EINTR) => Err(e),
                _ => Ok(()),
            };
            hooks.commit(&mut submit)?;
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
        let cqe = match pending.take() {
            Some(cqe) => cqe,
            None => match wait_one(&mut ring, startup)? {
                Some(cqe) => cqe,
                // The session's start was aborted: the ring is dropped on return, which
                // cancels the registered command; the buffers are leaked (Err).
                None => return Err(io::Error::other("io_uring start aborted")),
            },
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

        let (opcode, read_size) = opcode_and_read_size(buf);
        hooks.request(opcode, read_size);

        match RequestWithSender::new(ReplyTo::Ring(slot.clone()), buf) {
            Some(req) => {
                slot.serve(req.request.unique().0);
                if let Ok(Operation::Destroy(_)) = req.request.operation() {
                    req.reply::<ReplyEmpty>().ok();
                } else {
                    // A dispatch that panics answers EIO (see `dispatch`): the entry keeps
                    // serving rather than wait for ever for a reply.
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
