//! Who is calling the API, and what they may do.
//!
//! On the api Unix socket the caller is identified by `SO_PEERCRED`: root and members of the
//! admin group (`api.admin_group`, primary or supplementary) see and control everything;
//! other users see and control only sessions they created, and those cover only their own
//! processes.
//!
//! TCP carries no peer credentials. Every TCP call passes [`TcpAuth`] first: a caller that
//! presents the node's bearer token (`api.token_file`) or a client certificate signed by
//! `api.client_ca_file` is an admin of the node and acts as root (uid 0); any other call is
//! refused with UNAUTHENTICATED before it reaches a handler. The token is the node's admin
//! credential. Callers with neither peer credentials nor that proof are anonymous and own
//! nothing.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Status};

use crate::error::{ApiError, ApiResult};

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

    /// A TCP caller that proved it holds the node's admin credential (see [`TcpAuth`]).
    pub fn remote_admin() -> Caller {
        Caller::root()
    }

    /// The caller of `req`: from the api socket's peer credentials, with its admin status
    /// resolved against `admin_group`, or an admin when [`TcpAuth`] authenticated the TCP
    /// call; anonymous otherwise.
    pub fn of<T>(req: &Request<T>, admin_group: &str) -> Caller {
        let Some(cred) = req.extensions().get::<UdsConnectInfo>().and_then(|i| i.peer_cred) else {
            if req.extensions().get::<RemoteAdmin>().is_some() {
                return Caller::remote_admin();
            }
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
                "this connection carries no user identity; use the api Unix socket, where gpuprofd \
                 identifies callers by SO_PEERCRED, or on TCP the node's token or a client certificate"
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

/// Proof that a TCP call was authenticated, put into the request's extensions by [`TcpAuth`]
/// (clients cannot set extensions; only the TCP server's interceptor does).
#[derive(Debug, Clone)]
pub struct RemoteAdmin {
    pub peer: Option<SocketAddr>,
    /// "token" or "client certificate".
    pub method: &'static str,
}

/// The interceptor in front of every service on TCP: admits a call that carries the node's
/// bearer token (`authorization: Bearer TOKEN`, compared in constant time) or arrived over a
/// TLS connection with a verified client certificate, marks it [`RemoteAdmin`], and refuses
/// anything else with UNAUTHENTICATED.
#[derive(Clone)]
pub struct TcpAuth {
    /// Shared by the clones the server makes, so that SIGHUP can replace it for all.
    token: Arc<std::sync::RwLock<Option<Arc<[u8]>>>>,
    /// Client certificates are verified by TLS against `api.client_ca_file`.
    client_certs: bool,
}

impl std::fmt::Debug for TcpAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpAuth")
            .field("token", &self.token().is_some())
            .field("client_certs", &self.client_certs)
            .finish()
    }
}

impl TcpAuth {
    pub fn new(token: Option<Vec<u8>>, client_certs: bool) -> TcpAuth {
        TcpAuth { token: Arc::new(std::sync::RwLock::new(token.map(Arc::from))), client_certs }
    }

