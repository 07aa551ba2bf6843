//! What several of the emulator's test files need alike.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Whether the tests run as root.
pub(crate) fn is_root() -> bool {
    // SAFETY: `geteuid` has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Makes `cmd` run as uid/gid 65534 (nobody) with no supplementary groups, when the tests run as
/// root; an ordinary user's run is left as it is (it is unprivileged already).
pub(crate) fn as_nobody(cmd: &mut Command) -> &mut Command {
    if is_root() {
        // SAFETY: runs in the forked child before exec and calls only `setgroups`, `setgid`
        // and `setuid`, async-signal-safe system calls; it allocates nothing.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(65534) != 0
                    || libc::setuid(65534) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd
}
