//! The load generator and measurement harness behind `delay-bridge bench`.

use clap::Args;

/// `delay-bridge bench` options.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs the benchmark; returns the process exit code.
pub async fn run(_args: BenchArgs) -> anyhow::Result<i32> {
    anyhow::bail!("the benchmark harness is being written")
}
