//! `gpuprof-sampler`: gpuprof's per-GPU PM sampler. `gpuprofd` starts one per managed GPU
//! (`gpuprof-sampler --device N --socket AGENT_SOCKET`) and restarts it when it exits; CUPTI
//! faults end only this process. `--check` and `--print` use it by hand (see `--help`).

use std::process::ExitCode;

use clap::Parser;

mod child;

fn main() -> ExitCode {
    child::main(child::SamplerArgs::parse())
}
