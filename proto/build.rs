//! Generates Rust code from the `.proto` files with a vendored `protoc`, so a fresh
//! machine needs nothing but cargo.

#[allow(unsafe_code)] // set_var: see below
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // Safety: build scripts are single-threaded, nothing reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=agent/v1/agent.proto");
    println!("cargo:rerun-if-changed=gpuprof/v1/gpuprof.proto");
    println!("cargo:rerun-if-changed=perfetto/trace.proto");
    println!("cargo:rerun-if-changed=pprof/profile.proto");
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .compile_protos(&["agent/v1/agent.proto"], &["."])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .compile_protos(&["perfetto/trace.proto"], &["."])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .compile_protos(&["pprof/profile.proto"], &["."])?;
    // The encoded descriptors of gpuprof.v1 are what the daemon's server reflection serves.
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("gpuprof_v1_descriptor.bin"))
        .build_server(true)
        .build_client(true)
        .compile_protos(&["gpuprof/v1/gpuprof.proto"], &["."])?;
    Ok(())
}
