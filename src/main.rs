//! The `delay-bridge` binary: parses the command line and hands over to the library.

use clap::Parser;

#[tokio::main]
async fn main() {
    let cli = delay_bridge::Cli::parse();
    let code = delay_bridge::dispatch(cli).await;
    std::process::exit(code);
}
