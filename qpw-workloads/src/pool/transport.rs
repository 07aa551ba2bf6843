//! What hackbench's messages travel through: pipes or socketpairs, as `perf bench sched
//! messaging` uses them (`--pipe`, or sockets by default).
//!
//! Each receiver has one channel; its senders each hold their own duplicate of the write end,
//! so that when a sender stops (done, or failed) its ends close with it, and a receiver whose
//! senders are all gone sees end-of-file instead of waiting forever.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use super::hackbench::Transport;
use super::hook::FileName;

/// One receiver's channel: the end it reads (its receiver takes it), the end its senders
/// write (each sender takes a duplicate), and both ends' names for the hook.
#[derive(Debug)]
pub(super) struct Channel {
    reader: Option<File>,
    pub(super) reader_name: FileName,
    writer: Option<File>,
    pub(super) writer_name: FileName,
}

impl Channel {
    /// A new pipe (`pipe2(O_CLOEXEC)`) or socketpair (`AF_UNIX`, `SOCK_STREAM`).
    pub(super) fn new(transport: Transport) -> io::Result<Self> {
        let (reader, writer): (OwnedFd, OwnedFd) = match transport {
            Transport::Pipe => {
                let mut fds = [0; 2];
                // SAFETY: `fds` is a valid, writable array of two ints, as `pipe2` requires.
                if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: `pipe2` succeeded, so both are open descriptors that nothing else
                // owns; each is wrapped exactly once.
                unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
            }
            Transport::Socketpair => {
                let (a, b) = UnixStream::pair()?;
                (a.into(), b.into())
            }
        };
        Ok(Self {
            reader_name: FileName::of(reader.as_fd()),
            writer_name: FileName::of(writer.as_fd()),
            reader: Some(reader.into()),
            writer: Some(writer.into()),
        })
    }

    /// A sender's own write end (`dup`), while the channel still has its own.
    pub(super) fn writer(&self) -> io::Result<File> {
        match &self.writer {
            Some(writer) => writer.try_clone(),
            None => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the channel's write end is closed",
            )),
        }
    }

    /// The read end, for the receiver to own: when the receiver stops (done, or failed) it
    /// closes, and a sender still writing gets `EPIPE` instead of blocking on a full pipe.
    pub(super) fn take_reader(&mut self) -> io::Result<File> {
        self.reader.take().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotConnected,
                "the channel's read end is taken",
            )
        })
    }

    /// Closes the channel's own write end, once every sender has its duplicate: from then on
    /// the reader sees end-of-file when the last sender is gone.
    pub(super) fn close_writer(&mut self) {
        self.writer = None;
    }
}
