//! Tests of `fatbin.rs` on fatbin sections and ELF files built here.

use super::*;
use EntryKind::{Cubin, Ptx};

#[derive(Clone, Copy)]
enum Codec {
    Plain,
    Lz4,
    Zstd,
    /// A zstd frame under no compression flag: found by its magic.
    ZstdNoFlag,
}

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

/// One entry: a 64-byte header, the payload, zeros to 8 bytes.
fn entry(kind: u16, sm: u32, codec: Codec, data: &[u8]) -> Vec<u8> {
    let zstd = || ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest);
    let (payload, flag) = match codec {
        Codec::Plain => (data.to_vec(), 0),
        Codec::Lz4 => (lz4_flex::block::compress(data), 0x2000),
        Codec::Zstd => (zstd(), 0x8000),
        Codec::ZstdNoFlag => (zstd(), 0),
    };
    if !matches!(codec, Codec::Plain) {
        assert!(payload.len() < data.len(), "the test data compresses");
    }
    let padded = payload.len().next_multiple_of(8);
    let mut e = vec![0u8; 64];
    put(&mut e, 0, &kind.to_le_bytes());
    put(&mut e, 2, &0x0101u16.to_le_bytes());
    put(&mut e, 4, &64u32.to_le_bytes());
    put(&mut e, 8, &(padded as u64).to_le_bytes());
    put(&mut e, 16, &(payload.len() as u32).to_le_bytes());
    put(&mut e, 28, &sm.to_le_bytes());
    put(&mut e, 40, &(0x11u64 | flag).to_le_bytes());
    if !matches!(codec, Codec::Plain) {
        put(&mut e, 56, &(data.len() as u64).to_le_bytes());
    }
    e.extend(&payload);
    e.resize(64 + padded, 0);
    e
}

fn blob(entries: &[Vec<u8>]) -> Vec<u8> {
    let body = entries.concat();
    let mut b = FATBIN_MAGIC.to_le_bytes().to_vec();
    b.extend(1u16.to_le_bytes());
    b.extend(16u16.to_le_bytes());
    b.extend((body.len() as u64).to_le_bytes());
    b.extend(body);
    b
}

/// Stand-in cubin bytes: compressible, of an odd length.
fn cubin(tag: u8, len: usize) -> Vec<u8> {
    let mut c = b"\x7fELF\x02\x01\x01".to_vec();
    c.extend((0..len).map(|i| tag.wrapping_add((i % 13) as u8)));
    c
}

struct Sample {
    section: Vec<u8>,
    blob1: usize,
    pad: usize,
    c80: Vec<u8>,
    c90: Vec<Vec<u8>>,
    ptx90: Vec<u8>,
    /// Section offset of blob 2's LZ4 sm_90 cubin entry.
    lz4_90: usize,
}

/// Two blobs, zero padding to 16 bytes between them and 8 zeros after: PTX and cubins for sm_80,
/// sm_86 and sm_90, plain, LZ4 and zstd.
fn sample() -> Sample {
    let c80 = cubin(0x80, 301);
    let c90 = vec![cubin(0x90, 333), cubin(0x91, 517), cubin(0x92, 1001)];
    let ptx80 = b".version 8.0\n.target sm_80\n\0".to_vec();
    let mut ptx90 = b".version 8.4\n.target sm_90\n".repeat(20);
    ptx90.push(0);
    let b1 = blob(&[
        entry(1, 80, Codec::Plain, &ptx80),
        entry(2, 80, Codec::Lz4, &c80),
        entry(2, 90, Codec::Plain, &c90[0]),
    ]);
    let ptx_entry = entry(1, 90, Codec::Zstd, &ptx90);
    let b2 = blob(&[
        ptx_entry.clone(),
        entry(2, 90, Codec::Lz4, &c90[1]),
        entry(2, 86, Codec::Plain, &cubin(0x86, 50)),
        entry(2, 90, Codec::Zstd, &c90[2]),
    ]);
    let pad = 16 - b1.len() % 16;
    let mut section = b1.clone();
    section.resize(b1.len() + pad, 0);
    section.extend(&b2);
    section.extend([0; 8]);
    let lz4_90 = b1.len() + pad + 16 + ptx_entry.len();
    Sample { section, blob1: b1.len(), pad, c80, c90, ptx90, lz4_90 }
}

