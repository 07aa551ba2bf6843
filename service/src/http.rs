//! The metrics endpoint: a small blocking HTTP server on the housekeeping CPU.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{anyhow, Result};
use qpw_core::Qpw;

use crate::metrics::{lock, Metrics};

/// The HTTP endpoint: `GET /metrics` (any path) answers the registry in the Prometheus text
/// format.
pub(crate) fn serve_http(
    port: u16,
    metrics: Arc<Mutex<Metrics>>,
    stop: Arc<AtomicBool>,
    qpw: &Qpw,
    housekeeping: usize,
) -> Result<(SocketAddr, JoinHandle<()>)> {
    let server = tiny_http::Server::http(("127.0.0.1", port))
        .map_err(|e| anyhow!("cannot serve HTTP on 127.0.0.1:{port}: {e}"))?;
    let addr = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| anyhow!("the HTTP server has no IP address"))?;
    let qpw = qpw.clone();
    let handle = std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || {
            let _bound = qpw.bind_current(housekeeping);
            while !stop.load(Ordering::Acquire) {
                let Ok(Some(req)) = server.recv_timeout(Duration::from_millis(50)) else {
                    continue;
                };
                let body = lock(&metrics).text();
                let header = tiny_http::Header::from_bytes(
                    &b"Content-Type"[..],
                    &b"application/openmetrics-text; version=1.0.0; charset=utf-8"[..],
                );
                let mut resp = tiny_http::Response::from_string(body);
                if let Ok(h) = header {
                    resp.add_header(h);
                }
                let _ = req.respond(resp);
            }
        })?;
    Ok((addr, handle))
}
