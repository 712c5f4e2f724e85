use super::flows::key;
use super::json::us;

#[test]
fn microseconds_from_integers() {
    let mut b = Vec::new();
    us(&mut b, 1_234_567);
    b.push(b' ');
    us(&mut b, 5);
    b.push(b' ');
    us(&mut b, -1500);
    assert_eq!(String::from_utf8(b).unwrap(), "1234.567 0.005 -1.500");
}

#[test]
fn flow_keys() {
    assert_ne!(key(1, 5), key(2, 5));
    assert_eq!(key(3, 0xffff_ffff) >> 32, 3);
}

#[test]
fn the_export_readers_read_every_table_once() {
    use super::records::{EVENT_TABLES, READERS};
    let mut seen: Vec<usize> = READERS.iter().flat_map(|r| r.iter().copied()).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..EVENT_TABLES.len()).collect::<Vec<_>>());
    // The two big kinds have a thread each.
    assert_eq!(EVENT_TABLES[READERS[0][0]], "kernel");
    assert_eq!(EVENT_TABLES[READERS[1][0]], "api");
}
