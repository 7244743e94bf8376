//! The only unsafe code of the crate: four libc calls that std does not offer.
//!
//! Justification for `allow(unsafe_code)`: `geteuid(2)`, `kill(2)` and `sysconf(3)` are plain
//! calls without pointer arguments; they cannot violate memory safety
//! and are `unsafe` only because every FFI call is. `statvfs(3)` gets a valid
//! C string and a pointer to a properly sized, writable struct, which it
//! initialises when it succeeds.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

/// Clock ticks per second, the unit of CPU times in `/proc/<pid>/stat` (100 if unknown).
pub(crate) fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf takes an integer name, returns an integer and touches no memory.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as f64 } else { 100.0 }
}

/// Whether this process runs with effective uid 0 (root).
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid takes no arguments, always succeeds and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// Sends `signal` to the process `pid` (never to a group: `pid` must be > 0).
pub(crate) fn send_signal(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("invalid pid {pid}")))?;
    // SAFETY: kill has no memory-safety preconditions; pid > 0 addresses a single process.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Bytes available to unprivileged users on the file system holding `path`.
pub(crate) fn available_bytes(path: &Path) -> io::Result<u64> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    let mut stat = MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: c_path is NUL-terminated and outlives the call; stat is valid
    // for writes of one `statvfs`.
    if unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled in the struct.
    let stat = unsafe { stat.assume_init() };
    #[allow(clippy::useless_conversion)] // the field types differ between platforms
    Ok(u64::from(stat.f_bavail).saturating_mul(u64::from(stat.f_frsize)))
}
