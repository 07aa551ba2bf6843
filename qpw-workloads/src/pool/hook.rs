//! The AppArmor hook that takes a buffer, as a send or a receive runs it.
//!
//! Every `read` and `write` on a file goes through `security_file_permission` ->
//! `apparmor_file_permission` -> `aa_file_perm`, which, to check the task's policy, needs the
//! file's path name: it takes a scratch buffer (`aa_get_buffer`), has `d_path` write the name
//! at the end of it, walks the policy's DFA over the name (`aa_dfa_match`), and gives the buffer
//! back (`aa_put_buffer`), all within the hook, on the CPU the task runs on. Seed 004's
//! hackbench spent its time in exactly that: `apparmor_file_permission` beside
//! `native_queued_spin_lock_slowpath` on `aa_buffers_lock`.
//!
//! [`file_permission`] is that hook: get a buffer, write the file's name at its end, read the
//! name back while hashing it (the DFA walk's stand-in: one pass over the bytes), put the
//! buffer back. The name is the file's own (`/proc/self/fd/<n>`, `pipe:[<inode>]` or
//! `socket:[<inode>]`), read once when the file is opened, with its hash; a hash that differs
//! when read back from the buffer means another thread wrote into the buffer meanwhile (it was
//! handed out twice), which the caller counts.

use std::os::fd::{AsRawFd, BorrowedFd};

use qpw_core::sync::thread;

use super::buffer_pool::BufferPool;
use super::error::PoolError;

/// A file's path name, as `d_path` would write it, and its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FileName {
    name: Vec<u8>,
    hash: u64,
}

/// FNV-1a over `bytes`: the one pass over the name that stands for the policy match.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl FileName {
    /// The name of the open file `fd` (the target of `/proc/self/fd/<fd>`), or, where that
    /// cannot be read, `fd:<n>`.
    pub(super) fn of(fd: BorrowedFd<'_>) -> Self {
        let raw = fd.as_raw_fd();
        let name = std::fs::read_link(format!("/proc/self/fd/{raw}"))
            .map(|target| target.into_os_string().into_encoded_bytes())
            .unwrap_or_else(|_| format!("fd:{raw}").into_bytes());
        let hash = fnv1a(&name);
        Self { name, hash }
    }

    /// A name given outright (`pipe:[4026532001]`, say), with its hash.
    pub(super) fn named(name: &str) -> Self {
        let name = name.as_bytes().to_vec();
        let hash = fnv1a(&name);
        Self { name, hash }
    }

    /// The name's bytes.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> &[u8] {
        &self.name
    }
}

/// `apparmor_file_permission` for `file`: get a buffer (waiting, as a bounded pool's caller
/// must, while every buffer is in use), write the name at its end, hash it back, put the
/// buffer back. Returns whether the name read back intact.
pub(super) fn file_permission(pool: &dyn BufferPool, file: &FileName) -> Result<bool, PoolError> {
    // aa_get_buffer.
    let mut buffer = loop {
        match pool.get()? {
            Some(buffer) => break buffer,
            // Every buffer is in use by a hook that is running: let it finish.
            None => thread::yield_now(),
        }
    };
    let mut intact = false;
    pool.with_bytes(&mut buffer, &mut |bytes| {
        // d_path builds the name backwards from the end of the buffer.
        let n = file.name.len().min(bytes.len());
        let at = bytes.len() - n;
        bytes[at..].copy_from_slice(&file.name[..n]);
        // The policy match walks the name in the buffer.
        intact = n == file.name.len() && fnv1a(&bytes[at..]) == file.hash;
    })?;
    // aa_put_buffer, on the same CPU: the thread is bound.
    pool.put(buffer)?;
    Ok(intact)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn a_file_is_named_by_its_proc_link() {
        let file = std::fs::File::open("/dev/null").unwrap();
        let name = FileName::of(file.as_fd());
        assert_eq!(name.bytes(), b"/dev/null");
        assert_eq!(name.hash, fnv1a(b"/dev/null"));
        assert_ne!(fnv1a(b"pipe:[1]"), fnv1a(b"pipe:[2]"));
    }
}
