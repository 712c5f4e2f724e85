use super::*;

#[test]
fn defaults_parse() {
    let c = Config::from_toml("").unwrap();
    assert_eq!(c.agent.max_frame_bytes, 4 << 20);
    assert_eq!(c.agent_socket, PathBuf::from("/run/gpuprof/agent.sock"));
}

#[test]
fn file_overrides_single_keys() {
    let c = Config::from_toml("[ingest]\ncommit_max_records = 10\n").unwrap();
    assert_eq!(c.ingest.commit_max_records, 10);
    assert_eq!(c.ingest.queue_messages, 512);
}

#[test]
fn unknown_key_is_named() {
    let e = Config::from_toml("[ingest]\ncommit_max_recs = 10\n").unwrap_err();
    assert!(format!("{e:#}").contains("commit_max_recs"), "{e:#}");
    let e = Config::from_toml("bogus = 1\n").unwrap_err();
    assert!(format!("{e:#}").contains("bogus"), "{e:#}");
}

#[test]
fn bad_value_is_named() {
    let e = Config::from_toml("[agent]\nmax_frame_bytes = 3\n").unwrap_err();
    assert!(format!("{e:#}").contains("agent.max_frame_bytes"), "{e:#}");
    let e = Config::from_toml("[agent]\nmax_frame_bytes = \"big\"\n").unwrap_err();
    assert!(format!("{e:#}").contains("max_frame_bytes"), "{e:#}");
    let e = Config::from_toml("[ingest]\nqueue_records = 100\n").unwrap_err();
    assert!(format!("{e:#}").contains("ingest.queue_records must be between 8192"), "{e:#}");
}

#[test]
fn retention_limits_parse_and_are_checked() {
    let c = Config::from_toml("").unwrap();
    assert_eq!(c.retention.sessions_max_age.0, std::time::Duration::from_secs(14 * 24 * 3600));
    assert_eq!(c.retention.database_max_size, Size(20 << 30));
    let c = Config::from_toml("[retention]\nsessions_max_age = \"0\"\ndatabase_max_size = 0\n").unwrap();
    assert!(c.retention.sessions_max_age.0.is_zero());
    assert_eq!(c.retention.database_max_size, Size(0));
    assert_eq!(Size::parse("512MiB"), Ok(Size(512 << 20)));
    assert_eq!(Size::parse("1.5 GiB"), Ok(Size(3 << 29)));
    assert_eq!(Size::parse("2GB"), Ok(Size(2_000_000_000)));
    // Under a hard cap, retention keeps the database below 90% of it.
    let c = Config::from_toml("[storage]\nmax_database_mib = 1000\n").unwrap();
    assert_eq!(c.retention.max_bytes(&c.storage), 900 << 20);
    let c = Config::from_toml("[storage]\nmax_database_mib = 1000\n[retention]\ndatabase_max_size = 0\n").unwrap();
    assert_eq!(c.retention.max_bytes(&c.storage), 900 << 20);
    let c = Config::from_toml("[retention]\ndatabase_max_size = \"5MiB\"\n").unwrap();
    assert_eq!(c.retention.max_bytes(&c.storage), 5 << 20);
    for (toml, key) in [
        ("[retention]\ndatabase_max_size = \"20 parsecs\"\n", "database_max_size"),
        ("[retention]\ndatabase_max_size = 20\n", "database_max_size"),
        ("[retention]\ndatabase_max_size = \"100KiB\"\n", "retention.database_max_size"),
        ("[retention]\nsessions_max_age = \"7 fortnights\"\n", "sessions_max_age"),
        ("[retention]\nsessions_max_age = \"10ms\"\n", "retention.sessions_max_age"),
    ] {
        let e = Config::from_toml(toml).unwrap_err();
        assert!(format!("{e:#}").contains(key), "{toml}: {e:#}");
    }
}

#[test]
fn state_dir_moves_everything() {
    let ov = Overrides { state_dir: Some("/tmp/x".into()), ..Default::default() };
    let c = Config::load(None, &ov).unwrap();
    assert_eq!(c.database_path(), PathBuf::from("/tmp/x/gpuprof.db"));
    assert_eq!(c.agent_socket, PathBuf::from("/tmp/x/agent.sock"));
    assert_eq!(c.api_socket, PathBuf::from("/tmp/x/api.sock"));
}

#[test]
fn late_attach_hook_targets_are_checked() {
    let c = Config::from_toml(
        "[agent]\nlate_attach_hook_for = [\"exe_name:python3\", \"exe_pattern:*train*.py\", \"cgroup:kubepods\"]\n",
    )
    .unwrap();
    assert_eq!(
        c.agent.hook_targets().unwrap(),
        vec![("exe_name", "python3"), ("exe_pattern", "*train*.py"), ("cgroup", "kubepods")]
    );
    assert!(Config::from_toml("").unwrap().agent.hook_targets().unwrap().is_empty());
    for (bad, says) in [
        ("python3", "write KIND:VALUE"),
        ("exe:python3", "\"exe\" is not one of"),
        ("exe_name:/usr/bin/python3", "not an executable base name"),
        ("exe_pattern:[abc", "late_attach_hook_for[0]"),
        ("cgroup:", "not empty"),
        ("cgroup: kubepods", "without leading or trailing spaces"),
    ] {
        let e = Config::from_toml(&format!("[agent]\nlate_attach_hook_for = [{bad:?}]\n")).unwrap_err();
        assert!(format!("{e:#}").contains(says), "{bad}: {e:#}");
    }
}

#[test]
fn pc_sampling_settings_parse_and_are_checked() {
    let c = Config::from_toml("").unwrap();
    assert_eq!((c.pc.mode.as_str(), c.pc.cost_budget_pct), ("windows", 0.5));
    assert_eq!(c.pc.turn.0, std::time::Duration::from_secs(1));
    let c = Config::from_toml("[pc]\nmode = \"continuous\"\ncost_budget_pct = 2\n").unwrap();
    assert_eq!((c.pc.mode.as_str(), c.pc.cost_budget_pct), ("continuous", 2.0));
    for (toml, says) in [
        ("[pc]\nmode = \"always\"\n", "pc.mode must be"),
        ("[pc]\ncost_budget_pct = 0\n", "pc.cost_budget_pct"),
        ("[pc]\ncost_budget_pct = 25\n", "pc.cost_budget_pct"),
        ("[pc]\nturn = \"10ms\"\n", "pc.turn"),
        ("[pc]\nturn = \"5s\"\nmax_wait = \"2s\"\n", "pc.max_wait"),
        ("[pc]\nactive_for = \"100ms\"\n", "pc.active_for"),
        ("[pc]\nwindow = \"0s\"\n", "pc.window"),
    ] {
        let e = Config::from_toml(toml).unwrap_err();
        assert!(format!("{e:#}").contains(says), "{toml}: {e:#}");
    }
}
