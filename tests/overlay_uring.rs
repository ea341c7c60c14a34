//! FUSE over io_uring (vendor/fuser/src/uring.rs): requests are served by threads pinned to the
//! requester's CPU, and `LAYERCACHE_URING=0` keeps the /dev/fuse read loop. The overlay
//! semantics themselves are covered by the other overlay_* tests, which run over the rings.

#[macro_use]
mod common;

use std::fs;
use std::path::Path;

use common::*;

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";
const IO_URING_DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";

/// Tests of this file that count the daemon's io_uring threads must not overlap the one that
/// switches io_uring off for the whole machine.
static MACHINE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn machine() -> std::sync::MutexGuard<'static, ()> {
    MACHINE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sets `kernel.io_uring_disabled` and puts the old value back on drop (also on panic).
struct IoUringDisabled(String);

impl IoUringDisabled {
    fn set(v: &str) -> Option<IoUringDisabled> {
        let old = fs::read_to_string(IO_URING_DISABLED).ok()?;
        fs::write(IO_URING_DISABLED, v).ok()?;
        Some(IoUringDisabled(old.trim().to_string()))
    }
}

impl Drop for IoUringDisabled {
    fn drop(&mut self) {
        let _ = fs::write(IO_URING_DISABLED, &self.0);
    }
}

/// (tid, comm) of every thread of process `pid`.
fn threads(pid: i32) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let tid = e.file_name().to_string_lossy().into_owned();
        let comm = fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        out.push((tid, comm.trim().to_string()));
    }
    out
}

/// A field of /proc/PID/task/TID/status, e.g. "voluntary_ctxt_switches".
fn status_field(pid: i32, tid: &str, field: &str) -> String {
    let s = fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("{field} missing in status of {pid}/{tid}"))
        .trim()
        .to_string()
}

/// Ring threads are named `fuser-uring-Q.T`.
fn ring_thread(comm: &str) -> bool {
    comm.starts_with("fuser-uring-")
}

/// /dev/fuse reader threads are named `fuser-N`.
fn dev_thread(comm: &str) -> bool {
    comm.starts_with("fuser-") && !ring_thread(comm)
}

/// Context switches (voluntary: slept until a request came; involuntary: preempted by the
/// requester it just answered) of the threads of `pid` whose name `which` selects: a thread
/// that serves a request switches at least once. Each set is counted on its own, so a delta of
/// one set never mixes in the other's switches made between two reads.
fn wakeups(pid: i32, which: fn(&str) -> bool) -> u64 {
    let field = |tid: &str, f: &str| status_field(pid, tid, f).parse::<u64>().unwrap();
    threads(pid)
        .iter()
        .filter(|(_, comm)| which(comm))
        .map(|(tid, _)| {
            field(tid, "voluntary_ctxt_switches") + field(tid, "nonvoluntary_ctxt_switches")
        })
        .sum()
}

/// `n` statx calls with AT_STATX_FORCE_SYNC: each one is a GETATTR request to the daemon.
fn forced_getattrs(p: &Path, n: usize) {
    let c = cstr(p);
    for _ in 0..n {
        // SAFETY: statx writes into the zeroed buffer we own.
        let rc = unsafe {
            let mut sx: libc::statx = std::mem::zeroed();
            libc::statx(
                libc::AT_FDCWD,
                c.as_ptr(),
                libc::AT_STATX_FORCE_SYNC,
                libc::STATX_BASIC_STATS,
                &mut sx,
            )
        };
        assert_eq!(rc, 0, "statx {}: errno {}", p.display(), errno());
    }
}

fn possible_cpus() -> usize {
    let s = fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    s.trim()
        .split(',')
        .map(|r| r.rsplit('-').next().unwrap().parse::<usize>().unwrap() + 1)
        .max()
        .unwrap()
}

/// Whether the kernel has FUSE over io_uring; `false` means the test was skipped and should
/// return (under `CI`, `skip_or_fail` panics instead).
fn fuse_uring_available() -> bool {
    Path::new(ENABLE_URING).exists() || !skip_or_fail("kernel without FUSE over io_uring")
}

/// The prologue of a test of the io_uring transport: root, layercache, a kernel with FUSE over
/// io_uring (else the test returns, see [`fuse_uring_available`]), and the machine lock held
/// until the test ends (see [`MACHINE`]). `$why` says why only layercache is tested.
macro_rules! uring_test {
    ($why:expr) => {
        require_root!();
        only_layercache!($why);
        if !fuse_uring_available() {
            return;
        }
        let _machine = machine();
    };
}

