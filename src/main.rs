//! The `delay-bridge` binary: parses the command line, builds the async runtime and hands over to the library.

use clap::Parser;

fn main() {
    let cli = delay_bridge::Cli::parse();
    let runtime = match delay_bridge::new_runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            // EX_OSERR: the system refused the threads.
            std::process::exit(71);
        }
    };
    let code = runtime.block_on(delay_bridge::dispatch(cli));
    std::process::exit(code);
}
