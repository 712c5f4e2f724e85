//! Generates Rust code from the `.proto` files with a vendored `protoc`, so a fresh
//! machine needs nothing but cargo.

#[allow(unsafe_code)] // set_var: see below
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // Safety: build scripts are single-threaded, nothing reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=agent/v1/agent.proto");
    println!("cargo:rerun-if-changed=gpuprof/v1/gpuprof.proto");
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .compile_protos(&["agent/v1/agent.proto"], &["."])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["gpuprof/v1/gpuprof.proto"], &["."])?;
    Ok(())
}