#[test]
fn cubins_for_sm_returns_exactly_the_cubins_of_that_sm() {
    let s = sample();
    assert_eq!(cubins_for_sm(&s.section, 90), s.c90);
    assert_eq!(cubins_for_sm(&s.section, 80), vec![s.c80.clone()]);
    assert!(cubins_for_sm(&s.section, 75).is_empty());
    let (_, stats) = cubins_for_sm_stats(&s.section, 90);
    assert_eq!(stats, ScanStats { blobs: 2, entries: 7, matched: 3, failed: 0, error: None });

    let all = entries(&s.section).unwrap();
    let summary: Vec<_> = all.iter().map(|e| (e.kind, e.sm, e.compressed)).collect();
    let want = [(Ptx, 80, false), (Cubin, 80, true), (Cubin, 90, false), (Ptx, 90, true)];
    assert_eq!(summary[..4], want);
    assert_eq!(summary[4..], [(Cubin, 90, true), (Cubin, 86, false), (Cubin, 90, true)]);
    assert_eq!(all[3].data, s.ptx90);
}

#[test]
fn zstd_is_recognised_by_its_magic_without_the_flag() {
    let c = cubin(0x33, 700);
    let section = blob(&[entry(2, 90, Codec::ZstdNoFlag, &c)]);
    let all = entries(&section).unwrap();
    assert_eq!((all[0].compressed, &all[0].data), (true, &c));
}

#[test]
fn truncated_sections_are_errors_never_panics() {
    let s = sample();
    let end = s.section.len() - 8; // the last 8 bytes are padding
    for n in 0..end {
        let cut = &s.section[..n];
        let (cubins, stats) = cubins_for_sm_stats(cut, 90);
        match entries(cut) {
            Ok(v) if n == 0 => assert!(v.is_empty()),
            Ok(v) => {
                assert!((s.blob1..=s.blob1 + s.pad).contains(&n), "a cut at {n} parsed");
                assert_eq!((v.len(), cubins.len()), (3, 1));
            }
            Err(e) => {
                assert!(matches!(e, FatbinError::Truncated { .. }), "a cut at {n}: {e}");
                assert_eq!(stats.error, Some(e));
                assert_eq!(cubins.len(), usize::from(n > s.blob1), "a cut at {n}");
            }
        }
    }
    for n in end..=s.section.len() {
        assert_eq!(entries(&s.section[..n]).unwrap().len(), 7);
    }
}

#[test]
fn corrupt_and_garbage_input_never_panics() {
    let s = sample();
    for i in 0..s.section.len() {
        for byte in [0x00, 0xFF, 0x7F] {
            let mut bad = s.section.clone();
            bad[i] = byte;
            let _ = entries(&bad);
            let (cubins, _) = cubins_for_sm_stats(&bad, 90);
            assert!(cubins.len() <= 3);
        }
    }
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for len in 0..300 {
        let mut junk: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let _ = entries(&junk);
        if len >= 16 {
            junk[..16].copy_from_slice(&s.section[..16]); // a valid blob header, garbage after
        }
        let _ = (entries(&junk), cubins_for_sm(&junk, 90));
    }
}

#[test]
fn malformed_headers_are_reported() {
    assert_eq!(entries(&[0; 40]), Ok(vec![]));
    let mut bad = vec![0u8; 32];
    bad[..4].copy_from_slice(b"\x7fELF");
    assert_eq!(entries(&bad), Err(FatbinError::BadMagic { offset: 0 }));

    let mut huge = blob(&[entry(2, 90, Codec::Plain, &cubin(1, 9))]);
    put(&mut huge, 16 + 8, &(2u64 << 30).to_le_bytes());
    assert_eq!(entries(&huge), Err(FatbinError::TooLarge { offset: 16, size: 2 << 30 }));

    let mut short_header = blob(&[entry(2, 90, Codec::Plain, &cubin(1, 9))]);
    put(&mut short_header, 16 + 4, &8u32.to_le_bytes());
    assert!(matches!(entries(&short_header), Err(FatbinError::Malformed { offset: 16, .. })));
}

#[test]
fn a_cubin_that_does_not_decompress_is_skipped_and_counted() {
    let s = sample();
    let mut bad = s.section.clone();
    put(&mut bad, s.lz4_90 + 56, &10u64.to_le_bytes()); // an output size too small for the block
    let (cubins, stats) = cubins_for_sm_stats(&bad, 90);
    assert_eq!(cubins, vec![s.c90[0].clone(), s.c90[2].clone()]);
    assert_eq!((stats.matched, stats.failed, stats.error), (2, 1, None));
    assert!(matches!(entries(&bad), Err(FatbinError::Decompress { offset, .. }) if offset == s.lz4_90 as u64));
}