fn daemon_of(fx: &Fixture) -> i32 {
    let pids = daemon_pids(&fx.mnt);
    assert_eq!(
        pids.len(),
        1,
        "one daemon serves {}: {pids:?}",
        fx.mnt.display()
    );
    pids[0]
}

#[test]
fn requests_are_served_by_per_cpu_io_uring_threads() {
    uring_test!("io_uring transport of layercache's daemon");
    let fx = Fixture::new(|l| write(&l.join("f"), "lower\n"));
    // The daemon, as root, allows FUSE io_uring when the module parameter was off.
    assert_eq!(fs::read_to_string(ENABLE_URING).unwrap().trim(), "Y");
    let pid = daemon_of(&fx);

    let ring: Vec<(String, String)> = threads(pid)
        .into_iter()
        .filter(|(_, c)| ring_thread(c))
        .collect();
    assert_eq!(
        ring.len(),
        4 * possible_cpus(),
        "four threads per CPU queue: {ring:?}"
    );
    for (tid, comm) in &ring {
        // "fuser-uring-Q.T" serves queue Q and runs on CPU Q only.
        let q = comm["fuser-uring-".len()..].split('.').next().unwrap();
        assert_eq!(
            status_field(pid, tid, "Cpus_allowed_list"),
            q,
            "{comm} pinned to CPU {q}"
        );
    }

    let (ring0, dev0) = (wakeups(pid, ring_thread), wakeups(pid, dev_thread));
    forced_getattrs(&fx.p("f"), 2000);
    let ring_woken = wakeups(pid, ring_thread) - ring0;
    let dev_woken = wakeups(pid, dev_thread) - dev0;
    assert!(
        ring_woken >= 1000,
        "2000 GETATTRs woke the ring threads only {ring_woken} times"
    );
    assert!(
        dev_woken < 100,
        "the /dev/fuse threads were woken {dev_woken} times"
    );
    assert_eq!(read(&fx.p("f")), "lower\n");
}

#[test]
fn large_writes_and_reads_round_trip() {
    require_root!();
    let fx = Fixture::new(|l| write(&l.join("big"), vec![7u8; 3 << 20]));
    // 3 MiB rewritten through WRITE requests as large as the mount allows (1 MiB on layercache,
    // whose io_uring entries have 1 MiB payload buffers) and read back through READs.
    let data: Vec<u8> = (0..(3u32 << 20))
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    fs::write(fx.p("big"), &data).unwrap();
    // Drop the mount's page cache for the file so the reads go to the daemon.
    let f = fs::File::open(fx.p("big")).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise only takes the fd and a range.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise(DONTNEED)");
    assert!(
        fs::read(fx.p("big")).unwrap() == data,
        "data read back differs"
    );
    assert!(
        fs::read(fx.upper.join("big")).unwrap() == data,
        "upper copy differs"
    );
}

#[test]
fn layercache_uring_0_keeps_the_dev_fuse_loop() {
    require_root!();
    only_layercache!("LAYERCACHE_URING is layercache's switch");
    let mut fx = Fixture::builder()
        .unmounted()
        .build(|l| write(&l[0].join("f"), "lower\n"));
    fx.mount_with(|c| {
        c.env("LAYERCACHE_URING", "0");
    });
    let pid = daemon_of(&fx);
    assert!(
        threads(pid).iter().all(|(_, c)| !ring_thread(c)),
        "no io_uring threads with LAYERCACHE_URING=0: {:?}",
        threads(pid)
    );
    let dev0 = wakeups(pid, dev_thread);
    forced_getattrs(&fx.p("f"), 500);
    assert!(
        wakeups(pid, dev_thread) - dev0 >= 250,
        "the /dev/fuse threads served the GETATTRs"
    );
    fs::write(fx.p("f"), "upper\n").unwrap();
    assert_eq!(read(&fx.p("f")), "upper\n");
    assert_eq!(read(&fx.lower().join("f")), "lower\n");
}

#[test]
fn without_io_uring_the_mount_serves_through_dev_fuse() {
    require_root!();
    only_layercache!("io_uring fallback of layercache's daemon");
    let _m = machine();
    // kernel.io_uring_disabled=2 makes io_uring_setup fail (as seccomp does in containers): the
    // daemon must not ask for FUSE over io_uring, or every request would wait for rings that
    // never come.
    let Some(_off) = IoUringDisabled::set("2") else {
        if skip_or_fail("kernel.io_uring_disabled cannot be set") {
            return;
        }
        unreachable!()
    };
    let fx = Fixture::new(|l| write(&l.join("f"), "lower\n"));
    let pid = daemon_of(&fx);
    assert!(threads(pid).iter().all(|(_, c)| !ring_thread(c)));
    let (tx, rx) = std::sync::mpsc::channel();
    let p = fx.p("f");
    std::thread::spawn(move || {
        fs::write(&p, "upper\n").unwrap();
        let _ = tx.send(read(&p));
    });
    let got = rx.recv_timeout(std::time::Duration::from_secs(20));
    assert_eq!(
        got.as_deref(),
        Ok("upper\n"),
        "the mount answered within 20 s"
    );
}

