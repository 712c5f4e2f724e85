//! The daemon connection: connecting with backoff, hello, length-prefixed frames in and out,
//! and disconnecting (which ends the connection's session).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpuprof_proto::agent as pb;
use gpuprof_proto::agent::agent_message::Msg as Out;
use prost::Message;

use super::identity::clock_pair;
use super::{Agent, Status};
use crate::log::log;
use crate::tracer::{Backend, Completed};

/// Largest daemon frame accepted (commands are small).
const MAX_IN_FRAME: usize = 1 << 20;
pub(super) const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

pub(super) struct Conn {
    pub(super) stream: UnixStream,
    pub(super) rbuf: Vec<u8>,
    pub(super) welcomed: bool,
    /// The daemon answers cubin queries (`Welcome.cubin_cache`).
    pub(super) cubin_cache: bool,
    pub(super) max_frame: usize,
    pub(super) heartbeat: Duration,
    pub(super) last_sent: Instant,
    pub(super) last_drops: pb::DropReport,
}

impl<B: Backend> Agent<B> {
    pub(super) fn connect(&mut self) {
        match UnixStream::connect(&self.cfg.socket) {
            Ok(stream) => {
                let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
                crate::socket_fd::publish(stream.as_raw_fd());
                log!(Info, "connected to {}", self.cfg.socket.display());
                self.conn = Some(Conn {
                    stream,
                    rbuf: Vec::new(),
                    welcomed: false,
                    cubin_cache: false,
                    max_frame: gpuprof_proto::frame::DEFAULT_MAX_FRAME_BYTES as usize,
                    heartbeat: Duration::from_secs(10),
                    last_sent: Instant::now(),
                    last_drops: pb::DropReport::default(),
                });
                self.control.connected.store(true, Ordering::SeqCst);
                self.conv.reset_connection();
                self.pc.new_connection();
                let hello = pb::Hello {
                    protocol_version: pb::PROTOCOL_VERSION,
                    kind: pb::AgentKind::Injector as i32,
                    pid: self.ident.pid,
                    exe: self.ident.exe.clone(),
                    cmdline: self.ident.cmdline.clone(),
                    cgroup: self.ident.cgroup.clone(),
                    cupti_version: self.backend.cupti_version(),
                    devices: self.ident.devices.clone(),
                    clock: Some(clock_pair()),
                    agent_version: env!("CARGO_PKG_VERSION").to_string(),
                    sampler_device: 0,
                    job: self.ident.job.clone(),
                };
                self.send(Out::Hello(hello));
            }
            Err(e) => {
                log!(Debug, "connect {}: {e}; retry in {:?}", self.cfg.socket.display(), self.backoff);
                self.next_connect = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(self.cfg.max_backoff);
            }
        }
    }

    pub(super) fn disconnect(&mut self, why: &str) {
        if self.conn.take().is_none() {
            return;
        }
        crate::socket_fd::publish(-1);
        log!(Info, "daemon connection closed: {why}");
        self.control.connected.store(false, Ordering::SeqCst);
        // The session belongs to the connection: stop tracing and drop what is queued.
        if self.status == Status::Tracing {
            self.backend.stop();
            let detail = self.backend.detach();
            log!(Info, "trace ended with the connection: {detail}");
        }
        self.status = Status::Idle;
        self.session = 0;
        self.conv.set_session(0);
        let dropped: Vec<Completed> = self.rx.try_iter().collect();
        for item in dropped {
            item.for_each(&mut |rec| {
                if let Some(k) = crate::records::peek_kind(rec) {
                    self.conv.count_drop(crate::convert::kind_of_activity(k), 1);
                }
            });
        }
        let _ = self.conv.take_messages();
        self.conv.reset_connection();
        self.pc.new_connection();
        self.next_connect = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(self.cfg.max_backoff);
    }

    pub(super) fn send(&mut self, msg: Out) -> bool {
        let Some(c) = &mut self.conn else { return false };
        let m = pb::AgentMessage { msg: Some(msg) };
        if m.encoded_len() > c.max_frame {
            log!(Warn, "dropping a {} byte frame over the daemon's limit", m.encoded_len());
            if let Some(pb::agent_message::Msg::Records(b)) = &m.msg {
                self.conv.count_batch_dropped(b);
            }
            return false;
        }
        let mut buf = Vec::with_capacity(m.encoded_len() + 4);
        gpuprof_proto::frame::encode_frame(&m, &mut buf);
        match c.stream.write_all(&buf) {
            Ok(()) => {
                c.last_sent = Instant::now();
                self.frames_sent += 1;
                true
            }
            Err(e) => {
                let why = format!("write: {e}");
                self.disconnect(&why);
                false
            }
        }
    }

    pub(super) fn read_socket(&mut self) {
        let Some(c) = &mut self.conn else { return };
        let mut tmp = [0u8; 16 << 10];
        match c.stream.read(&mut tmp) {
            Ok(0) => return self.disconnect("closed by daemon"),
            Ok(n) => c.rbuf.extend_from_slice(&tmp[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted || e.kind() == std::io::ErrorKind::WouldBlock => {
                return;
            }
            Err(e) => return self.disconnect(&format!("read: {e}")),
        }
        loop {
            let Some(c) = &mut self.conn else { return };
            if c.rbuf.len() < 4 {
                return;
            }
            let len = u32::from_le_bytes([c.rbuf[0], c.rbuf[1], c.rbuf[2], c.rbuf[3]]) as usize;
            if len > MAX_IN_FRAME {
                return self.disconnect(&format!("daemon frame of {len} bytes over {MAX_IN_FRAME}"));
            }
            if c.rbuf.len() < 4 + len {
                return;
            }
            let msg = pb::DaemonMessage::decode(&c.rbuf[4..4 + len]);
            c.rbuf.drain(..4 + len);
            match msg {
                Ok(m) => self.handle(m),
                Err(e) => return self.disconnect(&format!("malformed daemon message: {e}")),
            }
        }
    }
}
