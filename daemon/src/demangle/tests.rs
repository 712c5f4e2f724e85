use super::{demangle, fill_missing};

#[test]
fn names_stored_before_the_column_are_filled_in() {
    let c = rusqlite::Connection::open_in_memory().unwrap();
    c.execute_batch(
        "CREATE TABLE strings (id INTEGER PRIMARY KEY, value TEXT NOT NULL UNIQUE, demangled TEXT);
         INSERT INTO strings(value) VALUES ('_Z11tiny_kernelPf'), ('nvtx range'), ('_Zbroken');
         INSERT INTO strings(value, demangled) VALUES ('_Z3fooi', 'foo(int)');",
    )
    .unwrap();
    assert_eq!(fill_missing(&c).unwrap(), 1);
    let rows: Vec<(String, Option<String>)> = c
        .prepare("SELECT value, demangled FROM strings ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let want = [
        ("_Z11tiny_kernelPf", Some("tiny_kernel(float*)")),
        ("nvtx range", None),
        ("_Zbroken", None),
        ("_Z3fooi", Some("foo(int)")),
    ];
    let want: Vec<(String, Option<String>)> =
        want.iter().map(|(v, d)| (v.to_string(), d.map(str::to_string))).collect();
    assert_eq!(rows, want);
    assert_eq!(fill_missing(&c).unwrap(), 0, "nothing left to do");
}

#[test]
fn cpp_and_rust_symbols_demangle_and_the_rest_is_left_alone() {
    assert_eq!(demangle("_Z10add_kernelPfS_i").as_deref(), Some("add_kernel(float*, float*, int)"));
    assert_eq!(
        demangle(
            "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_"
        )
        .as_deref(),
        Some(
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, \
             at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)"
        )
    );
    assert_eq!(demangle("_ZN3foo3barE").as_deref(), Some("foo::bar"));
    assert_eq!(demangle("_ZN4core3fmt5write17h0123456789abcdefE").as_deref(), Some("core::fmt::write"));
    assert_eq!(demangle("_RNvCs1234_7mycrate3foo").as_deref(), Some("mycrate::foo"));
    for plain in ["ampere_sgemm_128x64_nn", "forward", "", "_Zzz not a symbol", "_R"] {
        assert_eq!(demangle(plain), None, "{plain:?}");
    }
}

/// The kernel names of tests/fixtures/kernel_names.txt: (name, whether c++filt cannot demangle it).
fn corpus() -> Vec<(&'static str, bool)> {
    include_str!("../../../tests/fixtures/kernel_names.txt")
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.strip_prefix("! ") {
            Some(name) => (name, true),
            None => (l, false),
        })
        .collect()
}

#[test]
fn kernel_names_are_written_exactly_as_cxxfilt_writes_them() {
    let names = corpus();
    let out = std::process::Command::new("c++filt")
        .args(names.iter().map(|(n, _)| n))
        .output()
        .unwrap_or_else(|e| panic!("running c++filt (install binutils: apt-get install binutils): {e}"));
    assert!(out.status.success(), "c++filt: {}", String::from_utf8_lossy(&out.stderr));
    let theirs = String::from_utf8(out.stdout).unwrap();
    let theirs: Vec<&str> = theirs.lines().collect();
    assert_eq!(theirs.len(), names.len(), "c++filt writes one line a name");
    let (mut same, mut demangled, mut differ) = (0, 0, Vec::new());
    for ((name, cxxfilt_cannot), theirs) in names.iter().zip(&theirs) {
        let ours = demangle(name);
        if *cxxfilt_cannot {
            assert_eq!(theirs, name, "marked `! `, but c++filt demangles it");
            assert!(ours.is_some(), "gpuprof demangles {name}");
            continue;
        }
        if ours.as_deref().unwrap_or(name) == *theirs {
            same += 1;
            demangled += usize::from(ours.is_some());
        } else {
            differ.push(format!("{name}\n  gpuprof:  {}\n  c++filt:  {theirs}", ours.as_deref().unwrap_or(name)));
        }
    }
    assert!(differ.is_empty(), "{} of {} names differ from c++filt:\n{}", differ.len(), names.len(), differ.join("\n"));
    assert!(same >= 100 && demangled >= 90, "the corpus holds {same} names, {demangled} of them mangled");
    eprintln!("{same} kernel names written as c++filt writes them ({demangled} of them demangled)");
}

#[test]
fn typed_literals_and_nested_return_types_follow_cxxfilt() {
    // std::array<char*, 3>: an unsigned long literal.
    assert_eq!(
        demangle(
            "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEESt5arrayIPcLm3EEEEviT0_T1_"
        )
        .as_deref(),
        Some(
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, \
             std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)"
        )
    );
    assert_eq!(
        demangle("_Z3fooILin5ELln7ELxn9ELs3ELt4ELc65ELh200ELb1ELb0ELy18446744073709551615EEvv").as_deref(),
        Some(
            "void foo<-5, -7l, -9ll, (short)3, (unsigned short)4, (char)65, (unsigned char)200, true, false, 18446744073709551615ull>()"
        )
    );
    assert_eq!(demangle("_Z1fILj1EEvDTcvmLi5EE").as_deref(), Some("void f<1u>(decltype ((unsigned long)(5)))"));
    // A lambda of a function template inside the kernel's template arguments: that function's
    // return type is not written, the kernel's is.
    let nested = demangle(
        "_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastIZZZNS0_23direct_copy_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE0_clEvENKUlvE5_clEvEUlfE_EEvS4_RKT_EUliE_EEviT1_",
    )
    .unwrap();
    assert!(
        nested.starts_with("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"),
        "{nested}"
    );
    assert_eq!(nested.matches("void").count(), 1, "{nested}");
    // An entity inside a function template (here a lambda's operator()): no return type.
    assert_eq!(
        demangle("_ZZN2at6native15gpu_kernel_implIfEEvRNS_18TensorIteratorBaseERKT_ENKUliE_clEi").as_deref(),
        Some(
            "at::native::gpu_kernel_impl<float>(at::TensorIteratorBase&, float const&)::{lambda(int)#1}::operator()(int) const"
        )
    );
}

#[test]
fn names_stored_in_the_older_form_are_rewritten_at_start() {
    let c = rusqlite::Connection::open_in_memory().unwrap();
    let mangled = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_";
    c.execute_batch(
        "CREATE TABLE strings (id INTEGER PRIMARY KEY, value TEXT NOT NULL UNIQUE, demangled TEXT);
         INSERT INTO strings(value) VALUES ('nvtx range');",
    )
    .unwrap();
    let older = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, \
                 std::array<char*, (unsigned long)1> >(int, at::native::FillFunctor<float>, std::array<char*, (unsigned long)1>)";
    c.execute("INSERT INTO strings(value, demangled) VALUES (?1, ?2)", [mangled, older]).unwrap();
    let (file, sql) = crate::store::MIGRATIONS[12];
    assert_eq!(file, "0013_cxxfilt_names.sql");
    c.execute_batch(sql).unwrap();
    assert_eq!(fill_missing(&c).unwrap(), 1);
    let stored: String =
        c.query_row("SELECT demangled FROM strings WHERE value = ?1", [mangled], |r| r.get(0)).unwrap();
    assert_eq!(stored, older.replace("(unsigned long)1", "1ul"));
    let other: Option<String> =
        c.query_row("SELECT demangled FROM strings WHERE value = 'nvtx range'", [], |r| r.get(0)).unwrap();
    assert_eq!(other, None);
}