/// Runs `f` on a thread pinned to `cpu` (so its requests go to that CPU's ring queue).
fn on_cpu<T: Send + 'static>(cpu: usize, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: cpu_set_t is plain data; sched_setaffinity only reads it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            let rc = libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
            assert_eq!(rc, 0, "pin the test thread to CPU {cpu}: errno {}", errno());
        }
        f()
    })
    .join()
    .unwrap()
}

/// CPUs this process may run on (Cpus_allowed_list of /proc/self/status, e.g. "0-1").
fn allowed_cpus() -> Vec<usize> {
    let s = fs::read_to_string("/proc/self/status").unwrap();
    let list = s
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string();
    let mut cpus = Vec::new();
    for r in list.split(',') {
        let (a, b) = r.split_once('-').unwrap_or((r, r));
        cpus.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap());
    }
    cpus
}

/// A file streamed through the ring comes back intact, through a 2 MiB readahead window.
/// Where the ring threads run meanwhile (spread for the stream, pinned back by the next small
/// request) is a scheduling outcome a loaded machine may not show: scripts/ring-placement.sh
/// measures it.
#[test]
fn streamed_reads_through_the_ring_return_intact() {
    uring_test!("read-ahead of layercache's daemon");
    const SIZE: usize = 64 << 20;
    let data: Vec<u8> = (0..SIZE as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let lower_data = data.clone();
    let fx = Fixture::new(move |l| write(&l.join("big"), &lower_data));

    // The mount's own readahead window is 2 MiB (two 1 MiB READs per window), not the 128 KiB
    // every FUSE mount starts with.
    let st = fs::metadata(&fx.mnt).unwrap();
    use std::os::unix::fs::MetadataExt;
    let (major, minor) = (libc::major(st.dev()), libc::minor(st.dev()));
    let knob = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    assert_eq!(fs::read_to_string(&knob).unwrap().trim(), "2048", "{knob}");

    // Stream the file from one CPU in 1 MiB reads, then small requests from it; every byte
    // must come back.
    let cpu = allowed_cpus()[0];
    let p = fx.p("big");
    let got = on_cpu(cpu, move || {
        use std::io::Read;
        let mut f = fs::File::open(&p).unwrap();
        let mut out = Vec::with_capacity(SIZE);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        forced_getattrs(&p, 10);
        out
    });
    assert_eq!(got.len(), SIZE, "bytes read back");
    assert!(got == data, "streamed data differs from the lower file");
}

#[test]
fn a_daemon_confined_by_taskset_stays_on_its_cpus() {
    uring_test!("thread placement of layercache's daemon");
    let cpus = allowed_cpus();
    if cpus.len() < 2 && skip_or_fail("one CPU: nothing to confine the daemon away from") {
        return;
    }
    let (inside, outside) = (cpus[0], cpus[1]);
    let data: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 253) as u8).collect();
    let lower_data = data.clone();
    let mut fx = Fixture::builder()
        .unmounted()
        .build(move |l| write(&l[0].join("big"), &lower_data));
    // As `taskset -c INSIDE layercache overlay …`: the affinity the daemon inherits.
    fx.mount_with(|c| {
        use std::os::unix::process::CommandExt;
        // SAFETY: the hook only calls sched_setaffinity, which is async-signal-safe.
        unsafe {
            c.pre_exec(move || {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(inside, &mut set);
                if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    });
    let pid = daemon_of(&fx);
    // Requests issued on the other CPU (its ring queue) are served, streamed reads included...
    let p = fx.p("big");
    let got = on_cpu(outside, move || fs::read(p).unwrap());
    assert!(got == data, "data read from CPU {outside} differs");
    let f = fx.p("big");
    on_cpu(outside, move || forced_getattrs(&f, 10));
    // ...by threads that never left the CPU they were confined to.
    for (tid, comm) in threads(pid) {
        assert_eq!(
            status_field(pid, &tid, "Cpus_allowed_list"),
            inside.to_string(),
            "{comm} of a daemon started on CPU {inside} only"
        );
    }
}