    fn token(&self) -> Option<Arc<[u8]>> {
        self.token.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The bearer token in force.
    pub fn current_token(&self) -> Option<Vec<u8>> {
        self.token().map(|t| t.to_vec())
    }

    /// Replaces the bearer token for every call from now on (a SIGHUP reload).
    pub fn set_token(&self, token: Option<Vec<u8>>) {
        *self.token.write().unwrap_or_else(std::sync::PoisonError::into_inner) = token.map(Arc::from);
    }

    /// What a caller must present, for error messages.
    fn needed(&self) -> String {
        let token = "the node's bearer token (header \"authorization: Bearer TOKEN\"; gpuprofctl --token-file FILE)";
        let cert = "a client certificate signed by the node's client CA (gpuprofctl --cert FILE --key FILE)";
        match (self.token().is_some(), self.client_certs) {
            (true, true) => format!("{token} or {cert}"),
            (true, false) => token.to_string(),
            _ => cert.to_string(),
        }
    }

    /// Checks one call: `metadata` its headers, `peer_certs` whether its TLS connection
    /// carries a client certificate (verified by rustls against the client CA).
    pub fn check(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        peer_certs: bool,
        peer: Option<SocketAddr>,
    ) -> Result<RemoteAdmin, ApiError> {
        if self.client_certs && peer_certs {
            return Ok(RemoteAdmin { peer, method: "client certificate" });
        }
        let Some(header) = metadata.get("authorization") else {
            return Err(ApiError::Unauthenticated(format!(
                "gpuprofd's TCP API needs {}; this call presented none",
                self.needed()
            )));
        };
        let Some(expected) = self.token() else {
            return Err(ApiError::Unauthenticated(format!(
                "gpuprofd's TCP API does not accept tokens here; it needs {}",
                self.needed()
            )));
        };
        let presented = header.as_bytes();
        let Some(presented) = presented
            .get(..7)
            .filter(|scheme| scheme.eq_ignore_ascii_case(b"bearer "))
            .and_then(|_| presented.get(7..))
        else {
            return Err(ApiError::Unauthenticated(
                "the authorization header must be \"Bearer TOKEN\" (gpuprofctl --token-file FILE)".into(),
            ));
        };
        if constant_time_eq(&expected, presented.trim_ascii()) {
            Ok(RemoteAdmin { peer, method: "token" })
        } else {
            Err(ApiError::Unauthenticated(format!(
                "the bearer token is not this node's token (api.token_file on the server); gpuprofd's TCP API needs {}",
                self.needed()
            )))
        }
    }
}

impl tonic::service::Interceptor for TcpAuth {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let peer = req.remote_addr();
        let certs = req.peer_certs().is_some_and(|c| !c.is_empty());
        match self.check(req.metadata(), certs, peer) {
            Ok(who) => {
                tracing::debug!(peer = ?who.peer, method = who.method, "authenticated TCP call");
                req.extensions_mut().insert(who);
                Ok(req)
            }
            Err(e) => {
                tracing::debug!(?peer, error = %e, "refused unauthenticated TCP call");
                Err(e.into())
            }
        }
    }
}

/// Compares a secret with a presented value in time that depends only on the secret's
/// length, never on where they first differ or on the presented length.
fn constant_time_eq(secret: &[u8], presented: &[u8]) -> bool {
    let mut diff = u8::from(secret.len() != presented.len());
    for (i, s) in secret.iter().enumerate() {
        diff |= s ^ presented.get(i).copied().unwrap_or(!s);
    }
    std::hint::black_box(diff) == 0
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

/// Where a session's owner is found, and who may read every session.
#[derive(Debug, Clone, Copy)]
pub struct SessionOwners<'a> {
    /// The owner of the session if it is open (the session registry's `live_owner`).
    pub live: Option<u32>,
    /// The database, for ended sessions.
    pub db_path: &'a Path,
    /// `[api] admin_group`, named when access is denied.
    pub admin_group: &'a str,
}

/// Checks that session `id` exists and that the caller may read it: the live owner of an open
/// session, or the owner stored in the sessions table.
pub async fn authorize_session(owners: SessionOwners<'_>, caller: &Caller, id: u64) -> ApiResult<()> {
    if id == 0 {
        return Err(ApiError::invalid("session_id", "session ids start at 1"));
    }
    let owner = match owners.live {
        Some(o) => o,
        None => {
            let path = owners.db_path.to_path_buf();
            tokio::task::spawn_blocking(move || -> ApiResult<Option<u32>> {
                let c = crate::store::open_reader(&path)?;
                Ok(crate::store::session_owner(&c, id)?)
            })
            .await??
            .ok_or_else(|| {
                ApiError::NotFound(format!("no session {id} (gpuprofctl session list shows the sessions)"))
            })?
        }
    };
    if caller.may_access(owner) {
        Ok(())
    } else {
        Err(caller.denied(&format!("session {id}"), owner, owners.admin_group))
    }
}