#[test]
fn a_cubin_with_only_a_padded_size_is_cut_to_its_elf() {
    let real = elf(2, &[(".text", 1, b"\x01\x02\x03")]);
    let mut e = entry(2, 90, Codec::Plain, &real);
    put(&mut e, 8, &(real.len() as u64 + 16).to_le_bytes());
    put(&mut e, 16, &0u32.to_le_bytes()); // no declared size
    e.extend([0; 16]);
    assert_eq!(cubins_for_sm(&blob(&[e.clone()]), 90), vec![real.clone()]);
    put(&mut e, 64, b"junk"); // not an ELF: kept with its padding
    assert_eq!(cubins_for_sm(&blob(&[e]), 90)[0].len(), real.len() + 16);
}

/// An ELF64 little-endian file (`class` 2; 1 marks it 32-bit) holding `sections` (name, type,
/// bytes), then `.shstrtab`, then the section table.
fn elf(class: u8, sections: &[(&str, u32, &[u8])]) -> Vec<u8> {
    let mut out = vec![0u8; 64];
    put(&mut out, 0, &[0x7F, b'E', b'L', b'F', class, 1, 1]);
    put(&mut out, 16, &2u16.to_le_bytes()); // ET_EXEC
    put(&mut out, 20, &1u32.to_le_bytes());
    put(&mut out, 52, &64u16.to_le_bytes());
    let (mut names, mut headers) = (vec![0u8], vec![[0u8; 64]]);
    let all = sections.iter().copied().chain([(".shstrtab", 3, &[][..])]);
    for (name, kind, data) in all {
        let name_at = names.len() as u32;
        names.extend(name.as_bytes());
        names.push(0);
        let data = if kind == 3 { names.clone() } else { data.to_vec() };
        out.resize(out.len().next_multiple_of(8), 0);
        let mut h = [0u8; 64];
        put(&mut h, 0, &name_at.to_le_bytes());
        put(&mut h, 4, &kind.to_le_bytes());
        put(&mut h, 24, &(out.len() as u64).to_le_bytes());
        put(&mut h, 32, &(data.len() as u64).to_le_bytes());
        put(&mut h, 48, &8u64.to_le_bytes());
        headers.push(h);
        out.extend(data);
    }
    out.resize(out.len().next_multiple_of(8), 0);
    let shoff = out.len() as u64;
    put(&mut out, 0x28, &shoff.to_le_bytes());
    put(&mut out, 0x3A, &64u16.to_le_bytes());
    put(&mut out, 0x3C, &(headers.len() as u16).to_le_bytes());
    put(&mut out, 0x3E, &(headers.len() as u16 - 1).to_le_bytes());
    out.extend(headers.concat());
    out
}

#[test]
fn fatbin_section_is_found_in_an_elf_file() {
    let s = sample();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let text = (".text", 1, &b"\x90\x90\xc3"[..]);
    let exe = write("exe", &elf(2, &[text, (".nv_fatbin", 1, &s.section), (".data", 1, b"xyz")]));
    assert_eq!(fatbin_section(&exe).unwrap(), Some(s.section.clone()));
    let (cubins, stats) = file_cubins_for_sm(&exe, 90).unwrap();
    assert_eq!((cubins, stats.matched, stats.blobs), (s.c90.clone(), 3, 2));

    // .nv_fatbin wins over __nv_relfatbin; __nv_relfatbin alone is taken.
    let both = write("both", &elf(2, &[("__nv_relfatbin", 1, b"relocatable"), (".nv_fatbin", 1, &s.section)]));
    assert_eq!(fatbin_section(&both).unwrap(), Some(s.section.clone()));
    let rel = write("rel", &elf(2, &[text, ("__nv_relfatbin", 1, &s.section)]));
    assert_eq!(fatbin_section(&rel).unwrap(), Some(s.section.clone()));
    let range = fatbin_section_range(&File::open(&rel).unwrap()).unwrap().unwrap();
    assert!(range.relocatable);

    for (name, bytes) in [
        ("plain", elf(2, &[text])),
        ("nobits", elf(2, &[(".nv_fatbin", SHT_NOBITS, b"")])),
        ("elf32", elf(1, &[(".nv_fatbin", 1, &s.section)])),
        ("short", b"\x7fELF".to_vec()),
        ("notelf", vec![b'#'; 4096]),
    ] {
        assert_eq!(fatbin_section(&write(name, &bytes)).unwrap(), None, "{name}");
        assert_eq!(file_cubins_for_sm(&dir.path().join(name), 90).unwrap().0.len(), 0);
    }
    let good = elf(2, &[(".nv_fatbin", 1, &s.section)]);
    let cut = &good[..good.len() - 64]; // the section table is cut short
    assert!(fatbin_section(&write("cut", cut)).is_err());
    let mut past_end = good.clone(); // the section runs past the end of the file
    put(&mut past_end, good.len() - 2 * 64 + 32, &(good.len() as u64).to_le_bytes());
    assert!(fatbin_section(&write("past", &past_end)).is_err());
    assert!(fatbin_section(&dir.path().join("missing")).is_err());
}

