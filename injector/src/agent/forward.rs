//! Queued CUPTI buffers → record batches → the socket, and the drop reports.

use gpuprof_proto::agent as pb;
use gpuprof_proto::agent::agent_message::Msg as Out;

use super::{Agent, Status};
use crate::tracer::Backend;

impl<B: Backend> Agent<B> {
    /// Decodes every queued buffer into the converter, sending full batches on the way.
    pub(super) fn drain_queue(&mut self) {
        while let Ok(item) = self.rx.try_recv() {
            if self.status != Status::Tracing && self.status != Status::Displaced {
                continue; // late buffers of a stopped trace with no connection: dropped
            }
            let conv = &mut self.conv;
            let mut full = false;
            item.for_each(&mut |rec| {
                conv.push_raw(rec, &|a| item.read_str(a));
                full |= conv.full();
            });
            drop(item);
            if full || self.conv.full() {
                self.send_records();
            }
        }
        if self.status == Status::Tracing || self.status == Status::Displaced {
            let conv = &mut self.conv;
            crate::nccl::global().drain(|c| conv.push_collective(c));
            if self.conv.full() {
                self.send_records();
            }
        }
    }

    pub(super) fn send_records(&mut self) {
        if self.conn.as_ref().is_none_or(|c| !c.welcomed) {
            return;
        }
        for m in self.conv.take_messages() {
            if let Some(msg) = m.msg
                && !self.send(msg)
            {
                return;
            }
        }
    }

    pub(super) fn send_drops(&mut self) {
        let (queue, cupti) = self.backend.external_drops();
        let mut report = self.conv.drop_report(cupti);
        let mut queue = queue.to_vec();
        if let Some(n) = queue.get_mut(pb::RecordKind::Collective as usize) {
            *n += crate::nccl::global().dropped();
        }
        for (i, &n) in queue.iter().enumerate() {
            if n == 0 {
                continue;
            }
            if let Some(c) = report.counts.iter_mut().find(|c| c.kind == i as i32) {
                c.dropped += n;
            } else {
                report.counts.push(pb::DropCount { kind: i as i32, dropped: n });
            }
        }
        let Some(c) = &self.conn else { return };
        if !c.welcomed || report == c.last_drops {
            return;
        }
        let sent = report.clone();
        if self.send(Out::Drops(report))
            && let Some(c) = &mut self.conn
        {
            c.last_drops = sent;
        }
    }
}
