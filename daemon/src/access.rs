//! Who is calling the API, from the api socket's `SO_PEERCRED`, and what they may do.
//!
//! Root and members of the admin group (`api.admin_group`, primary or supplementary)
//! see and control everything. Other users see and control only sessions they created,
//! and those cover only their own processes. Callers without peer credentials (TCP) are
//! anonymous and own nothing.

use std::path::Path;

use tonic::Request;
use tonic::transport::server::UdsConnectInfo;

use crate::error::ApiError;

/// The identity of an API caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<u32>,
    /// Root or a member of the admin group.
    pub admin: bool,
    /// False for connections without peer credentials (TCP).
    pub authenticated: bool,
}

impl Caller {
    /// An identity with full rights (internal use and tests).
    pub fn root() -> Caller {
        Caller { uid: 0, gid: 0, pid: None, admin: true, authenticated: true }
    }

    /// A caller without credentials.
    pub fn anonymous() -> Caller {
        Caller { uid: u32::MAX, gid: u32::MAX, pid: None, admin: false, authenticated: false }
    }

    /// The caller of `req`, with its admin status resolved against `admin_group`.
    pub fn of<T>(req: &Request<T>, admin_group: &str) -> Caller {
        let Some(cred) = req.extensions().get::<UdsConnectInfo>().and_then(|i| i.peer_cred) else {
            return Caller::anonymous();
        };
        let pid = cred.pid().and_then(|p| u32::try_from(p).ok());
        let uid = cred.uid();
        let gid = cred.gid();
        let admin = uid == 0 || in_group(uid, gid, pid, admin_group, Path::new("/etc"), Path::new("/proc"));
        Caller { uid, gid, pid, admin, authenticated: true }
    }

    /// Whether the caller may see and control something owned by `owner_uid`.
    pub fn may_access(&self, owner_uid: u32) -> bool {
        self.admin || (self.authenticated && self.uid == owner_uid)
    }

    /// Fails unless the caller is allowed to start a session at all.
    pub fn require_authenticated(&self) -> Result<(), ApiError> {
        if self.authenticated {
            Ok(())
        } else {
            Err(ApiError::PermissionDenied(
                "this connection carries no user identity (TCP); use the api Unix socket, where gpuprofd \
                 identifies callers by SO_PEERCRED"
                    .into(),
            ))
        }
    }

    /// The denial for something owned by `owner_uid`, saying what would be needed.
    pub fn denied(&self, what: &str, owner_uid: u32, admin_group: &str) -> ApiError {
        ApiError::PermissionDenied(format!(
            "{what} belongs to uid {owner_uid}; uid {} may only use its own sessions and processes \
             (root and members of group {admin_group:?} may use all)",
            self.uid
        ))
    }
}

/// Whether the user is in group `group`: as primary gid, as a supplementary group of the
/// calling process (`/proc/PID/status`), or as a listed member in `/etc/group`.
fn in_group(uid: u32, gid: u32, pid: Option<u32>, group: &str, etc: &Path, proc_dir: &Path) -> bool {
    if group.is_empty() {
        return false;
    }
    let Ok(groups) = std::fs::read_to_string(etc.join("group")) else {
        return false;
    };
    let Some((group_gid, members)) = groups.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() >= 4 && f[0] == group { f[2].parse::<u32>().ok().map(|g| (g, f[3].to_string())) } else { None }
    }) else {
        return false;
    };
    if gid == group_gid {
        return true;
    }
    if let Some(pid) = pid
        && let Ok(status) = std::fs::read_to_string(proc_dir.join(pid.to_string()).join("status"))
        && let Some(line) = status.lines().find(|l| l.starts_with("Groups:"))
        && line.split_whitespace().skip(1).any(|g| g.parse::<u32>() == Ok(group_gid))
    {
        return true;
    }
    let Some(name) = user_name(uid, etc) else {
        return false;
    };
    members.split(',').any(|m| m.trim() == name)
}

/// The login name of `uid` from `/etc/passwd`.
fn user_name(uid: u32, etc: &Path) -> Option<String> {
    let passwd = std::fs::read_to_string(etc.join("passwd")).ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 3 && f[2].parse::<u32>() == Ok(uid)).then(|| f[0].to_string())
    })
}

/// The owner uid of a running process, from `/proc/PID` (None if it does not exist).
pub fn process_uid(pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_etc() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("group"), "root:x:0:\ngpuprof:x:990:alice,bob\nstaff:x:50:\n").unwrap();
        std::fs::write(
            d.path().join("passwd"),
            "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\ncarol:x:1002:990::/:/bin/sh\n\
             dave:x:1003:1003::/:/bin/sh\n",
        )
        .unwrap();
        let p = d.path().join("proc/4242");
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("status"), "Name:\tx\nGroups:\t27 990 1003\n").unwrap();
        d
    }

    #[test]
    fn group_membership() {
        let d = fake_etc();
        let etc = d.path();
        let proc_dir = d.path().join("proc");
        // Listed member.
        assert!(in_group(1000, 1000, None, "gpuprof", etc, &proc_dir));
        // Primary group.
        assert!(in_group(1002, 990, None, "gpuprof", etc, &proc_dir));
        // Supplementary group of the calling process.
        assert!(in_group(1003, 1003, Some(4242), "gpuprof", etc, &proc_dir));
        // Not a member.
        assert!(!in_group(1003, 1003, None, "gpuprof", etc, &proc_dir));
        assert!(!in_group(1000, 1000, None, "nosuchgroup", etc, &proc_dir));
        assert!(!in_group(1000, 1000, None, "", etc, &proc_dir));
    }

    #[test]
    fn access_rules() {
        let user = Caller { uid: 1000, gid: 1000, pid: None, admin: false, authenticated: true };
        assert!(user.may_access(1000));
        assert!(!user.may_access(1001));
        assert!(Caller::root().may_access(1001));
        assert!(!Caller::anonymous().may_access(u32::MAX));
        assert!(Caller::anonymous().require_authenticated().is_err());
        let e = user.denied("session 3", 1001, "gpuprof");
        assert!(e.to_string().contains("uid 1001") && e.to_string().contains("gpuprof"), "{e}");
    }
}
