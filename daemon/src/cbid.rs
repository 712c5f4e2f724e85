//! CUPTI callback ids (runtime and driver API) to API function names, for API-call summaries
//! and trace exports. The tables are generated from the CUPTI headers in `gpuprof-cupti`
//! (`cupti/bindgen/generate.sh`); this crate only reads them, it never loads CUPTI.

pub use gpuprof_cupti::cbid::{domain_name, name};
