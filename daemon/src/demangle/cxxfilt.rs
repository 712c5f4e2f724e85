//! C++ names written the way c++filt (libiberty's `cplus_demangle`, also `__cxa_demangle`,
//! torch.profiler and Nsight) writes them, from cpp_demangle's parse.
//!
//! cpp_demangle and c++filt differ in two ways on kernel names:
//! - integer template arguments of types `unsigned int`, `long`, `unsigned long`, `long long`
//!   and `unsigned long long`: cpp_demangle writes `(unsigned long)4`, c++filt `4ul`;
//! - a function template whose local entity (a lambda) appears inside a name: cpp_demangle
//!   writes its return type too (`void at::native::gpu_kernel_impl<...>(...)::{lambda(int)#1}`),
//!   c++filt writes it only for the outermost function.
//!
//! - a cv-qualified closure type (`RKT_` where `T_` is a lambda): cpp_demangle writes the
//!   qualifier into the lambda's parameter list (`{lambda(c10::BFloat16 const)#1}&`), c++filt
//!   after the closure (`{lambda(c10::BFloat16)#1} const&`).
//!
//! The first two are fixed on the stream of writes cpp_demangle makes ([`DemangleWrite`]),
//! where a literal's parts and the names' nesting can be told apart; the third on the finished
//! text ([`closure_cv`]): a lambda's parameter list never ends in a qualifier of its own (the
//! mangling drops a parameter's top-level qualifiers).

use cpp_demangle::{DemangleNodeType, DemangleOptions, DemangleWrite, Symbol};

/// The demangled form of an Itanium C++ symbol as c++filt writes it; None when cpp_demangle
/// cannot parse or write it.
pub fn demangle(mangled: &str) -> Option<String> {
    let sym = Symbol::new(mangled).ok()?;
    // Without any return type, then the outermost one (if the name has one) put back in front.
    let mut body = Writes::default();
    sym.structured_demangle(&mut body, &DemangleOptions::new().no_return_type()).ok()?;
    let body = body.finish();
    // A name that starts with a local name (`_ZZ`: an entity inside a function) has no return
    // type of its own in front.
    if mangled.starts_with("_ZZ") {
        return Some(closure_cv(body));
    }
    let mut full = Writes::default();
    sym.structured_demangle(&mut full, &DemangleOptions::new()).ok()?;
    let name_at = full.name_at;
    let full = full.finish();
    Some(closure_cv(match name_at {
        Some(at) => format!("{}{body}", &full[..at]),
        None => body,
    }))
}

/// Moves a qualifier written at the end of a lambda's parameter list (`{lambda(T const)#1}`)
/// after the closure (`{lambda(T)#1} const`), as c++filt writes it.
fn closure_cv(s: String) -> String {
    const OPEN: &str = "{lambda(";
    if !s.contains(OPEN) {
        return s;
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s.as_str();
    // Qualifiers moved out of lambdas still open, innermost last: written after each one's `}`.
    let mut pending: Vec<Option<&'static str>> = Vec::new();
    while !rest.is_empty() {
        if rest.starts_with(OPEN) {
            out.push_str(OPEN);
            rest = &rest[OPEN.len()..];
            // Find the parameter list's `)` (parentheses nest inside it).
            let mut depth = 1usize;
            let mut end = rest.len();
            for (i, c) in rest.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            end = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let params = &rest[..end];
            let after = &rest[end..];
            let cv = [" const volatile", " volatile", " const"]
                .into_iter()
                .find(|q| params.ends_with(q) && after.starts_with(")#"));
            // The list's text goes out as it is (it may hold lambdas of its own) but for the
            // qualifier, which waits for this lambda's `}`.
            let keep = cv.map_or(end, |q| end - q.len());
            out.push_str(&closure_cv(params[..keep].to_string()));
            pending.push(cv);
            rest = after;
            continue;
        }
        let c = rest.chars().next().unwrap_or_default();
        out.push(c);
        rest = &rest[c.len_utf8()..];
        if c == '}'
            && let Some(cv) = pending.pop()
            && let Some(q) = cv
        {
            out.push_str(q);
        }
    }
    out
}

/// The integer literal types that c++filt writes as a suffix, and the suffix.
const SUFFIXED: [(&str, &str); 5] =
    [("unsigned int", "u"), ("long", "l"), ("unsigned long", "ul"), ("long long", "ll"), ("unsigned long long", "ull")];

/// The text cpp_demangle writes, with typed integer literals rewritten, and where the
/// outermost name begins after its return type.
#[derive(Default)]
struct Writes {
    out: String,
    /// How deep in cpp_demangle's nodes the next write is.
    depth: usize,
    /// Writes held back while they may still be a typed literal: `(`, a type, `)`, `-`.
    held: Vec<String>,
    /// At depth 0, the end of the last write of a lone space (a return type's end) when
    /// nothing but names followed it.
    space_end: Option<usize>,
    /// A parameter list (`(` at depth 0) has begun: the outermost name is behind.
    params: bool,
    /// Where the outermost name begins when a return type is written before it.
    name_at: Option<usize>,
}

impl Writes {
    fn finish(mut self) -> String {
        self.release();
        self.out
    }

    /// Writes the held-back writes as they were.
    fn release(&mut self) {
        for s in std::mem::take(&mut self.held) {
            self.emit(&s);
        }
    }

    fn emit(&mut self, s: &str) {
        if self.depth == 0 {
            if s.starts_with('(') {
                self.params = true;
            }
            if s == " " {
                self.space_end = Some(self.out.len() + 1);
            } else if s.contains('(') || s.contains(' ') {
                self.space_end = None;
            }
        }
        self.out.push_str(s);
    }

    /// Whether `s` continues the held writes towards `(type)digits`.
    fn continues(&self, s: &str) -> bool {
        match self.held.len() {
            1 => SUFFIXED.iter().any(|(t, _)| *t == s),
            2 => s == ")",
            3 => s == "-",
            _ => false,
        }
    }
}

fn suffix(ty: &str) -> &'static str {
    SUFFIXED.iter().find(|(t, _)| *t == ty).map_or("", |(_, s)| *s)
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

impl DemangleWrite for Writes {
    fn push_demangle_node(&mut self, _: DemangleNodeType) {
        self.release();
        if self.depth == 0 && !self.params && self.name_at.is_none() {
            self.name_at = self.space_end;
        }
        self.depth += 1;
    }

    fn pop_demangle_node(&mut self) {
        self.release();
        self.depth = self.depth.saturating_sub(1);
    }

    fn write_string(&mut self, s: &str) -> std::fmt::Result {
        if self.held.len() >= 3 && is_digits(s) {
            // `(type)` [`-`] digits: the literal as c++filt writes it.
            let neg = if self.held.len() == 4 { "-" } else { "" };
            let text = format!("{neg}{s}{}", suffix(&self.held[1]));
            self.held.clear();
            self.emit(&text);
        } else if !self.held.is_empty() && self.continues(s) {
            self.held.push(s.to_string());
        } else {
            self.release();
            if s == "(" {
                self.held.push(s.to_string());
            } else {
                self.emit(s);
            }
        }
        Ok(())
    }
}
