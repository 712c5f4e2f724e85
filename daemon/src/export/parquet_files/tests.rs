use super::*;

#[test]
fn every_kind_is_a_record_table_and_has_unique_columns() {
    for k in KINDS {
        assert!(*k == "pc_sample" || crate::catalog::RECORD_TABLES.contains(k), "{k}");
        let cols = all_columns(k);
        let mut names: Vec<&str> = cols.iter().map(|c| c.0).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), cols.len(), "{k}: a column name twice");
    }
    for t in crate::catalog::RECORD_TABLES {
        assert!(KINDS.contains(t), "{t} has no Parquet file");
    }
}

#[test]
fn a_file_streams_in_chunks_the_first_naming_it_and_reads_back() {
    use arrow_array::{Array, Int64Array, StringArray};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let cols: Vec<Col> = vec![("v", "", Conv::Int), ("name", "", Conv::Name), ("flag", "", Conv::Bool)];
    let schema = schema(&cols);
    let props = properties(&cols);
    let n = 3 * ROW_GROUP + 5;
    let Ok(mut w) = file_writer(&tx, "t.parquet".into(), schema.clone(), &props, 7, 0) else { panic!() };
    let mut b: Vec<Builder> = cols.iter().map(|c| Builder::new(c.2)).collect();
    for i in 0..n {
        if let [Builder::Int(v), Builder::Str(s), Builder::Bool(f)] = b.as_mut_slice() {
            v.append_value(i as i64 * 7919);
            s.append_value(format!("kernel_{}", i % 13));
            f.append_value(i % 2 == 0);
        }
        if (i + 1) % BATCH == 0 || i + 1 == n {
            let Ok(batch) = batch_of(&schema, &mut b, &tx) else { panic!() };
            assert!(w.write(&batch).is_ok());
            w.inner_mut().out.written = 7 + i as u64 + 1;
        }
    }
    let Ok(mut sink) = w.into_inner() else { panic!() };
    assert!(sink.send().is_ok());
    drop(sink);
    drop(tx);
    let mut data = Vec::new();
    let mut names = Vec::new();
    let mut last = None;
    while let Ok(Ok(m)) = rx.try_recv() {
        names.push(m.file_name);
        data.extend_from_slice(&m.data);
        last = Some((m.events_written, m.events_total));
    }
    assert!(names.len() > 2, "{} chunks", names.len());
    assert_eq!(names[0], "t.parquet");
    assert!(names[1..].iter().all(String::is_empty));
    assert_eq!(last, Some((7 + n as u64, 7 + n as u64)));
    let r = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(data)).unwrap();
    assert_eq!(r.metadata().num_row_groups(), 4);
    let g = r.metadata().row_group(0);
    assert!(g.column(0).dictionary_page_offset().is_none(), "no dictionary for integers");
    assert!(g.column(1).dictionary_page_offset().is_some(), "a dictionary for names");
    assert_eq!(r.metadata().file_metadata().num_rows(), n as i64);
    let (mut rows, mut sum, mut marks) = (0usize, 0i64, 0usize);
    for batch in r.build().unwrap() {
        let batch = batch.unwrap();
        let v = batch.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        let s = batch.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        let f = batch.column(2).as_any().downcast_ref::<arrow_array::BooleanArray>().unwrap();
        for i in 0..batch.num_rows() {
            assert_eq!(s.value(i), format!("kernel_{}", (rows + i) % 13));
            sum += v.value(i);
            marks += usize::from(f.value(i));
        }
        assert_eq!(v.null_count(), 0);
        rows += batch.num_rows();
    }
    assert_eq!(rows, n);
    assert_eq!(sum, (0..n as i64).map(|i| i * 7919).sum::<i64>());
    assert_eq!(marks, n.div_ceil(2));
}

/// The Parquet files' columns read from the `_data` tables (`parquet_rows`) are, for every
/// kind stored there and every filter, the values the columns' SQL expressions give over the
/// kind's view with `where_for`, row for row in the same order; the kinds without a `_data`
/// table are read by SQL.
#[test]
fn columns_from_data_tables_are_the_views() {
    use crate::export::tests::{filters, varied_db};

    let (_dir, c) = varied_db();
    let mut planned = Vec::new();
    for kind in KINDS {
        let cols = all_columns(kind);
        let exprs: Vec<&str> = cols.iter().map(|(_, e, _)| *e).collect();
        let Ok(p) = plan(&c, kind, &exprs) else { panic!("{kind}: a column without a source") };
        let Some(p) = p else { continue };
        planned.push(*kind);
        for session in [3u64, 4] {
            let tracks = crate::export::scan::tracks(&c, session).unwrap();
            let mut all = None;
            for (fi, f) in filters().iter().enumerate() {
                let (w, params) = where_clause(&c, kind, session, f).unwrap();
                let want: Vec<Vec<i64>> = c
                    .prepare(&format!(
                        "SELECT {} FROM {kind} t JOIN processes p ON p.id = t.proc WHERE {w} ORDER BY t.rowid",
                        exprs.join(", ")
                    ))
                    .unwrap()
                    .query_map(params_from_iter(params.iter()), |r| (0..exprs.len()).map(|i| r.get(i)).collect())
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                let mut got = Vec::new();
                if rows(&c, &tracks, &p, session, f, |v| {
                    got.push(v.to_vec());
                    Ok(())
                })
                .is_err()
                {
                    panic!("reading {kind}");
                }
                assert_eq!(got, want, "{kind}, session {session}, filter {fi}");
                let n = *all.get_or_insert(got.len());
                assert!(n > 0 && got.len() <= n, "{kind}, filter {fi}: {} of {n} rows", got.len());
            }
        }
    }
    let want = [
        "kernel",
        "memcpy",
        "memset",
        "graph",
        "api",
        "sync",
        "marker",
        "overhead",
        "external_correlation",
        "collective",
    ];
    assert_eq!(planned, want);
}