fn daemon_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// Pause and resume are for operators: root, the admin group, or the daemon's own user.
pub fn require_operator(caller: &Caller, what: &str) -> ApiResult<u32> {
    if caller.admin || (caller.authenticated && Some(caller.uid) == daemon_uid()) {
        return Ok(caller.uid);
    }
    if !caller.authenticated {
        return Err(ApiError::PermissionDenied(format!(
            "only operators may {what}; this connection carries no user identity: use the api Unix socket, \
             or on TCP the node's token or a client certificate"
        )));
    }
    Err(ApiError::PermissionDenied(format!(
        "only operators may {what}: uid {} is neither root nor in the admin group (api.admin_group)",
        caller.uid
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_session_is_read_by_its_owner_or_an_administrator() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let cfg = crate::config::Config::from_toml("").unwrap();
        let c = crate::store::open_writer(&db, &cfg.storage).unwrap();
        c.execute(
            "INSERT INTO sessions(id, name, state, targets, collect, owner_uid, created_ns, start_at_ns, duration_ms,
               max_records) VALUES (5, 'ended', 'completed', '[]', '{}', 1000, 1, 1, 0, 0)",
            [],
        )
        .unwrap();
        let owners = |id: u64| SessionOwners { live: (id == 7).then_some(1001), db_path: &db, admin_group: "gpuprof" };
        let user = |uid| Caller { uid, gid: uid, pid: None, admin: false, authenticated: true };
        // An ended session from the database; an open one from the registry.
        assert!(authorize_session(owners(5), &user(1000), 5).await.is_ok());
        assert!(authorize_session(owners(7), &user(1001), 7).await.is_ok());
        assert!(authorize_session(owners(5), &Caller::root(), 5).await.is_ok());
        let denied = authorize_session(owners(5), &user(1001), 5).await.unwrap_err();
        assert!(
            matches!(&denied, ApiError::PermissionDenied(m) if m.contains("uid 1000") && m.contains("\"gpuprof\""))
        );
        assert!(matches!(authorize_session(owners(9), &user(1000), 9).await, Err(ApiError::NotFound(_))));
        assert!(matches!(authorize_session(owners(0), &user(1000), 0).await, Err(ApiError::InvalidArgument { .. })));
    }

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

    #[test]
    fn constant_time_compare() {
        assert!(constant_time_eq(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!constant_time_eq(b"0123456789abcdef", b"0123456789abcdeX"));
        assert!(!constant_time_eq(b"0123456789abcdef", b"0123456789abcde"));
        assert!(!constant_time_eq(b"0123456789abcdef", b"0123456789abcdef0"));
        assert!(!constant_time_eq(b"0123456789abcdef", b""));
    }

    #[test]
    fn tcp_auth_token_and_certificates() {
        use tonic::metadata::{MetadataMap, MetadataValue};
        let with = |v: &'static str| {
            let mut m = MetadataMap::new();
            m.insert("authorization", MetadataValue::from_static(v));
            m
        };
        let token = TcpAuth::new(Some(b"s3cret-s3cret-s3cret".to_vec()), false);
        assert_eq!(token.check(&with("Bearer s3cret-s3cret-s3cret"), false, None).unwrap().method, "token");
        assert!(token.check(&with("bearer s3cret-s3cret-s3cret"), false, None).is_ok());
        for bad in ["Bearer s3cret-s3cret-s3creT", "Bearer ", "Basic s3cret-s3cret-s3cret", "s3cret"] {
            let e = token.check(&with(bad), false, None).unwrap_err();
            assert_eq!(tonic::Status::from(e).code(), tonic::Code::Unauthenticated, "{bad}");
        }
        let e = token.check(&MetadataMap::new(), false, None).unwrap_err();
        assert!(e.to_string().contains("--token-file"), "{e}");
        // Without client_ca_file a certificate proves nothing.
        assert!(token.check(&MetadataMap::new(), true, None).is_err());

        let certs = TcpAuth::new(None, true);
        assert_eq!(certs.check(&MetadataMap::new(), true, None).unwrap().method, "client certificate");
        let e = certs.check(&with("Bearer s3cret-s3cret-s3cret"), false, None).unwrap_err();
        assert!(e.to_string().contains("--cert"), "{e}");

        let both = TcpAuth::new(Some(b"s3cret-s3cret-s3cret".to_vec()), true);
        assert!(both.check(&MetadataMap::new(), true, None).is_ok());
        assert!(both.check(&with("Bearer s3cret-s3cret-s3cret"), false, None).is_ok());
        let e = both.check(&MetadataMap::new(), false, None).unwrap_err();
        assert!(e.to_string().contains("--token-file") && e.to_string().contains("--cert"), "{e}");
    }

    #[test]
    fn remote_admin_only_with_proof() {
        let mut req = Request::new(());
        assert_eq!(Caller::of(&req, "gpuprof"), Caller::anonymous());
        req.extensions_mut().insert(RemoteAdmin { peer: None, method: "token" });
        let c = Caller::of(&req, "gpuprof");
        assert!(c.admin && c.authenticated && c.uid == 0, "{c:?}");
    }
}
