use loona_hpack::{Decoder, Encoder};

use super::*;

type Headers = Vec<(Vec<u8>, Vec<u8>)>;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame(kind, flags, stream, payload, &mut out);
    out
}

fn request(authority: &str, path: &str) -> Headers {
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("user-agent", "grpc-python/1.85 grpc-c/58.0.0 (linux; chttp2)"),
    ]
    .iter()
    .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
    .collect()
}

fn encode(enc: &mut Encoder<'_>, headers: &Headers) -> Vec<u8> {
    enc.encode(headers.iter().map(|(n, v)| (&n[..], &v[..])))
}

/// Runs `input` through a rewriter in pieces of `step` bytes.
fn rewrite(input: &[u8], step: usize) -> Vec<u8> {
    let mut r = Rewriter::default();
    let mut out = Vec::new();
    for piece in input.chunks(step) {
        r.push(piece, &mut out);
    }
    out
}

/// Splits the server's side into frames: (kind, flags, stream, payload).
fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
        out.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
        bytes = &bytes[9 + len..];
    }
    out
}

/// Header blocks of the server's side, decoded in order with one decoder (as h2 would).
fn header_blocks(server_side: &[u8]) -> Vec<(u32, u8, Headers)> {
    assert!(server_side.starts_with(PREFACE));
    let mut dec = Decoder::new();
    let mut blocks = Vec::new();
    let mut block = Vec::new();
    let mut first_flags = 0;
    for (kind, flags, stream, payload) in frames(&server_side[PREFACE.len()..]) {
        match kind {
            HEADERS => {
                assert_eq!(flags & PADDED, 0, "padding is removed");
                first_flags = flags;
                let skip = if flags & PRIORITY != 0 { 5 } else { 0 };
                block = payload[skip..].to_vec();
            }
            CONTINUATION => block.extend_from_slice(&payload),
            _ => continue,
        }
        assert!(payload.len() <= MAX_FRAME);
        if flags & END_HEADERS != 0 {
            blocks.push((stream, first_flags, dec.decode(&block).unwrap()));
        }
    }
    blocks
}

fn value<'h>(headers: &'h Headers, name: &str) -> &'h [u8] {
    &headers.iter().find(|(n, _)| n == name.as_bytes()).unwrap().1
}

#[test]
fn a_socket_path_authority_becomes_localhost_and_the_rest_is_kept() {
    // Like gRPC C-core: a dynamic table shared by the requests, so the second request refers to
    // entries the first one added, the bad authority among them.
    let mut enc = Encoder::new();
    let first = request("tmp%2Fgpuprof%2Fapi.sock", "/gpuprof.v1.Gpuprof/GetStatus");
    let second = request("tmp%2Fgpuprof%2Fapi.sock", "/grpc.health.v1.Health/Check");
    let mut input = PREFACE.to_vec();
    input.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100])); // SETTINGS
    input.extend(frame(HEADERS, END_HEADERS, 1, &encode(&mut enc, &first)));
    input.extend(frame(0x0, END_STREAM, 1, b"\0\0\0\0\0")); // DATA
    input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, &encode(&mut enc, &second)));
    for step in [1, 7, 4096] {
        let out = rewrite(&input, step);
        let blocks = header_blocks(&out);
        assert_eq!(blocks.len(), 2);
        for ((stream, flags, got), (want_stream, want_flags, sent)) in
            blocks.iter().zip([(1, END_HEADERS, &first), (3, END_HEADERS | END_STREAM, &second)])
        {
            assert_eq!((*stream, *flags), (want_stream, want_flags));
            assert_eq!(value(got, ":authority"), b"localhost");
            let others = |h: &Headers| h.iter().filter(|(n, _)| n != b":authority").cloned().collect::<Vec<_>>();
            assert_eq!(others(got), others(sent));
        }
        let kinds: Vec<u8> = frames(&out[PREFACE.len()..]).iter().map(|f| f.0).collect();
        assert_eq!(kinds, [0x4, HEADERS, 0x0, HEADERS], "other frames pass through in order");
        let data = frames(&out[PREFACE.len()..]).remove(2);
        assert_eq!(data, (0x0, END_STREAM, 1, b"\0\0\0\0\0".to_vec()));
    }
}

#[test]
fn a_valid_authority_is_kept() {
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, END_HEADERS, 1, &encode(&mut Encoder::new(), &request("localhost:7461", "/a/b"))));
    let blocks = header_blocks(&rewrite(&input, 5));
    assert_eq!(value(&blocks[0].2, ":authority"), b"localhost:7461");
}

#[test]
fn padding_priority_and_continuation_frames_are_handled() {
    let mut headers = request("x%2Fy.sock", "/a/b");
    headers.push((b"big".to_vec(), vec![b'v'; 40_000])); // re-encoded into three frames
    let block = encode(&mut Encoder::new(), &headers);
    let (a, b) = block.split_at(100);
    let mut payload = vec![3]; // pad length
    payload.extend([0x80, 0, 0, 0, 15]); // priority: exclusive, weight 15
    payload.extend(a);
    payload.extend([0, 0, 0]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, PADDED | PRIORITY, 5, &payload));
    input.extend(frame(CONTINUATION, END_HEADERS, 5, b));
    let out = rewrite(&input, 1000);
    let fs = frames(&out[PREFACE.len()..]);
    assert_eq!(fs.len(), 3);
    assert_eq!((fs[0].0, fs[0].1), (HEADERS, PRIORITY));
    assert_eq!(fs[0].3[..5], [0x80, 0, 0, 0, 15]);
    assert_eq!((fs[1].0, fs[1].1, fs[2].0, fs[2].1), (CONTINUATION, 0, CONTINUATION, END_HEADERS));
    let blocks = header_blocks(&out);
    assert_eq!(value(&blocks[0].2, ":authority"), b"localhost");
    assert_eq!(value(&blocks[0].2, "big").len(), 40_000);
}

#[test]
fn what_is_not_http2_passes_through_unchanged() {
    let http1 = b"GET / HTTP/1.1\r\nHost: /tmp/x.sock\r\n\r\n".to_vec();
    assert_eq!(rewrite(&http1, 3), http1);
    // A HEADERS frame interrupted by another frame is a protocol error: passed on for the
    // server to refuse, with everything after it.
    let mut input = PREFACE.to_vec();
    let bad = [frame(HEADERS, 0, 1, &[0x82]), frame(0x0, 0, 1, b"xyz"), frame(HEADERS, END_HEADERS, 3, &[0x82])];
    for f in &bad {
        input.extend(f);
    }
    assert_eq!(rewrite(&input, 2), input);
    // An undecodable block: the same.
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff]));
    input.extend(frame(0x0, 0, 1, b"rest"));
    assert_eq!(rewrite(&input, 4), input);
}

#[test]
fn a_cut_off_connection_hands_over_what_it_held() {
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, 0, 1, &[0x82]));
    input.extend(&frame(0x0, 0, 1, b"abc")[..5]);
    let mut r = Rewriter::default();
    let mut out = Vec::new();
    r.push(&input, &mut out);
    assert_eq!(out, PREFACE, "the unfinished header block and the partial frame wait");
    r.finish(&mut out);
    assert_eq!(out, input);
}
