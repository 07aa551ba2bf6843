//! A request on the wire: sixteen bytes, a sequence number and the client's send time, that a
//! server echoes back as its reply; and the receive buffer that both ends' sockets ask for.

use std::net::UdpSocket;

/// A request: a sequence number and the client's send time
/// ([`now_ns`](crate::latency::now_ns)). The server echoes it.
pub(crate) const REQUEST_BYTES: usize = 16;

/// A request's (or its echo's) sequence number and send time, if `bytes` has the request's
/// length.
pub(crate) fn parse_request(bytes: &[u8]) -> Option<(u64, u64)> {
    let bytes: &[u8; REQUEST_BYTES] = bytes.try_into().ok()?;
    let (seq, sent_at) = bytes.split_at(8);
    Some((
        u64::from_le_bytes(seq.try_into().ok()?),
        u64::from_le_bytes(sent_at.try_into().ok()?),
    ))
}

/// Asks for a receive buffer of 4 MiB (the kernel caps it at `net.core.rmem_max`), so that a
/// socket whose reader is preempted for a while queues its datagrams rather than dropping them:
/// a late request shows in the round trips instead of vanishing. Best effort: a refusal leaves
/// the default.
pub(crate) fn grow_receive_buffer(sock: &UdpSocket) {
    use std::os::fd::AsRawFd as _;
    let bytes: libc::c_int = 4 << 20;
    // SAFETY: (1) the descriptor is the socket's, open for the duration of the call; (2) the
    // option value points to a `c_int` that lives across the call, and its size is given.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_request_sized_datagram_is_read_as_a_reply() {
        let mut req = [0u8; REQUEST_BYTES];
        req[..8].copy_from_slice(&7u64.to_le_bytes());
        req[8..].copy_from_slice(&1234u64.to_le_bytes());
        assert_eq!(parse_request(&req), Some((7, 1234)));
        assert_eq!(parse_request(&req[..REQUEST_BYTES - 1]), None);
        assert_eq!(parse_request(&[0u8; REQUEST_BYTES + 1]), None);
        assert_eq!(parse_request(&[]), None);
    }
}
