use super::*;

#[test]
fn kinds_are_the_wire_kinds_in_order() {
    for (i, k) in Kind::ALL.into_iter().enumerate() {
        assert_eq!(k.index(), i);
        assert_eq!(k.wire() as i32, i as i32 + 1);
        assert_eq!(Kind::from_wire(k.wire() as i32), Some(k));
        assert_eq!(Kind::of_table(k.name()), Some(k));
    }
    assert_eq!(Kind::from_wire(0), None);
    assert_eq!(Kind::from_wire(Kind::COUNT as i32 + 1), None);
    assert_eq!(Kind::from_wire(-1), None);
}

#[test]
fn the_lists_are_what_they_were() {
    assert_eq!(
        RECORD_TABLES,
        [
            "kernel",
            "memcpy",
            "memset",
            "api",
            "sync",
            "overhead",
            "marker",
            "external_correlation",
            "context",
            "stream",
            "graph",
            "collective"
        ]
    );
    assert_eq!(QUERY_KINDS, ["kernel", "memcpy", "memset", "api", "sync", "marker", "collective"]);
    assert_eq!(
        EVENT_TABLES,
        ["kernel", "memcpy", "memset", "graph", "api", "marker", "sync", "overhead", "collective"]
    );
    assert_eq!(
        PARQUET_KINDS,
        [
            "kernel",
            "memcpy",
            "memset",
            "graph",
            "api",
            "sync",
            "marker",
            "overhead",
            "external_correlation",
            "context",
            "stream",
            "pc_sample",
            "collective"
        ]
    );
    for t in RECORD_TABLES {
        let untimed = ["external_correlation", "context", "stream"].contains(t);
        assert_eq!(timed(t), !untimed, "{t}");
        let stored = data_table(t);
        assert_eq!(stored.is_none(), ["context", "stream"].contains(t), "{t}");
        if let Some(d) = stored {
            assert_eq!(d, format!("{t}_data"));
        }
    }
    assert_eq!(data_table("device"), None);
    assert!(paired("kernel") && paired("api") && !paired("memcpy"));
}

#[test]
fn every_record_table_is_written_and_every_list_has_its_places_once() {
    for s in &SPECS {
        assert_eq!(s.record, s.cols > 0, "{:?}: record tables are the kinds the writer fills", s.kind);
        if !s.pair.is_empty() {
            assert_eq!(s.cols, 1 + 2 * s.pair.len());
        }
    }
    for list in [RECORD_TABLES, QUERY_KINDS, EVENT_TABLES, PARQUET_KINDS] {
        assert!(!list.contains(&""), "two kinds in one place: {list:?}");
        for t in list {
            assert!(Kind::of_table(t).is_some(), "{t}");
        }
    }
}

#[test]
fn batch_counts_cover_every_field() {
    let b = RecordBatch {
        kernels: vec![Default::default(); 1],
        memcpys: vec![Default::default(); 2],
        memsets: vec![Default::default(); 3],
        api_calls: vec![Default::default(); 4],
        syncs: vec![Default::default(); 5],
        overheads: vec![Default::default(); 6],
        markers: vec![Default::default(); 7],
        external_correlations: vec![Default::default(); 8],
        devices: vec![Default::default(); 9],
        contexts: vec![Default::default(); 10],
        streams: vec![Default::default(); 11],
        graphs: vec![Default::default(); 12],
        collectives: vec![Default::default(); 13],
        ..Default::default()
    };
    let got: Vec<(Kind, u64)> = batch_counts(&b).collect();
    assert_eq!(got.len(), 13);
    assert_eq!(got[2], (Kind::Memset, 3));
    assert_eq!(got[11], (Kind::Graph, 12));
    assert_eq!(got[12], (Kind::Collective, 13));
    assert_eq!(batch_len(&b), 91);
}