#[test]
fn mapped_elf_files_lists_each_mapped_file_once() {
    let maps = "\
55d0c0a00000-55d0c0a21000 r--p 00000000 fd:01 393220                     /usr/bin/python3.12
55d0c0a21000-55d0c0b00000 r-xp 00021000 fd:01 393220                     /usr/bin/python3.12
7f1c00000000-7f1c00021000 rw-p 00000000 00:00 0 
7f1c10000000-7f1c50000000 r-xp 01000000 fd:01 400001                     /opt/torch/lib/libtorch_cuda.so
7f1c60000000-7f1c60001000 rw-s 00000000 00:01 2048                       /memfd:cuda-ipc (deleted)
7f1c60001000-7f1c60002000 rw-s 00000000 00:05 77                         /dev/nvidiactl
7f1c60002000-7f1c60003000 r--p 00000000 fd:01 500                        /tmp/old lib.so (deleted)
7f1c60003000-7f1c60004000 r-xp 00000000 fd:01 501                        /opt/my libs/libk kernels.so
7f1c60004000-7f1c60005000 r--p 00000000 00:00 0
7ffd1c000000-7ffd1c021000 rw-p 00000000 00:00 0                          [stack]
7ffd1c100000-7ffd1c102000 r-xp 00000000 00:00 0                          [vdso]
7f1c10000000-7f1c50000000 r--p 00000000 fd:01 400001                     /opt/torch/lib/libtorch_cuda.so
";
    let want = ["/usr/bin/python3.12", "/opt/torch/lib/libtorch_cuda.so", "/opt/my libs/libk kernels.so"];
    assert_eq!(mapped_elf_files(maps), want.map(PathBuf::from));
    assert!(mapped_elf_files("").is_empty());
}

/// The fixtures made by CUDA 13.0's own tools (`cupti/tests/data/make.sh`).
pub(crate) fn real_fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../cupti/tests/data").join(name)
}

#[test]
fn fatbins_made_by_cuda_s_fatbinary_give_back_the_cubin_they_hold() {
    let cubin = std::fs::read(real_fixture("gather_sm90.cubin")).unwrap();
    for name in ["gather_plain.fatbin", "gather_lz4.fatbin", "gather_zstd.fatbin", "gather_ptx.fatbin"] {
        let section = std::fs::read(real_fixture(name)).unwrap();
        let (got, stats) = cubins_for_sm_stats(&section, 90);
        assert_eq!(got, std::slice::from_ref(&cubin), "{name}: the cubin, byte for byte");
        assert_eq!((stats.matched, stats.failed, stats.error), (1, 0, None), "{name}");
        assert!(cubins_for_sm(&section, 80).is_empty(), "{name}: nothing for another SM");
    }
    let ptx = std::fs::read(real_fixture("gather_ptx.fatbin")).unwrap();
    let all = entries(&ptx).unwrap();
    assert!(all.iter().any(|e| e.kind == Ptx && e.compressed), "the PTX beside it, compressed");
    assert!(all.iter().any(|e| e.kind == Cubin && e.compressed));
    let lz4 = entries(&std::fs::read(real_fixture("gather_lz4.fatbin")).unwrap()).unwrap();
    assert!(lz4.iter().all(|e| e.compressed), "the compressed fixtures are compressed");

    // As gpuprof finds it in a process: the .nv_fatbin section of a mapped library.
    let (got, stats) = file_cubins_for_sm(&real_fixture("libgather.so"), 90).unwrap();
    assert_eq!((got, stats.blobs), (vec![cubin], 1));
}
