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
fn kernel_dims_read_in_both_stored_forms() {
    use rusqlite::types::ValueRef;

    use super::records::dims;
    // Packed: (gy-1) | (gz-1) << 16 | (by-1) << 32 | (bz-1) << 48.
    assert_eq!(dims(ValueRef::Integer(0)), [1, 1, 1, 1]);
    assert_eq!(dims(ValueRef::Integer(1 | (2 << 16) | (3 << 32) | (4 << 48))), [2, 3, 4, 5]);
    assert_eq!(dims(ValueRef::Integer(65535 | (32767 << 48))), [65536, 1, 1, 32768]);
    // The text the writer stores when a value does not fit.
    assert_eq!(dims(ValueRef::Text(b"70000,1,2,40000")), [70000, 1, 2, 40000]);
}
